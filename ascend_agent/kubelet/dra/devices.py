"""The chips as DRA devices: their names, attributes, capacity and health taints, and the ResourceSlices of
the node's pool. Pure functions of the inventory; no I/O.

    >>> chips = tuple(
    ...     Chip.make(i, "910B3", numa_node=i // 4, pcie_root="pci0000:00", hbm_mb=65536) for i in range(2)
    ... )
    >>> node = NodeChips.of(chips, "25.0.rc1.1")
    >>> device = slice_device(chips[1], node, DeviceTaints("npu.huawei.com", "NoSchedule"))
    >>> device["name"], device["attributes"]["deviceType"], device["attributes"]["physicId"]
    ('npu-1', {'string': 'Ascend910B3'}, {'int': 1})
    >>> device["attributes"][STANDARD_PCIE_ROOT], device["attributes"][STANDARD_NUMA_NODE]
    ({'string': 'pci0000:00'}, {'int': 0})
    >>> device["capacity"]["memory"], device["attributes"]["driverVersion"]
    ({'value': '64Gi'}, {'version': '25.0.1-rc.1'})
    >>> spec = pool_slices(Inventory(chips), DeviceTaints("npu.huawei.com", "NoSchedule"))
    >>> [len(s["devices"]) for s in spec]
    [2]
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ascend_agent import naming
from ascend_agent.allocation import Layout, Topology, topology_for
from ascend_agent.container import device_order
from ascend_agent.faultclass import FaultClass
from ascend_agent.kubelet.dra.partitions import MAX_COUNTER_SETS, ChipOffer, chip_offer, template_device_name
from ascend_agent.model import Chip, Inventory, VNpu, unzoned_address

# resource.k8s.io/v1: at most 128 devices per slice, 64 when any device has taints.
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS = 64
_MAX_STRING = 64
_MAX_TAINT_VALUE = 63
_INVALID_VALUE = re.compile(r"[^A-Za-z0-9._-]")
# AI cores per chip where the model alone fixes the count: 310P3 (Atlas inference cards) and 910B4 (Atlas 800I
# A2). Other 910 models come in variants with different counts.
_AI_CORES = {"910B4": 20, "310P3": 8}
# Kubernetes' standard attributes (k8s.io/dynamic-resource-allocation/deviceattribute), which devices of any
# driver carry: a claim's matchAttribute on one aligns a chip with a NIC of another driver.
STANDARD_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
STANDARD_NUMA_NODE = "resource.kubernetes.io/numaNode"


def device_name(chip: Chip) -> str:
    """The device name in the pool (a DNS label): ``npu-<phys id>`` for a chip, ``npu-<phys id>-vnpu-<vnpu
    id>`` for a vNPU of it.

    >>> from ascend_agent.model import VNpu
    >>> device_name(Chip.make(3, "310P3")), device_name(Chip.make(3, "310P3").slice(VNpu(130, "vir02")))
    ('npu-3', 'npu-3-vnpu-130')
    """
    return naming.dra_device_name(chip.phys_id, chip.vnpu.vnpu_id if chip.vnpu is not None else None)


NPU_SMI_DOWN = "npu-smi-down"  # the taint value of a chip whose health is unknown


_VNPU_NAME = re.compile(r"(npu-[0-9]+)-(?:vnpu-[0-9]+|vir[0-9]{2}(?:-[0-9a-z]+)*-[0-9]{1,3})")


def overlap(first: str, second: str) -> bool:
    """Whether the devices named ``first`` and ``second`` share hardware: the same device, or a whole chip
    and a vNPU of it (two vNPUs of one chip do not).

    >>> overlap("npu-3", "npu-3"), overlap("npu-3", "npu-3-vnpu-130")
    (True, True)
    >>> overlap("npu-3-vnpu-130", "npu-3-vnpu-131")
    False
    >>> overlap("npu-3", "npu-30-vnpu-130")
    False
    """
    if first == second:
        return True
    chip_of_first, chip_of_second = chip_of(first), chip_of(second)
    return (chip_of_first == first and chip_of_second == first) or (
        chip_of_second == second and chip_of_first == second
    )


def chip_of(name: str) -> str:
    """The device name of the whole chip a device is part of: a vNPU's chip, else the device itself.

    >>> chip_of("npu-3-vnpu-130"), chip_of("npu-3")
    ('npu-3', 'npu-3')
    """
    found = _VNPU_NAME.fullmatch(name)
    return found.group(1) if found else name


def taint_key(driver: str) -> str:
    """The key of the health taint: ``<driver>/unhealthy``."""
    return f"{driver}/unhealthy"


# The taint effect of a chip's fault class, Huawei's name -> effect ("None": no taint); draFaultTaints in
# the config overrides any of them.
FAULT_TAINTS: Mapping[str, str] = {
    FaultClass.NOT_HANDLE.huawei: "None",
    FaultClass.SUB_HEALTH.huawei: "None",
    FaultClass.RESTART_REQUEST.huawei: "None",
    FaultClass.RESTART_BUSINESS.huawei: "None",
    FaultClass.FREE_RESTART_NPU.huawei: "NoSchedule",
    FaultClass.RESTART_NPU.huawei: "NoSchedule",
    FaultClass.PRE_SEPARATE_NPU.huawei: "NoSchedule",
    FaultClass.SEPARATE_NPU.huawei: "NoExecute",
}


def network_taint_key(driver: str) -> str:
    """The key of the network taint: ``<driver>/network-unhealthy``."""
    return f"{driver}/network-unhealthy"


LINK_DOWN = "link-down"  # the network taint's value


@dataclass(frozen=True, slots=True)
class DeviceTaints:
    """How a chip is tainted: the driver's key, the effect by its fault class (:data:`FAULT_TAINTS` with
    ``fault_effects`` over them, ``draFaultTaints``), and ``effect`` (``--dra-taint-effect``) for a chip
    Unhealthy or held for no fault class (a device node gone, the flap hold of a chip gone quiet, the
    admin's separation); a held chip whose own fault is still there keeps its class's effect. A
    chip whose health is unknown while npu-smi is down is only ``NoSchedule``: a tool's outage never evicts.
    A chip whose RoCE link is down (``network_fault``) gets ``<driver>/network-unhealthy`` as well,
    ``NoSchedule`` only: it still serves claims that tolerate it (a single-chip job); a vNPU never (it has
    no NIC of its own).

    >>> from ascend_agent.model import Health
    >>> chip = Chip.make(0, "910B3", fault_class=FaultClass.SEPARATE_NPU)
    >>> DeviceTaints("npu.huawei.com", "NoSchedule").for_chip(chip.with_health(Health.UNHEALTHY, "Alarm"))
    [{'key': 'npu.huawei.com/unhealthy', 'value': 'Alarm', 'effect': 'NoExecute'}]
    """

    driver: str
    effect: str
    fault_effects: tuple[tuple[str, str], ...] = ()

    def effect_of(self, fault_class: FaultClass) -> str:
        """The taint effect of a chip of ``fault_class``: NoSchedule, NoExecute, or None (no taint)."""
        return dict(self.fault_effects).get(fault_class.huawei, FAULT_TAINTS[fault_class.huawei])

    def for_chip(self, chip: Chip) -> list[dict[str, str]]:
        taints = self._health_taints(chip)
        if chip.network_fault and chip.vnpu is None:
            taints.append({"key": network_taint_key(self.driver), "value": LINK_DOWN, "effect": "NoSchedule"})
        return taints

    def _health_taints(self, chip: Chip) -> list[dict[str, str]]:
        if chip.health_unknown and not chip.held:
            if chip.healthy:
                return []
            return [{"key": taint_key(self.driver), "value": NPU_SMI_DOWN, "effect": "NoSchedule"}]
        by_class = self.effect_of(chip.fault_class) if chip.fault_class is not None else "None"
        if chip.healthy and not chip.held:
            if by_class == "None":
                return []
            reason = chip.fault_class.huawei if chip.fault_class is not None else "unhealthy"
            return [{"key": taint_key(self.driver), "value": taint_value(reason), "effect": by_class}]
        reason = "held" if chip.held else (chip.reason or "unhealthy")
        own = chip.fault_class is not None and chip.fault_class.unhealthy
        effect = by_class if own and by_class != "None" else self.effect
        return [{"key": taint_key(self.driver), "value": taint_value(reason), "effect": effect}]


def taint_value(reason: str) -> str:
    """A reason as a taint value (a label value: 63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both
    ends).

    >>> taint_value("npu-smi: Critical (80E3A203)")
    'npu-smi--Critical--80E3A203'
    """
    cleaned = _INVALID_VALUE.sub("-", reason)[:_MAX_TAINT_VALUE].strip("._-")
    return cleaned or "unhealthy"


def semver(version: str) -> str | None:
    """npu-smi's driver version as semantic version, where it is one.

    >>> semver("25.0.rc1.1"), semver("23.0.0"), semver("24.1.RC2"), semver("unknown")
    ('25.0.1-rc.1', '23.0.0', '24.1.0-rc.2', None)
    """
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:\.?[Rr][Cc](\d+))?(?:\.(\d+))?", version.strip())
    if match is None:
        return None
    major, minor, patch, rc, build = match.groups()
    if rc is None:
        return f"{major}.{minor}.{patch or 0}" + (f"+{build}" if build else "")
    # 25.0.rc1.1: the first patch of release candidate 1 of 25.0.
    return f"{major}.{minor}.{build or patch or 0}-rc.{rc}"


def _chip_ids(chips: Sequence[Chip]) -> dict[int, int]:
    """Phys id -> the chip's index within its NPU (A3: die 0 and 1 of one NPU id)."""
    ids: dict[int, int] = {}
    counters: dict[int, int] = {}
    for chip in sorted(chips, key=lambda c: c.phys_id):
        if chip.npu_id is not None:
            ids[chip.phys_id] = counters.get(chip.npu_id, 0)
            counters[chip.npu_id] = ids[chip.phys_id] + 1
    return ids


@dataclass(frozen=True, slots=True)
class NodeChips:
    """What a device's attributes need from the node's chips as a whole, worked out once per pool."""

    chip_ids: dict[int, int]  # phys id -> the chip's index within its NPU
    topology: Topology
    driver_version: str | None  # as a semantic version

    @classmethod
    def of(cls, chips: Sequence[Chip], driver_version: str | None) -> NodeChips:
        return cls(_chip_ids(chips), topology_for(chips), semver(driver_version) if driver_version else None)


def slice_device(chip: Chip, node: NodeChips, taints: DeviceTaints) -> dict[str, Any]:
    """One device of the slice: attributes Huawei's DeviceClasses select on (``deviceType``, ``physicId``),
    the topology (:func:`placement_attributes`, ``hccsRing`` on 910A, ``moduleId`` on A3), ``memory`` and
    ``aiCores``."""
    if chip.vnpu is not None:
        return _vnpu_device(chip, taints)
    attributes: dict[str, dict[str, Any]] = {
        "deviceType": {"string": f"Ascend{chip.model}"[:_MAX_STRING]},
        "physicId": {"int": chip.phys_id},
        "model": {"string": chip.model[:_MAX_STRING]},
        "generation": {"string": chip.generation.value},
    }
    if chip.npu_id is not None:
        attributes["npuId"] = {"int": chip.npu_id}
        chip_id = node.chip_ids.get(chip.phys_id)
        if chip_id is not None:
            attributes["chipId"] = {"int": chip_id}
    attributes.update(placement_attributes(chip))
    group = node.topology.group_of.get(chip.device_id)
    if group is not None and node.topology.layout is Layout.RINGS:
        attributes["hccsRing"] = {"int": group}
    elif group is not None and node.topology.layout is Layout.MODULES:
        attributes["moduleId"] = {"int": group}
    if node.driver_version is not None:
        attributes["driverVersion"] = {"version": node.driver_version}
    attributes.update(training_attributes(chip))
    capacity: dict[str, dict[str, str]] = {}
    if chip.hbm_mb:
        capacity["memory"] = {"value": _quantity(chip.hbm_mb)}
    cores = _AI_CORES.get(chip.model)
    if cores is not None:
        capacity["aiCores"] = {"value": str(cores)}
    return _device(chip, attributes, capacity, taints)


def placement_attributes(chip: Chip) -> dict[str, dict[str, Any]]:
    """Where the chip (or the vNPU's chip) sits, each where known: ``numaNode``, and Kubernetes' standard
    ``resource.kubernetes.io/pcieRoot`` and ``resource.kubernetes.io/numaNode`` (a node of -1, none, is not
    published).

    >>> placement_attributes(Chip.make(0, "310P3", numa_node=1, pcie_root="pci0000:80"))
    {'numaNode': {'int': 1}, 'resource.kubernetes.io/pcieRoot': {'string': 'pci0000:80'}, \
'resource.kubernetes.io/numaNode': {'int': 1}}
    >>> placement_attributes(Chip.make(0, "310P3"))
    {}
    """
    attributes: dict[str, dict[str, Any]] = {}
    if chip.numa_node is not None:
        attributes["numaNode"] = {"int": chip.numa_node}
    if chip.pcie_root is not None:
        attributes[STANDARD_PCIE_ROOT] = {"string": chip.pcie_root[:_MAX_STRING]}
    if chip.numa_node is not None and chip.numa_node >= 0:
        attributes[STANDARD_NUMA_NODE] = {"int": chip.numa_node}
    return attributes


def training_attributes(chip: Chip) -> dict[str, dict[str, Any]]:
    """What a distributed job's claim can match on: ``deviceIP`` (``127.0.0.1`` for a vNPU of a chip that
    has one), ``vnicIP`` and, on A3, ``superPodId``, ``serverIndex`` and ``sdid``; each only where the chip
    has it.

    >>> from ascend_agent.model import SuperPod
    >>> pod = SuperPod(sdid=167772160, size=384, super_pod_id=0, server_index=40)
    >>> sorted(training_attributes(Chip.make(0, "910_9392", device_ip="10.0.245.11", super_pod=pod)))
    ['deviceIP', 'sdid', 'serverIndex', 'superPodId']
    """
    attributes: dict[str, dict[str, Any]] = {}
    if chip.device_ip is not None and chip.rank_ip is not None and (ip := _address(chip.rank_ip)):
        attributes["deviceIP"] = {"string": ip}
    if chip.vnic_ip is not None and chip.vnpu is None and (ip := _address(chip.vnic_ip)):
        attributes["vnicIP"] = {"string": ip}
    if chip.super_pod is not None and chip.vnpu is None:
        attributes["superPodId"] = {"int": chip.super_pod.super_pod_id}
        attributes["serverIndex"] = {"int": chip.super_pod.server_index}
        attributes["sdid"] = {"int": chip.super_pod.sdid}
    return attributes


def _address(text: str) -> str | None:
    """``text`` as an address attribute holds it: the IP address alone, without an IPv6 zone, whichever
    backend gave it (``devfs`` strips the zone already; a zone longer than the 64 bytes the API server takes
    would make it refuse the whole slice); None for what is no IP address.

    >>> _address("2001:db8::5%eth0"), _address("10.0.0.1"), _address("10.0.0")
    ('2001:db8::5', '10.0.0.1', None)
    """
    try:
        return str(unzoned_address(text))
    except ValueError:
        return None


def _vnpu_device(part: Chip, taints: DeviceTaints) -> dict[str, Any]:
    """A vNPU as a device of its own: Huawei's vNPU type as ``deviceType``, its ``template``, ``vnpuId`` and
    ``parent`` (the chip's device name), capacity from the template; tainted as its chip and its own status
    make it (the backend folds both into its health)."""
    assert part.vnpu is not None
    attributes: dict[str, dict[str, Any]] = {
        "deviceType": {"string": part.vnpu_type[:_MAX_STRING]},
        "template": {"string": part.vnpu.template[:_MAX_STRING]},
        "parent": {"string": device_name(replace(part, vnpu=None))},
        "physicId": {"int": part.phys_id},
        "vnpuId": {"int": part.vnpu.vnpu_id},
        "model": {"string": part.model[:_MAX_STRING]},
        "generation": {"string": part.generation.value},
    }
    attributes.update(placement_attributes(part))
    attributes.update(training_attributes(part))
    capacity: dict[str, dict[str, str]] = {}
    if part.vnpu.aicore is not None:
        capacity["aiCores"] = {"value": str(part.vnpu.aicore)}
    if part.vnpu.memory_gb is not None:
        capacity["memory"] = {"value": f"{part.vnpu.memory_gb}Gi"}
    if part.vnpu.aicpu is not None:
        capacity["aiCpus"] = {"value": str(part.vnpu.aicpu)}
    return _device(part, attributes, capacity, taints)


def _device(
    chip: Chip, attributes: dict[str, Any], capacity: dict[str, dict[str, str]], taints: DeviceTaints
) -> dict[str, Any]:
    """A device of the slice: its name, attributes, capacity and taints (the last two left out when none)."""
    device: dict[str, Any] = {"name": device_name(chip), "attributes": attributes}
    if capacity:
        device["capacity"] = capacity
    chip_taints = taints.for_chip(chip)
    if chip_taints:
        device["taints"] = chip_taints
    return device


def _quantity(mib: int) -> str:
    """MiB as a Kubernetes quantity: ``64Gi`` when whole GiB, else ``<n>Mi``."""
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def pool_slices(inventory: Inventory, taints: DeviceTaints) -> list[dict[str, Any]]:
    """The ``spec`` of each slice of the node's pool past driver, node and pool (``devices``, or
    ``sharedCounters`` in slices of their own, at most 8 sets each, first), in order; one device slice
    unless there are more devices than one may hold. A chip split into vNPUs is published only as its
    vNPUs (never whole as well); a dynamic chip whole and as its template devices, all consuming its
    counters. Generation, names and counts are the publisher's."""
    node = NodeChips.of(tuple(sorted(inventory.chips, key=lambda c: c.phys_id)), inventory.driver_version)
    offers = {c.phys_id: chip_offer(c) for c in inventory.carvable}
    offers = {phys: offer for phys, offer in offers.items() if offer.counters}
    devices = []
    for chip in sorted(inventory.advertised, key=device_order):
        offer = offers.get(chip.phys_id)
        if offer is None:
            devices.append(slice_device(chip, node, taints))
        elif chip.vnpu is None:
            devices.extend(_dynamic_devices(chip, node, taints, offer))
    advanced = any("taints" in d or "consumesCounters" in d for d in devices)
    limit = MAX_DEVICES_WITH_TAINTS if advanced else MAX_DEVICES
    sets = [offers[phys].counter_set() for phys in sorted(offers)]
    counters = [
        {"sharedCounters": sets[i : i + MAX_COUNTER_SETS]} for i in range(0, len(sets), MAX_COUNTER_SETS)
    ]
    return counters + (
        [{"devices": devices[i : i + limit]} for i in range(0, len(devices), limit)] or [{"devices": []}]
    )


def _dynamic_devices(
    chip: Chip, node: NodeChips, taints: DeviceTaints, offer: ChipOffer
) -> list[dict[str, Any]]:
    """A dynamic chip: whole (consuming all its counters), then its template devices."""
    whole = slice_device(chip, node, taints)
    whole["consumesCounters"] = offer.whole_consumption()
    devices = [whole]
    chip_taints = taints.for_chip(chip)
    for template, needs, count in offer.templates:
        part = chip.slice(VNpu(0, template.name))
        attributes: dict[str, dict[str, Any]] = {
            "deviceType": {"string": part.vnpu_type[:_MAX_STRING]},
            "template": {"string": template.name[:_MAX_STRING]},
            "parent": {"string": whole["name"]},
            "physicId": {"int": chip.phys_id},
            "model": {"string": chip.model[:_MAX_STRING]},
            "generation": {"string": chip.generation.value},
        }
        attributes.update(placement_attributes(chip))
        capacity = {"aiCores": {"value": str(template.aicore)}}
        if template.memory_gb is not None:
            capacity["memory"] = {"value": f"{template.memory_gb}Gi"}
        if template.aicpu is not None:
            capacity["aiCpus"] = {"value": str(template.aicpu)}
        for index in range(count):
            device: dict[str, Any] = {
                "name": template_device_name(chip.phys_id, template.name, index),
                "attributes": attributes,
                "capacity": capacity,
                "consumesCounters": offer.consumption(needs),
            }
            if chip_taints:
                device["taints"] = chip_taints
            devices.append(device)
    return devices
