"""What the reconciler reports of each inventory: the log lines (a device found, a chip Unhealthy or Healthy
again, a problem), the device gauges per resource, the vNPU and training gauges, and which pod holds each
device for the metrics' labels::

    report = InventoryReport(holders=lambda: holdings.by_chip(), replicas=lambda: settings.replicas)
    report.inventory(inventory)          # after each discovery: logs what changed
    report.count(desired, inventory.vnpus)
    chip_series(inventory)               # ascend_agent_chip_info and _chip_fault, after the grading
    label_devices_with_holders(report.holder_of)   # a DRA driver (claim_driver=...): claims=True
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Sequence

from ascend_agent.model import Chip, Health, Holder, Holders, Inventory
from ascend_agent.observability import (
    CHIP_FAULT,
    CHIP_INFO,
    CHIP_TRAINING,
    DEVICE_HEALTH,
    DEVICES,
    VNPU_AICORES,
    VNPU_MEMORY,
    log_fields,
)

log = logging.getLogger(__name__)


class _Shown(enum.Enum):
    """Whose health a chip shows: its own, the flap hold's, or none known (npu-smi down)."""

    OWN = "own"
    HELD = "held"
    UNKNOWN = "unknown"


class InventoryReport:
    """Logs each change once; keeps the last inventory for :meth:`holder_of`."""

    def __init__(
        self,
        holders: Callable[[], Holders] = Holders,
        replicas: Callable[[], int] = lambda: 1,
        claim_driver: str | None = None,
    ) -> None:
        """``claim_driver``: as a DRA driver, its name: a device's holders are those of its claims."""
        self.last = Inventory()
        self._claim_driver = claim_driver
        self._holders = holders
        self._replicas = replicas
        self._known_chips: set[str] = set()
        self._health: dict[str, tuple[Health, _Shown, str]] = {}
        self._problems: tuple[str, ...] = ()

    def inventory(self, inventory: Inventory) -> None:
        """Log the devices found, each chip's own health change and each new problem."""
        self.last = inventory
        for chip in (*inventory.chips, *inventory.vnpus):
            if chip.device_path not in self._known_chips:
                self._known_chips.add(chip.device_path)
                log.info(
                    "Found device %s",
                    chip.device_path,
                    extra=log_fields(device=chip.device_id, path=chip.device_path),
                )
            before = self._health.get(chip.device_id)
            # A held chip's own flips and a chip whose health is unknown (npu-smi down) are not logged per
            # change: the hold and the outage are logged once each where they start and end.
            shown = _Shown.HELD if chip.held else _Shown.UNKNOWN if chip.health_unknown else _Shown.OWN
            now = (chip.health, shown, chip.reason if shown is _Shown.OWN else "")
            if before == now:
                continue
            self._health[chip.device_id] = now
            if shown is not _Shown.OWN:
                continue
            if chip.health is Health.UNHEALTHY:
                reason = chip.reason or "no reason reported"
                log.warning(
                    "%s is Unhealthy: %s",
                    chip.device_id,
                    reason,
                    extra=log_fields(resource=chip.resource, device=chip.device_id, reason=reason),
                )
            elif before is not None and before[1] is not _Shown.UNKNOWN:
                log.info(
                    "%s is Healthy again",
                    chip.device_id,
                    extra=log_fields(resource=chip.resource, device=chip.device_id),
                )
        if inventory.problems != self._problems:
            for problem in inventory.problems:
                if problem not in self._problems:
                    log.warning("%s", problem)
            self._problems = inventory.problems

    def count(self, desired: dict[str, tuple[Chip, ...]], vnpus: Sequence[Chip]) -> None:
        """The device gauges of what each resource advertises, and the training and vNPU gauges."""
        DEVICES.clear()
        DEVICE_HEALTH.clear()
        for resource, chips in desired.items():
            for health in Health:
                DEVICES.labels(resource=resource, health=health.value).set(
                    sum(c.health is health for c in chips)
                )
            for chip in chips:
                DEVICE_HEALTH.labels(resource=resource, device=chip.device_id).set(chip.healthy)
        training_info(chip for chips in desired.values() for chip in chips)
        _count_vnpus(vnpus)

    def holder_of(self, device: str) -> tuple[str, ...]:
        """The (namespace, pod, container) holding a chip or a vNPU, for its metrics, and as a DRA driver the
        claim; comma-joined when its replicas (or several claims) are held by several."""
        inventory = self.last
        chip = next((c for c in (*inventory.chips, *inventory.vnpus) if c.device_id == device), None)
        holders = self.holders(chip) if chip is not None else ()
        return holder_labels(holders, claims=self._claim_driver is not None)

    def holders(self, chip: Chip) -> Sequence[Holder]:
        """The containers holding ``chip`` (any replica of it); a DRA driver's with their claims."""
        found = self._holders()
        if self._claim_driver is not None:
            return found.of_claimed(self._claim_driver, chip)
        return found.of(chip, 1 if chip.vnpu is not None else self._replicas())


def holder_labels(holders: Sequence[Holder], claims: bool = False) -> tuple[str, ...]:
    """The holders as the values of the metrics' labels ``namespace``, ``pod``, ``container`` (and with
    ``claims``, ``claim``): comma-joined, empty strings for none.

    >>> holder_labels([Holder("a", "p", "c", "x"), Holder("a", "q", "c", "y")], claims=True)
    ('a,a', 'p,q', 'c,c', 'x,y')
    """
    values = (
        ",".join(h.namespace for h in holders),
        ",".join(h.pod for h in holders),
        ",".join(h.container for h in holders),
    )
    return (*values, ",".join(h.claim for h in holders)) if claims else values


def chip_series(inventory: Inventory) -> None:
    """``ascend_agent_chip_info`` of every chip, and ``ascend_agent_chip_fault`` of every error code a chip
    reports now with the class the fault table grades it (empty while ungraded)."""
    CHIP_INFO.clear()
    CHIP_FAULT.clear()
    for chip in inventory.chips:
        CHIP_INFO.labels(
            device=chip.device_id,
            model=chip.model,
            bus_id=chip.bus_id or "",
            driver_version=inventory.driver_version or "",
            firmware_version=chip.firmware_version or "",
            serial=chip.serial or "",
        ).set(1)
        for fault in chip.faults:
            # While npu-smi is down a chip keeps its codes ungraded: the chip's last class keeps the series.
            graded = fault.fault_class if fault.fault_class is not None else chip.fault_class
            fault_class = "" if graded is None else graded.huawei
            CHIP_FAULT.labels(device=chip.device_id, code=fault.code, fault_class=fault_class).set(1)


def training_info(chips: Iterable[Chip]) -> None:
    """``ascend_agent_chip_training_info`` for every chip that has a device IP, vNIC IP or super pod."""
    CHIP_TRAINING.clear()
    for chip in chips:
        pod = chip.super_pod
        if chip.vnpu is not None or (chip.device_ip is None and chip.vnic_ip is None and pod is None):
            continue
        CHIP_TRAINING.labels(
            device=chip.device_id,
            device_ip=chip.device_ip or "",
            vnic_ip=chip.vnic_ip or "",
            super_pod_id="" if pod is None else str(pod.super_pod_id),
            server_index="" if pod is None else str(pod.server_index),
            sdid="" if pod is None else str(pod.sdid),
        ).set(1)


def _count_vnpus(parts: Sequence[Chip]) -> None:
    VNPU_AICORES.clear()
    VNPU_MEMORY.clear()
    for part in parts:
        assert part.vnpu is not None
        labels = {"device": part.device_id, "chip": part.chip_device_id, "template": part.vnpu.template}
        if part.vnpu.aicore is not None:
            VNPU_AICORES.labels(**labels).set(part.vnpu.aicore)
        if part.vnpu.memory_gb is not None:
            VNPU_MEMORY.labels(**labels).set(part.vnpu.memory_gb * 1024**3)
