"""Each chip's RoCE network, which distributed training needs: ``hccn_tool -i <phys id> -link -g`` (``link
status: UP|DOWN``) and ``-net_health -g`` (``net health status: Success|Init|Fault|...``), every health query,
for the chips that have a device IP and answer npu-smi.

A link that reads DOWN for ``linkDownDebounce`` seconds (20 by default: the FaultDuration Huawei gives code
0x81078603, link down) makes the chip network-unhealthy (:meth:`NetworkProbe.fault` names why); the first UP
read clears it. The net health status is reported (log, metric), never a cause: a node without a detect
address prints something other than Success for every chip. A read that fails, times out or prints garbage
changes nothing (the link's last state, and since when, stay) and is one log line per change; the tool
missing is one line for the node. All calls of a query run at once, at most :data:`CONCURRENT_CALLS` at a
time, the whole round bounded by the health interval (and ``npuSmiTimeout``)::

    probe = NetworkProbe(settings)
    await probe.refresh([NetworkTarget(3, "Ascend910-3")], interval=5.0)
    probe.fault(3)      # '' or 'RoCE link DOWN for 20 s or more (hccn_tool -link -g)'
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import anyio

from ascend_agent.backends.hccn import (
    NET_HEALTH_READY,
    HccnParseError,
    parse_link,
    parse_net_health,
    run_hccn_tool,
)
from ascend_agent.backends.npusmi import NpuSmiError
from ascend_agent.config import Settings
from ascend_agent.observability import (
    CHIP_LINK_UP,
    CHIP_NET_HEALTH,
    CHIP_NETWORK_UNHEALTHY,
    ProblemLog,
    log_fields,
)

log = logging.getLogger(__name__)

# hccn_tool runs at once per query: two per chip, so 8 reads 4 chips at a time.
CONCURRENT_CALLS = 8
_LINK, _NET_HEALTH = ("-link", "-g"), ("-net_health", "-g")
_WHAT = {_LINK: "link state", _NET_HEALTH: "net health"}


@dataclass(frozen=True, slots=True)
class NetworkTarget:
    """A chip whose network is read: its physical id (``hccn_tool -i``) and device ID (the metrics' label)."""

    phys_id: int
    device: str


class Change(enum.Enum):
    """What one link read changed."""

    NONE = enum.auto()
    WENT_DOWN = enum.auto()  # an outage began, shorter than the debounce so far
    BACK_UP = enum.auto()  # it ended within the debounce
    UNHEALTHY = enum.auto()  # it has lasted the debounce: network-unhealthy
    RECOVERED = enum.auto()  # up again after that


@dataclass(slots=True)
class LinkOutage:
    """A link's reads over time: network-unhealthy once it has read DOWN for ``debounce`` s in a row, until
    it reads UP.

    >>> outage = LinkOutage(20.0)
    >>> [outage.read(up, now).name for up, now in ((False, 0.0), (False, 10.0), (False, 20.0), (True, 25.0))]
    ['WENT_DOWN', 'NONE', 'UNHEALTHY', 'RECOVERED']
    """

    debounce: float
    down_since: float | None = None  # the time of the first DOWN read of the current outage
    unhealthy: bool = False

    def read(self, up: bool, now: float) -> Change:
        """Take the read at ``now`` (the clock's seconds); what it changed."""
        if up:
            if self.unhealthy:
                change = Change.RECOVERED
            else:
                change = Change.NONE if self.down_since is None else Change.BACK_UP
            self.down_since, self.unhealthy = None, False
            return change
        began = self.down_since is None
        if self.down_since is None:
            self.down_since = now
        if not self.unhealthy and now - self.down_since >= self.debounce:
            self.unhealthy = True
            return Change.UNHEALTHY
        return Change.WENT_DOWN if began else Change.NONE


@dataclass(slots=True)
class _Chip:
    """What is known of one chip's network."""

    device: str
    outage: LinkOutage
    link_up: bool | None = None
    net_health: str | None = None


@dataclass(frozen=True, slots=True)
class _Unread:
    reason: str  # empty: said once for the node (the tool is missing)


class NetworkProbe:
    """Each chip's link state, net health and whether it is network-unhealthy, read as the module says."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._chips: dict[int, _Chip] = {}
        self._problems: dict[tuple[int, str], ProblemLog] = {}
        self._missing = ProblemLog()

    def take_over(self, previous: NetworkProbe) -> None:
        """Go on from what ``previous`` (a reload's old backend) saw: each chip's outage so far, with this
        probe's debounce."""
        self._chips = {
            phys_id: replace(chip, outage=replace(chip.outage, debounce=self._settings.link_down_debounce))
            for phys_id, chip in previous._chips.items()
        }

    def fault(self, phys_id: int) -> str:
        """Why the chip is network-unhealthy; empty while it is not (or its network is not read)."""
        chip = self._chips.get(phys_id)
        if chip is None or not chip.outage.unhealthy:
            return ""
        return f"RoCE link DOWN for {self._settings.link_down_debounce:g} s or more (hccn_tool -link -g)"

    def view(self) -> tuple[tuple[int, bool | None, str | None, bool], ...]:
        """Each chip's link state, net health and verdict: the agent reconciles when this changes."""
        return tuple((p, c.link_up, c.net_health, c.outage.unhealthy) for p, c in sorted(self._chips.items()))

    async def refresh(self, targets: Sequence[NetworkTarget], interval: float) -> None:
        """Read every target's link and net health once; forget the chips that are no target any more.
        Never raises for what the tool does."""
        self._forget({t.phys_id for t in targets})
        for target in targets:
            self._chips.setdefault(
                target.phys_id, _Chip(target.device, LinkOutage(self._settings.link_down_debounce))
            )
        if not targets:
            return
        deadline = min(self._settings.npu_smi_timeout, interval)
        found: dict[tuple[int, tuple[str, ...]], bool | str | _Unread] = {}
        limiter = anyio.CapacityLimiter(CONCURRENT_CALLS)

        async def read(phys_id: int, args: tuple[str, ...]) -> None:
            async with limiter:
                found[phys_id, args] = await self._read(phys_id, args, deadline)

        with anyio.move_on_after(deadline):
            async with anyio.create_task_group() as tasks:
                for target in targets:
                    for args in (_LINK, _NET_HEALTH):
                        tasks.start_soon(read, target.phys_id, args)
        late = _Unread(_late(deadline))
        now = self._clock()
        for args in (_LINK, _NET_HEALTH):
            answers = {t.phys_id: found.get((t.phys_id, args), late) for t in targets}
            self._report(_WHAT[args], answers)
            read_ok = {p: value for p, value in answers.items() if not isinstance(value, _Unread)}
            if args == _LINK:
                self._take_links({p: bool(v) for p, v in read_ok.items()}, now)
            else:
                self._take_net_health({p: str(v) for p, v in read_ok.items()})

    async def _read(self, phys_id: int, args: tuple[str, ...], timeout: float) -> bool | str | _Unread:
        executable = self._settings.effective_hccn_tool
        command = f"hccn_tool -i {phys_id} {' '.join(args)}"
        try:
            text = await run_hccn_tool(executable, phys_id, args, timeout)
            if text is None:
                return _Unread(f"{command} says nothing is configured")
            value: bool | str = (
                parse_link(text, phys_id) if args == _LINK else parse_net_health(text, phys_id)
            )
        except NpuSmiError as exc:
            if exc.reason == "missing":
                if self._missing.changed(str(exc)):
                    log.warning(
                        "%s: the chips' network health is unknown, their last state is kept; install the "
                        "driver's hccn_tool or pass --hccn-tool",
                        exc,
                        extra=log_fields(reason=str(exc)),
                    )
                return _Unread("")
            if exc.reason == "timeout":  # the same words as a call the round's end cut short: one line
                return _Unread(_late(timeout))
            return _Unread(str(exc))
        except HccnParseError as exc:
            return _Unread(f"{command} printed something unexpected: {exc}")
        if self._missing.clear():
            log.info("hccn_tool runs again: %s", executable)
        return value

    def _take_links(self, links: dict[int, bool], now: float) -> None:
        """Each link read into its chip's outage; one line per kind of change for the chips it concerns."""
        changed: dict[Change, list[int]] = {change: [] for change in Change}
        for phys_id, up in sorted(links.items()):
            chip = self._chips[phys_id]
            changed[chip.outage.read(up, now)].append(phys_id)
            chip.link_up = up
            CHIP_LINK_UP.labels(device=chip.device).set(up)
            CHIP_NETWORK_UNHEALTHY.labels(device=chip.device).set(chip.outage.unhealthy)
        debounce = self._settings.link_down_debounce
        pending, back_up = changed[Change.WENT_DOWN], changed[Change.BACK_UP]
        unhealthy, recovered = changed[Change.UNHEALTHY], changed[Change.RECOVERED]
        if pending:
            log.info("RoCE link of %s DOWN; network-unhealthy if it stays DOWN for %g s",
                     _chips(pending), debounce, extra=log_fields(ids=pending))  # fmt: skip
        if back_up:
            log.info("RoCE link of %s UP again within %g s", _chips(back_up), debounce,
                     extra=log_fields(ids=back_up))  # fmt: skip
        if unhealthy:
            log.warning(
                "%s network-unhealthy: RoCE link DOWN for %g s or more; listed as NetworkUnhealthy "
                "(Volcano leaves them out of distributed jobs; single-chip pods may still use them)",
                _chips(unhealthy).capitalize(),
                debounce,
                extra=log_fields(ids=unhealthy, reason="link down"),
            )
        if recovered:
            log.info("%s network-healthy again: RoCE link UP", _chips(recovered).capitalize(),
                     extra=log_fields(ids=recovered))  # fmt: skip

    def _take_net_health(self, statuses: dict[int, str]) -> None:
        """Each net health read; one line for the chips whose status changed (or is first read not ready)."""
        changes = []
        for phys_id, status in sorted(statuses.items()):
            chip = self._chips[phys_id]
            before, chip.net_health = chip.net_health, status
            if before == status:
                continue
            if before is not None:
                CHIP_NET_HEALTH.remove(chip.device, before)
            CHIP_NET_HEALTH.labels(device=chip.device, status=status).set(1)
            if before is not None or status not in NET_HEALTH_READY:
                changes.append(f"chip {phys_id} {status}" + (f" (was {before})" if before else ""))
        if changes:
            log.info("Net health (hccn_tool -net_health -g): %s", "; ".join(changes))

    def _forget(self, kept: set[int]) -> None:
        """Drop the chips no longer read (no device IP, or npu-smi does not report them healthy) with their
        series; one that was network-unhealthy is said."""
        dropped = []
        for phys_id in sorted(set(self._chips) - kept):
            chip = self._chips.pop(phys_id)
            if chip.link_up is not None:
                CHIP_LINK_UP.remove(chip.device)
                CHIP_NETWORK_UNHEALTHY.remove(chip.device)
            if chip.net_health is not None:
                CHIP_NET_HEALTH.remove(chip.device, chip.net_health)
            for what in _WHAT.values():
                self._problems.pop((phys_id, what), None)
            if chip.outage.unhealthy:
                dropped.append(phys_id)
        if dropped:
            log.info("%s no longer network-unhealthy: a chip's network is not read while it has no device IP "
                     "or is not healthy", _chips(dropped).capitalize())  # fmt: skip

    def _report(self, what: str, answers: dict[int, bool | str | _Unread]) -> None:
        """One warning for the chips whose ``what`` newly cannot be read (or for another reason), one info
        line for those whose ``what`` reads again."""
        problems = {p: v.reason for p, v in answers.items() if isinstance(v, _Unread) and v.reason}
        changed = [
            p
            for p, reason in problems.items()
            if self._problems.setdefault((p, what), ProblemLog()).changed(reason)
        ]
        if changed:
            first = changed[0]
            log.warning(
                "Cannot read the %s of %s (chip %d: %s); keeping the last one read",
                what,
                _chips(changed),
                first,
                problems[first],
                extra=log_fields(ids=changed, reason=problems[first]),
            )
        again = [
            p
            for p, value in answers.items()
            if not isinstance(value, _Unread) and (known := self._problems.get((p, what))) and known.clear()
        ]
        if again:
            log.info("The %s of %s reads again", what, _chips(again))


def _late(seconds: float) -> str:
    return f"no answer within {seconds:g} s"


def _chips(ids: Sequence[int]) -> str:
    """``chip 3`` or ``chips 0, 1``."""
    return f"chip{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"
