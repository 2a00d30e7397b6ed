"""Fault grading: each chip's fault codes graded by the fault table (:mod:`.faulttable`), the most severe
class winning, raised further by ``FaultFrequency`` and ``FaultDuration``; the class decides the
chip's health (Unhealthy from ``FreeRestartNPU`` up). The agent keeps one for its lifetime, like the flap
hold, and applies it to each discovery; the cluster side hands it the table of ``mindx-dl-fault-config``::

    grading = FaultGrading(FaultTable.builtin())
    inventory = grading.apply(inventory)    # chip.fault_class, each fault's class, the health they decide
    grading.update(table)                   # a new table (True when it differs): the agent reconciles

A code the table does not name is graded as Huawei grades a code of unknown severity: ``SeparateNPU``;
except while npu-smi's Health column is ``Warning``, which bounds every code's severity to minor, and
Huawei grades a minor code it does not know ``NotHandleFault``. ``faultPolicy`` in the config file grades
the codes or prefixes it names before the table: ``healthy`` as ``NotHandleFault``, ``unhealthy`` as
``SeparateNPU``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from ascend_agent.config import HEALTHY
from ascend_agent.faultclass import FaultClass
from ascend_agent.health.faults import FaultPolicy, describe
from ascend_agent.health.faulttable import FaultTable, parse_code
from ascend_agent.model import Chip, Fault, Health, Inventory

log = logging.getLogger(__name__)

# The Health column's values that bound every code's severity to minor (DCMI's minor alarm).
_MINOR_COLUMNS = frozenset({"warning"})


@dataclass
class _Code:
    """What one code of one chip did: when it came and went, how often it came, what it raised."""

    present: bool = False
    since: float = 0.0  # when it came (present) or went (not present)
    occurrences: deque[float] = field(default_factory=deque)
    by_frequency: FaultClass | None = None
    by_duration: FaultClass | None = None


class FaultGrading:
    """Grades chips by the running table; ``on_change`` runs (on the event loop) when the table changes."""

    def __init__(
        self,
        table: FaultTable,
        policy: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.table = table
        self.policy = FaultPolicy(dict(policy or {}))
        self.on_change = on_change
        self._clock = clock
        self._codes: dict[str, dict[int, _Code]] = {}
        self._classes: dict[str, FaultClass | None] = {}
        self._unknowns: dict[str, frozenset[Fault]] = {}

    @classmethod
    def builtin(cls, policy: Iterable[tuple[str, str]] = ()) -> FaultGrading:
        """Grading by Huawei's shipped table and ``faultPolicy`` (``Settings.fault_policy``)."""
        return cls(FaultTable.builtin(), dict(policy))

    def update(self, table: FaultTable) -> bool:
        """Take a new table (the ConfigMap's); True (and ``on_change`` called) when it grades differently.
        What each chip's codes did so far is kept."""
        if (table.classes, table.frequency, table.duration) == (
            self.table.classes,
            self.table.frequency,
            self.table.duration,
        ):
            return False
        self.table = table
        self.on_change()
        return True

    def configure(self, policy: Mapping[str, str]) -> None:
        """``faultPolicy`` of a reloaded config."""
        self.policy = FaultPolicy(dict(policy))

    def apply(self, inventory: Inventory) -> Inventory:
        """``inventory`` with each chip graded: its faults' classes, its class, and Unhealthy when that is
        ``FreeRestartNPU`` or worse. A chip whose health cannot be read keeps what it had."""
        return replace(inventory, chips=tuple(self._grade(chip) for chip in inventory.chips))

    def class_of(self, code: str, column: str) -> FaultClass:
        """The class of one code on a chip whose Health column says ``column``."""
        verdict = self.policy.verdict(code)
        if verdict is not None:
            return FaultClass.NOT_HANDLE if verdict == HEALTHY else FaultClass.SEPARATE_NPU
        try:
            number = parse_code(code)
        except ValueError:
            return FaultClass.SEPARATE_NPU
        known = self.table.class_of(number)
        if known is not None:
            return known
        return FaultClass.NOT_HANDLE if column.lower() in _MINOR_COLUMNS else FaultClass.SEPARATE_NPU

    def _grade(self, chip: Chip) -> Chip:
        if chip.health_unknown:
            return replace(chip, fault_class=self._classes.get(chip.device_id))
        faults = tuple(
            replace(fault, fault_class=self.class_of(fault.code, chip.health_status)) for fault in chip.faults
        )
        escalated = self._escalations(chip.device_id, faults)
        classes = [fault.fault_class for fault in faults if fault.fault_class is not None] + escalated
        worst = max(classes) if classes else None
        self._log_change(chip, faults, worst)
        graded = replace(chip, faults=faults, fault_class=worst)
        if worst is not None and worst.unhealthy and chip.healthy:
            return graded.with_health(Health.UNHEALTHY, _reason(chip.health_status, faults, worst))
        return graded

    def _escalations(self, device: str, faults: tuple[Fault, ...]) -> list[FaultClass]:
        """The classes ``FaultFrequency`` and ``FaultDuration`` raise the chip to now."""
        now = self._clock()
        present = set()
        for fault in faults:
            try:
                present.add(parse_code(fault.code))
            except ValueError:
                continue
        tracks = self._codes.setdefault(device, {})
        raised: list[FaultClass] = []
        for code in present | set(tracks):
            frequency, duration = self.table.frequency.get(code), self.table.duration.get(code)
            if frequency is None and duration is None:
                tracks.pop(code, None)
                continue
            track = tracks.setdefault(code, _Code())
            if (code in present) != track.present:
                track.present, track.since = code in present, now
                # Huawei counts the occurrences of a code without a FaultDuration rule only.
                if track.present and duration is None:
                    track.occurrences.append(now)
            if frequency is None:
                track.by_frequency = None
            else:
                while track.occurrences and track.occurrences[0] < now - frequency.window:
                    track.occurrences.popleft()
                if len(track.occurrences) >= frequency.times:
                    track.by_frequency = frequency.handling
                elif (
                    not track.present
                    and frequency.release is not None
                    and now - track.since >= frequency.release
                ):
                    track.by_frequency = None
            if duration is None:
                track.by_duration = None
            elif track.present and now - track.since >= duration.timeout:
                track.by_duration = duration.handling
            elif not track.present and now - track.since >= duration.recover:
                track.by_duration = None
            raised_now = [level for level in (track.by_frequency, track.by_duration) if level is not None]
            raised += raised_now
            if not (track.present or track.occurrences or raised_now):
                tracks.pop(code, None)
        return raised

    def _log_change(self, chip: Chip, faults: tuple[Fault, ...], worst: FaultClass | None) -> None:
        """Each code the table does not name, once while the chip reports it; the class of a chip it keeps
        Healthy, once per change (the agent logs the chip turning Unhealthy)."""
        unknown = frozenset(fault for fault in faults if self._unknown(fault.code))
        for fault in sorted(unknown - self._unknowns.get(chip.device_id, frozenset()), key=lambda f: f.code):
            log.warning(
                "%s reports fault code %s, which the fault table (%s) does not name: graded %s",
                chip.device_id,
                fault.code,
                self.table.source,
                (fault.fault_class if fault.fault_class is not None else FaultClass.SEPARATE_NPU).huawei,
            )
        self._unknowns[chip.device_id] = unknown
        before, self._classes[chip.device_id] = self._classes.get(chip.device_id), worst
        if worst != before and worst is not None and not worst.unhealthy:
            log.info("%s stays Healthy: %s", chip.device_id, _reason(chip.health_status, faults, worst))

    def _unknown(self, code: str) -> bool:
        if self.policy.verdict(code) is not None:
            return False
        try:
            return self.table.class_of(parse_code(code)) is None
        except ValueError:
            return True


def _reason(column: str, faults: tuple[Fault, ...], worst: FaultClass) -> str:
    """``RestartNPU: Alarm, error codes 8C03A000 (...)``; an escalation says so."""
    own = max((fault.fault_class for fault in faults if fault.fault_class is not None), default=None)
    raised = "" if own == worst else " (raised by FaultFrequency or FaultDuration)"
    return f"{worst.huawei}{raised}: {describe(column or 'fault', faults)}"
