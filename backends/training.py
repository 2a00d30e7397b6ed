"""What distributed training needs to know of each chip: its device IP (``hccn_tool -ip -g``, IPv6 when it has
no IPv4 address), on A3 its virtual NIC's address (``-vnic -g``) and its super-pod identity (``npu-smi info
-t spod-info``). Only chips of models that train (910, 910B, A3) are asked; a 310/310P node runs nothing.

The facts change rarely, so they are read at start, again when a chip comes back (npu-smi reports it again,
or its Health returns to OK), and otherwise every :data:`REREAD_SECONDS`, spread over the health queries of
that minute (a few chips per query), so the health loop never waits for a whole round. A read that fails,
times out or prints garbage keeps the last good value and is one log line per change; an address another chip
holds too (an answer meant for another chip) is refused the same way. "Nothing configured" is a value: the
chip has no address. Nothing is ever made up::

    probe = TrainingProbe(settings)
    await probe.refresh(targets, interval=5.0)
    facts = probe.facts(3)          # ChipFacts(device_ip='10.10.0.13', vnic_ip=None, super_pod=None)
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import anyio

from ascend_agent.backends.hccn import (
    HccnParseError,
    parse_ip,
    parse_ipv6,
    parse_vnic,
    run_hccn_tool,
)
from ascend_agent.backends.npusmi import NpuSmiError, NpuSmiParseError, parse_spod_info
from ascend_agent.backends.tool import run_npu_smi
from ascend_agent.config import Settings
from ascend_agent.model import Generation, SuperPod
from ascend_agent.observability import ProblemLog, log_fields

log = logging.getLogger(__name__)

REREAD_SECONDS = 60.0
# Chips read at once (at start, or when many come back together): each read is a few hccn_tool runs.
_CONCURRENT_READS = 4


@dataclass(frozen=True, slots=True)
class TrainingTarget:
    """A chip as the health query sees it: its ids, model and whether npu-smi reports it with Health OK."""

    phys_id: int
    npu_id: int
    chip_on_card: int
    generation: Generation
    answering: bool


@dataclass(frozen=True, slots=True)
class ChipFacts:
    """A chip's last good training facts; None where it has none or none was ever read."""

    device_ip: str | None = None
    vnic_ip: str | None = None
    super_pod: SuperPod | None = None


@dataclass(frozen=True, slots=True)
class _Unread:
    """A read that failed, and why: the last good value stays."""

    reason: str


# One chip's read: device IP, vNIC IP, super pod; each a value, None (the chip has none) or _Unread.
_Read = tuple[str | _Unread | None, str | _Unread | None, SuperPod | _Unread | None]
_FIELDS = ("device IP", "vNIC IP", "super pod")


class TrainingProbe:
    """Each chip's :class:`ChipFacts`, read on the schedule in the module's docstring."""

    def __init__(
        self,
        settings: Settings,
        reread_seconds: float = REREAD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._reread = reread_seconds
        self._clock = clock
        self._facts: dict[int, ChipFacts] = {}
        self._read_at: dict[int, float] = {}
        self._answering: frozenset[int] = frozenset()
        self._problems: dict[tuple[int, str], ProblemLog] = {}
        self._missing = ProblemLog()

    def facts(self, phys_id: int) -> ChipFacts:
        return self._facts.get(phys_id, ChipFacts())

    def view(self) -> tuple[tuple[int, ChipFacts], ...]:
        return tuple(sorted(self._facts.items()))

    async def refresh(self, targets: Sequence[TrainingTarget], interval: float) -> None:
        """Read the chips that are due: every one never read or just come back, and of the others those read
        longest ago, as many as spread a whole round over :data:`REREAD_SECONDS` of ``interval``-second
        queries. Never raises for what the tools do."""
        training = [target for target in targets if target.generation.trains]
        now = self._clock()
        back = {t.phys_id for t in training if t.answering and t.phys_id not in self._answering}
        self._answering = frozenset(t.phys_id for t in training if t.answering)
        urgent = [
            t for t in training if t.answering and (t.phys_id not in self._read_at or t.phys_id in back)
        ]
        due = sorted(
            (
                t
                for t in training
                if t.answering and t not in urgent and now - self._read_at[t.phys_id] >= self._reread
            ),
            key=lambda t: self._read_at[t.phys_id],
        )
        per_query = max(1, math.ceil(len(training) * interval / self._reread))
        chosen = urgent + due[:per_query]
        if not chosen:
            return
        found: dict[int, _Read] = {}
        limiter = anyio.CapacityLimiter(_CONCURRENT_READS)

        async def read(target: TrainingTarget) -> None:
            async with limiter:
                found[target.phys_id] = await self._read(target)

        async with anyio.create_task_group() as tasks:
            for target in chosen:
                tasks.start_soon(read, target)
        for phys_id in found:
            self._read_at[phys_id] = now
        self._apply(found)

    def _apply(self, found: dict[int, _Read]) -> None:
        """Take what was read, but no address or SDID another chip holds as well; each field's problem is one
        log line per change."""
        updated = {phys_id: self.facts(phys_id) for phys_id in found}
        for index, what in enumerate(_FIELDS):
            refused = self._held_elsewhere(found, index)
            problems: dict[int, str] = {}
            solved: list[int] = []
            for phys_id, read in sorted(found.items()):
                value = read[index]
                if isinstance(value, _Unread):
                    if value.reason:
                        problems[phys_id] = value.reason
                elif phys_id in refused:
                    problems[phys_id] = refused[phys_id]
                else:
                    solved.append(phys_id)
                    updated[phys_id] = _with(updated[phys_id], index, value)
            self._report(what, problems, solved)
        changed = sorted(p for p, facts in updated.items() if facts != self.facts(p))
        self._facts.update(updated)
        if changed:
            log.info(
                "Training facts: %s",
                "; ".join(f"chip {p} {_describe(self.facts(p))}" for p in changed),
                extra=log_fields(ids=changed),
            )

    def _held_elsewhere(self, found: dict[int, _Read], index: int) -> dict[int, str]:
        """The chips whose new value (field ``index``) another chip holds too, whether that chip's value is
        new or kept, with the reason: an answer meant for another chip. A chip whose value is unchanged keeps
        it (the other one is the new answer)."""
        attribute = _ATTRIBUTES[index]
        values = {p: _identity(getattr(f, attribute)) for p, f in self._facts.items()}
        for phys_id, read in found.items():
            if not isinstance(read[index], _Unread):
                values[phys_id] = _identity(read[index])
        holders: dict[object, list[int]] = {}
        for phys_id, value in values.items():
            if value is not None:
                holders.setdefault(value, []).append(phys_id)
        refused = {}
        for phys_id, read in found.items():
            if isinstance(read[index], _Unread):
                continue
            value = _identity(read[index])
            # The chip that held the value already is named first, then by number (reads end in any order).
            others = sorted(
                (p for p in holders.get(value, ()) if p != phys_id),
                key=lambda p: (_identity(getattr(self.facts(p), attribute)) != value, p),
            )
            if others and _identity(getattr(self.facts(phys_id), attribute)) != value:
                refused[phys_id] = (
                    f"hccn_tool or npu-smi named {_FIELDS[index]} {value}, which chip {others[0]} has: "
                    "an answer meant for another chip"
                )
        return refused

    async def _read(self, target: TrainingTarget) -> _Read:
        device_ip = await self._hccn(target.phys_id, ["-ip", "-g"], parse_ip)
        if device_ip is None:  # no IPv4 address: an IPv6 one, as Huawei's plugin asks
            device_ip = await self._hccn(target.phys_id, ["-ip", "-inet6", "-g"], parse_ipv6)
        a3 = target.generation is Generation.ASCEND910A3
        vnic_ip = await self._hccn(target.phys_id, ["-vnic", "-g"], parse_vnic) if a3 else None
        super_pod = await self._super_pod(target) if a3 else None
        return device_ip, vnic_ip, super_pod

    async def _hccn(
        self, phys_id: int, args: list[str], parse: Callable[[str], str | None]
    ) -> str | _Unread | None:
        executable = self._settings.effective_hccn_tool
        try:
            text = await run_hccn_tool(executable, phys_id, args, self._settings.npu_smi_timeout)
            value = parse(text) if text is not None else None
        except NpuSmiError as exc:
            if exc.reason == "missing":
                self._tool_missing(str(exc))
                return _Unread("")  # logged once for the node, not per chip
            return _Unread(str(exc))
        except HccnParseError as exc:
            return _Unread(f"hccn_tool -i {phys_id} {' '.join(args)} printed something unexpected: {exc}")
        if self._missing.clear():
            log.info("hccn_tool runs again: %s", executable)
        return value

    async def _super_pod(self, target: TrainingTarget) -> SuperPod | _Unread | None:
        """The die's super pod; None where npu-smi says the chip or driver does not support the query."""
        args = ["info", "-t", "spod-info", "-i", str(target.npu_id), "-c", str(target.chip_on_card)]
        try:
            text = await run_npu_smi(self._settings.effective_npu_smi, args, self._settings.npu_smi_timeout)
            if _UNSUPPORTED in text:
                return None
            return parse_spod_info(text)
        except NpuSmiError as exc:
            return None if _UNSUPPORTED in str(exc) else _Unread(str(exc))
        except NpuSmiParseError as exc:
            return _Unread(f"npu-smi {' '.join(args)} printed something unexpected: {exc}")

    def _tool_missing(self, reason: str) -> None:
        # Info: the doctor's "device IPs" check fails on such a node and says what to do.
        if self._missing.changed(reason):
            log.info(
                "%s: the chips' device IPs are unknown, so training jobs cannot build their rank tables "
                "here; install the driver's hccn_tool or pass --hccn-tool",
                reason,
                extra=log_fields(reason=reason),
            )

    def _report(self, what: str, problems: dict[int, str], solved: list[int]) -> None:
        """One warning for the chips whose ``what`` newly cannot be read (or for another reason), one info
        line for those whose ``what`` reads again."""
        changed = [
            phys_id
            for phys_id, reason in problems.items()
            if self._problems.setdefault((phys_id, what), ProblemLog()).changed(reason)
        ]
        if changed:
            first = changed[0]
            log.warning(
                "Cannot read the %s of chip%s %s (chip %d: %s); keeping the last one read",
                what,
                "s" if len(changed) > 1 else "",
                ", ".join(map(str, changed)),
                first,
                problems[first],
                extra=log_fields(ids=changed, reason=problems[first]),
            )
        again = [p for p in solved if (found := self._problems.get((p, what))) is not None and found.clear()]
        if again:
            log.info("The %s of chip%s %s reads again", what, "s" if len(again) > 1 else "",
                     ", ".join(map(str, again)))  # fmt: skip


# What npu-smi says where a chip or its driver has no super-pod identity.
_UNSUPPORTED = "does not support get spod info"
_ATTRIBUTES = ("device_ip", "vnic_ip", "super_pod")


def _with(facts: ChipFacts, index: int, value: str | SuperPod | None) -> ChipFacts:
    if isinstance(value, SuperPod):
        return replace(facts, super_pod=value)
    if index == 0:
        return replace(facts, device_ip=value)
    if index == 1:
        return replace(facts, vnic_ip=value)
    return replace(facts, super_pod=None)


def _identity(value: object) -> object:
    """What must be unique per node: an address, or a super pod's SDID."""
    return value.sdid if isinstance(value, SuperPod) else value


def _describe(facts: ChipFacts) -> str:
    """``device IP 10.0.245.11, vNIC IP 192.168.2.0, super pod 0 (server index 40, SDID 167772160)``."""
    parts = [f"device IP {facts.device_ip or 'none'}"]
    if facts.vnic_ip is not None:
        parts.append(f"vNIC IP {facts.vnic_ip}")
    pod = facts.super_pod
    if pod is not None:
        parts.append(f"super pod {pod.super_pod_id} (server index {pod.server_index}, SDID {pod.sdid})")
    return ", ".join(parts)
