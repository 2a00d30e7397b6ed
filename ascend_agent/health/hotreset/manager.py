"""The hot reset (``--hot-reset idle``): a chip whose fault class says a reset clears it (``FreeRestartNPU``,
``RestartNPU``) is reset once its whole reset group has had no pod (PodResources, and what Allocate handed
over) and no process (npu-smi's process table) for ``hotResetIdle`` seconds; then it has ``hotResetRecover``
seconds to answer healthy. ``--hot-reset dry-run`` says what it would reset and runs nothing.

The agent feeds it every discovery and runs its task::

    resets = HotReset(settings, resetter=lambda: backend, held=agent.held_by_pods,
                      refresh_holders=holders.refresh, wake=agent.wake, note=side.event,
                      manual_resets=side.reset_info, budget_file=plugin_dir / BUDGET_FILE)
    resets.observe(inventory, separated)     # each chip's own health, before the flap hold
    inventory = resets.apply(inventory)      # the group under reset is Unhealthy to the kubelet
    tasks.start_soon(resets.run)

Before the reset runs, the group is published Unhealthy (no Allocate can hand out its chips any more), the
kubelet is asked again which pod holds what, and a pod or a process found then calls the reset off. A reset
that fails, hangs or whose chip does not come back, and a chip reset ``hotResetLimit`` times within
``hotResetWindow`` already, is left to a person: ``ManualResetDevs`` of the node annotation ``ResetInfo``,
until the chip is seen Healthy again. Each step is a log line, an Event on the Node and a count of
``ascend_agent_resets_total{result}``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Protocol, runtime_checkable

import anyio

from ascend_agent import naming
from ascend_agent.config import HOT_RESET_DRY_RUN, HOT_RESET_OFF, Settings
from ascend_agent.faultclass import FaultClass
from ascend_agent.health.hotreset.budget import ResetBudget
from ascend_agent.health.hotreset.command import ResetOutcome, reset_args
from ascend_agent.health.hotreset.groups import paired_known, reset_groups
from ascend_agent.health.hotreset.resetinfo import ResetDevice, reset_info
from ascend_agent.model import Chip, Health, Inventory
from ascend_agent.observability import RESETS, log_fields

log = logging.getLogger(__name__)

CLEARED_BY_RESET = frozenset({FaultClass.FREE_RESTART_NPU, FaultClass.RESTART_NPU})
# How long the agent may take to publish the group Unhealthy before the reset is called off.
PUBLISH_WAIT = 10.0

# Event reasons, as Huawei's resetRecord plugin names its own, and the agent's steps around them.
WAITING = "HotResetWaiting"
STARTED = "HotResetStart"
COMPLETED = "HotResetComplete"
FAILED = "HotResetFailed"
CANCELLED = "HotResetCancelled"
EXHAUSTED = "HotResetExhausted"
DRY_RUN = "HotResetDryRun"

Note = Callable[[str, str, str, str], None]  # (kind, reason, subject, message): an Event on the Node


def cleared_by_reset(chip: Chip) -> bool:
    """Whether the chip's fault is one a reset clears (its class ``FreeRestartNPU`` or ``RestartNPU``).

    >>> cleared_by_reset(Chip.make(0, "910B3", fault_class=FaultClass.RESTART_NPU))
    True
    >>> cleared_by_reset(Chip.make(0, "910B3", fault_class=FaultClass.SEPARATE_NPU))
    False
    """
    return chip.fault_class in CLEARED_BY_RESET


@runtime_checkable
class ChipResetter(Protocol):
    """A backend that can reset a chip (devfs, through npu-smi)."""

    async def reset_chip(self, chip: Chip, timeout: float) -> ResetOutcome:
        """Reset ``chip`` in-band, bounded by ``timeout``; never raises for what the tool does."""


class HotReset:
    """Idle tracking per reset group, the reset of due groups one at a time, the budget and the chips left
    to a person. Without ``note`` (no cluster side) the steps are log lines only, and without
    ``manual_resets`` ``ResetInfo`` is not written. ``clock`` is the monotonic clock the idle wait reads;
    the budget counts by the wall clock, in ``budget_file`` where one is given."""

    def __init__(
        self,
        settings: Settings,
        *,
        resetter: Callable[[], object],
        held: Callable[[], frozenset[str] | None],
        refresh_holders: Callable[[], Awaitable[object]],
        wake: Callable[[], None],
        note: Note | None = None,
        manual_resets: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        budget_file: Path | None = None,
    ) -> None:
        self._resetter = resetter
        self._held = held
        self._refresh_holders = refresh_holders
        self._wake_agent = wake
        self.note = note
        self.manual_resets = manual_resets
        self._clock = clock
        self._budget = ResetBudget(settings.hot_reset_limit, settings.hot_reset_window, path=budget_file)
        self._chips: dict[int, Chip] = {}
        self._inventory = Inventory()
        self._separated: frozenset[str] = frozenset()
        self._idle_since: dict[frozenset[int], float] = {}
        self._busy_said: dict[frozenset[int], str] = {}  # why each busy group waits, logged once per change
        self._resetting: frozenset[int] = frozenset()
        self._manual: dict[int, ResetDevice] = {}
        self._said: set[int] = set()  # dry-run: chips already said, until Healthy again
        self._no_resetter_said = False
        self._observed = 0  # discoveries seen, to tell those after a reset from those before
        self._marked = anyio.Event()
        self._changed = anyio.Event()
        self._wake = anyio.Event()
        self.configure(settings)

    def configure(self, settings: Settings) -> None:
        """The settings of now (a config reload); the budget spent and the chips left to a person stay."""
        self.mode = settings.hot_reset
        self.idle = settings.hot_reset_idle
        self.timeout = settings.hot_reset_timeout
        self.recover = settings.hot_reset_recover
        self.replicas = settings.replicas
        self.recheck = settings.health_interval
        self._budget.configure(settings.hot_reset_limit, settings.hot_reset_window)
        self._wake.set()

    @property
    def manual(self) -> tuple[ResetDevice, ...]:
        """The chips left to a person, as ``ResetInfo`` lists them."""
        return tuple(sorted(self._manual.values()))

    # what the agent tells it ------------------------------------------------------------------------------
    def observe(self, inventory: Inventory, separated: frozenset[str] = frozenset()) -> None:
        """Each chip's own health (the backend's, before the flap hold) and who holds what; ``separated``
        are the device IDs an admin separated, never reset."""
        self._inventory, self._separated = inventory, separated
        self._chips = {chip.phys_id: chip for chip in inventory.chips if chip.vnpu is None}
        self._observed += 1
        healthy = {p for p, chip in self._chips.items() if chip.healthy and not chip.health_unknown}
        self._said -= healthy
        back = [p for p in self._manual if p in healthy and p not in self._resetting]
        for phys_id in back:
            log.info(
                "Hot reset: %s is Healthy again; no longer left to a person", self._chips[phys_id].device_id
            )
            del self._manual[phys_id]
        if back and self.manual_resets is not None:
            self.manual_resets(reset_info(self._manual.values()))
        self._track_idle()
        self._changed.set()
        self._wake.set()

    def apply(self, inventory: Inventory) -> Inventory:
        """The chips of the group under reset (and their vNPUs) Unhealthy, so no Allocate hands them out."""
        if not self._resetting:
            return inventory
        self._marked.set()
        reason = f"hot reset of {self._names(self._resetting)} under way"

        def marked(chip: Chip) -> Chip:
            return chip.with_health(Health.UNHEALTHY, reason) if chip.phys_id in self._resetting else chip

        return replace(
            inventory,
            chips=tuple(marked(chip) for chip in inventory.chips),
            vnpus=tuple(marked(part) for part in inventory.vnpus),
        )

    # idle tracking ----------------------------------------------------------------------------------------
    def _candidate(self, chip: Chip | None) -> bool:
        return (
            chip is not None
            and not chip.healthy
            and not chip.health_unknown
            and cleared_by_reset(chip)
            and chip.device_id not in self._separated
            and chip.phys_id not in self._manual
            and chip.phys_id not in self._said
        )

    def _track_idle(self) -> None:
        if self.mode == HOT_RESET_OFF:
            self._idle_since.clear()
            return
        now = self._clock()
        groups = {frozenset(group) for group in reset_groups(tuple(self._chips.values())).values()}
        waiting = {}
        busy_now: dict[frozenset[int], str] = {}
        for group in groups:
            if group == self._resetting or not any(self._candidate(self._chips.get(p)) for p in group):
                continue
            busy = self._busy(group)
            since = self._idle_since.get(group)
            if busy is not None:
                busy_now[group] = busy
                if self._busy_said.get(group) != busy:
                    faulty = self._faulty(group)
                    log.info("Hot reset of %s waits: %s", faulty.device_id if faulty else "?", busy)
            if busy is None:
                if since is None:
                    what = f"waiting for {self.idle:g} s of no pod and no process"
                    self._step("Normal", WAITING, group, what, result="waiting", subject=self._faulty(group))
                waiting[group] = now if since is None else since
            elif since is not None:
                self._called_off(group, busy)
        self._idle_since = waiting
        self._busy_said = busy_now

    def _busy(self, group: Iterable[int]) -> str | None:
        """Why the group is not idle now; None when no pod holds and no process runs on any of its chips."""
        held = self._held()
        if held is None:
            return "which pod holds which chip is not known (PodResources does not answer)"
        for phys_id in sorted(group):
            chip = self._chips.get(phys_id)
            if chip is None:
                return f"chip {phys_id} is not reported"
            if self.mode != HOT_RESET_DRY_RUN and not paired_known(chip):
                return (
                    f"the driver has not said which card is reset with {chip.device_id}'s card (A3), so "
                    "nothing is reset; --hot-reset dry-run says what would be"
                )
            ids = set(naming.replica_ids(chip.device_id, self.replicas))
            ids.update(p.device_id for p in self._inventory.vnpus if p.phys_id == phys_id)
            if ids & held:
                return f"a pod holds {', '.join(sorted(ids & held))}"
            if chip.processes is None:
                return f"npu-smi does not say which processes run on {chip.device_id}"
            if chip.processes:
                return f"{chip.processes} processes run on {chip.device_id}"
        return None

    # resetting --------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Reset each group once it is due, one at a time, until cancelled. The groups are looked at again
        every ``health_interval`` too: a pod that leaves changes no chip, so no discovery says so. The
        resets an agent before this one made count first (``budget_file``)."""
        await self._budget.load()
        while True:
            self._wake = anyio.Event()
            group, wait = self._next_due()
            if group is not None:
                await self._reset(group)
                continue
            with anyio.move_on_after(min(wait, self.recheck)):
                await self._wake.wait()
            if not self._wake.is_set():
                self._track_idle()

    def _next_due(self) -> tuple[frozenset[int] | None, float]:
        wait = math.inf
        now = self._clock()
        for group, since in sorted(self._idle_since.items(), key=lambda item: item[1]):
            left = since + self.idle - now
            if left <= 0:
                return group, 0.0
            wait = min(wait, left)
        return None, wait

    async def _reset(self, group: frozenset[int]) -> None:
        del self._idle_since[group]
        targets = [self._chips[p] for p in sorted(group) if self._candidate(self._chips.get(p))]
        if targets:  # the resets another instance made meanwhile count too (a DRA driver's rolling update)
            await self._budget.load()
        allowed = []
        for chip in targets:
            if self._budget.allows(chip.phys_id):
                allowed.append(chip)
                continue
            self._leave(
                chip,
                EXHAUSTED,
                "exhausted",
                f"reset {self._budget.used(chip.phys_id)} times within {self._budget.window:g} s already",
            )
        if not allowed:
            return
        if self.mode == HOT_RESET_DRY_RUN:
            for chip in allowed:
                self._said.add(chip.phys_id)
                self._step(
                    "Normal",
                    DRY_RUN,
                    group,
                    f"would run npu-smi {' '.join(reset_args(*_card(chip)))} for {chip.device_id} "
                    f"({_fault(chip)}); dry run: nothing runs",
                    result="dry_run",
                    subject=chip,
                )
            return
        resetter = self._resetter()
        if not isinstance(resetter, ChipResetter):
            if not self._no_resetter_said:
                log.warning(
                    "Hot reset: this backend cannot reset chips; %s stays Unhealthy", self._names(group)
                )
            self._no_resetter_said = True
            return
        self._resetting = group
        self._marked = anyio.Event()
        self._wake_agent()
        try:
            await self._reset_marked(group, allowed, resetter)
        finally:
            self._resetting = frozenset()
            self._wake_agent()

    async def _reset_marked(self, group: frozenset[int], chips: list[Chip], resetter: ChipResetter) -> None:
        """With the group published Unhealthy: ask the kubelet again, then reset, then wait for the chips."""
        with anyio.move_on_after(PUBLISH_WAIT):
            await self._marked.wait()
        if not self._marked.is_set():
            self._called_off(
                group, f"the agent did not publish the group Unhealthy within {PUBLISH_WAIT:g} s"
            )
            return
        await self._refresh_holders()
        busy = self._busy(group)
        if busy is not None:
            self._called_off(group, busy)
            return
        done = []
        for chip in chips:
            self._budget.spend(chip.phys_id)
            await self._budget.save()  # before the reset: a crash in it still counts
            args = " ".join(reset_args(*_card(chip)))
            self._step("Normal", STARTED, group, f"npu-smi {args} ({_fault(chip)})", result="started",
                       subject=chip)  # fmt: skip
            outcome = await resetter.reset_chip(chip, self.timeout)
            if outcome.ok:
                done.append(chip)
            else:
                word = "did not finish within" if outcome.reason == "hung" else "failed"
                why = f"npu-smi {args} {word}"
                why += (
                    f" {self.timeout:g} s: {outcome.detail}"
                    if outcome.reason == "hung"
                    else f": {outcome.detail}"
                )
                self._leave(chip, FAILED, outcome.reason, why)
        if done:
            await self._wait_recovered(group, done)

    async def _wait_recovered(self, group: frozenset[int], chips: list[Chip]) -> None:
        """Wait up to ``recover`` seconds for every reset chip to be seen Healthy in a discovery made after
        the reset; each that is not is left to a person."""
        after = self._observed
        started = self._clock()
        waiting = {chip.phys_id: chip for chip in chips}
        with anyio.move_on_after(self.recover):
            while waiting:
                self._changed = anyio.Event()
                if self._observed > after:
                    for phys_id in [p for p in waiting if self._back(p)]:
                        chip = waiting.pop(phys_id)
                        self._step(
                            "Normal",
                            COMPLETED,
                            group,
                            f"{chip.device_id} is Healthy again "
                            f"{self._clock() - started:.1f} s after its reset",
                            result="succeeded",
                            subject=chip,
                        )
                if waiting:
                    await self._changed.wait()
        for chip in waiting.values():
            self._leave(chip, FAILED, "not_recovered", f"not Healthy within {self.recover:g} s of its reset")

    def _back(self, phys_id: int) -> bool:
        chip = self._chips.get(phys_id)
        return chip is not None and chip.healthy and not chip.health_unknown

    # steps ------------------------------------------------------------------------------------------------
    def _called_off(self, group: frozenset[int], why: str) -> None:
        what = f"called off: {why}"
        self._step("Normal", CANCELLED, group, what, result="cancelled", subject=self._faulty(group))

    def _faulty(self, group: frozenset[int]) -> Chip | None:
        """The group's first chip a reset would clear, which its Events are about."""
        return next((self._chips[p] for p in sorted(group) if self._candidate(self._chips.get(p))), None)

    def _leave(self, chip: Chip, reason: str, result: str, why: str) -> None:
        """The chip stays Unhealthy and is left to a person (``ResetInfo``'s ``ManualResetDevs``)."""
        self._manual[chip.phys_id] = ResetDevice.of(chip)
        self._step(
            "Warning",
            reason,
            frozenset({chip.phys_id}),
            f"{why}; it stays Unhealthy, left to a person (node annotation ResetInfo, ManualResetDevs)",
            result=result,
            subject=chip,
        )
        if self.manual_resets is not None:
            self.manual_resets(reset_info(self._manual.values()))

    def _step(
        self,
        kind: str,
        reason: str,
        group: Iterable[int],
        what: str,
        *,
        result: str | None = None,
        subject: Chip | None = None,
    ) -> None:
        """One step: a log line, an Event about the chip (or the group's first chip), a count."""
        members = sorted(group)
        about = subject or self._chips.get(members[0])
        name = about.device_id if about is not None else str(members[0])
        message = f"Hot reset of {name}: {what}"
        if len(members) > 1:
            message += f" (reset group {self._names(members)})"
        if result is not None:
            RESETS.labels(result=result).inc()
        level = logging.WARNING if kind == "Warning" else logging.INFO
        log.log(level, "%s", message, extra=log_fields(device=name, reason=reason))
        if self.note is not None:
            self.note(kind, reason, name, message)

    def _names(self, group: Iterable[int]) -> str:
        return ", ".join(self._chips[p].device_id if p in self._chips else str(p) for p in sorted(group))


def _card(chip: Chip) -> tuple[int, int]:
    """npu-smi's ``-i`` and ``-c`` for the chip."""
    return (chip.npu_id if chip.npu_id is not None else chip.phys_id), chip.chip_on_card


def _fault(chip: Chip) -> str:
    codes = ", ".join(fault.code for fault in chip.faults)
    assert chip.fault_class is not None
    return f"{chip.fault_class.huawei}" + (f", fault codes {codes}" if codes else "")
