"""What Volcano's ``ascend-for-volcano`` plugin and ClusterD read from a node, built from an inventory: the
device-info ConfigMap's ``DeviceInfoCfg`` and the Node annotation ``baseDeviceInfos``. Pure functions, no I/O.

    >>> from ascend_agent.model import Health
    >>> chips = (Chip.make(0, "910B3"), Chip.make(1, "910B3").with_health(Health.UNHEALTHY))
    >>> lists = device_lists(Inventory(chips), since={}, now_ms=0)
    >>> lists["huawei.com/Ascend910"], lists["huawei.com/Ascend910-Unhealthy"]
    ('Ascend910-0', 'Ascend910-1')
    >>> go_json({"b": "<1>", "a": 2})
    '{"b":"\\\\u003c1\\\\u003e","a":2}'

Per resource ``T``: ``T`` the healthy chips, ``T-Unhealthy`` the Unhealthy ones (the backend's faults and
the chips an admin separates in the ConfigMap), ``T-Recovering`` the chips in the flap hold and those whose
health is unknown while npu-smi is down (out of service, but no fault: nothing is rescheduled for them),
``T-NetworkUnhealthy`` the chips whose RoCE link is down past the debounce (``Chip.network_fault``;
written even when empty: Volcano drops a node for distributed jobs without it) and, for 910/A3/950,
``T-Fault``: one object per Unhealthy chip and per chip with a fault class, with its codes, its class and each
code's class.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ascend_agent.faultclass import FaultClass
from ascend_agent.model import UNKNOWN_SUPER_POD, Chip, Generation, Inventory

NAMESPACE = "kube-system"
NAME_PREFIX = "mindx-dl-deviceinfo-"
# Volcano's and ClusterD's informers list ConfigMaps with this label only.
CONSUMER_LABEL = "mx-consumer-cim"
DEVICE_INFO_KEY = "DeviceInfoCfg"
SEPARATED_KEY = "ManuallySeparateNPU"
UPGRADE_FAULT_KEY = "UpgradeFaultReason"
DESCRIPTION_KEY = "Description"
BASE_DEVICE_INFOS = "baseDeviceInfos"
# SuperPodID, ServerIndex of a node that is not part of a super pod (every model but A3), as Huawei writes.
UNKNOWN_INDEX = UNKNOWN_SUPER_POD

_FAULT_LISTS = frozenset(
    {Generation.ASCEND910A, Generation.ASCEND910B, Generation.ASCEND910A3, Generation.ASCEND950}
)
_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def configmap_name(node: str) -> str:
    return NAME_PREFIX + node


def go_json(value: Any) -> str:
    """``value`` as Go's ``json.Marshal`` writes it: no spaces, non-ASCII as UTF-8, ``<>&`` (and U+2028/9)
    escaped. Keys keep their order: pass Go maps with sorted keys, Go structs in their fields' order."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return "".join(_GO_ESCAPES.get(char, char) for char in text)


def check_code(device_info: Mapping[str, Any]) -> str:
    """The lowercase hex SHA-256 of ``DeviceInfo`` as Go marshals it."""
    return hashlib.sha256(go_json(device_info).encode()).hexdigest()


def separated_ids(text: str) -> frozenset[str]:
    """The device IDs of a ``ManuallySeparateNPU`` value: comma-joined, blanks ignored.

    >>> sorted(separated_ids(" Ascend910-3, ,Ascend910-0 "))
    ['Ascend910-0', 'Ascend910-3']
    """
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def device_lists(
    inventory: Inventory, since: Mapping[str, int], now_ms: int, separated: frozenset[str] = frozenset()
) -> dict[str, str]:
    """``DeviceList``, keys sorted as Go writes a map. ``since`` holds when each Unhealthy chip was first seen
    so (Unix ms) for ``fault_time``; a chip not in it gets ``now_ms``. A ``separated`` chip is Unhealthy even
    while the flap hold has it."""
    lists: dict[str, str] = {}
    for resource, chips in inventory.by_resource().items():
        ordered = sorted(chips, key=lambda chip: chip.phys_id)
        unhealthy = [chip for chip in ordered if _out(chip, separated)]
        lists[resource] = _ids(chip for chip in ordered if chip.healthy)
        lists[f"{resource}-Unhealthy"] = _ids(unhealthy)
        lists[f"{resource}-NetworkUnhealthy"] = _ids(c for c in ordered if c.network_fault and c.vnpu is None)
        held = (chip for chip in ordered if (chip.held or chip.health_unknown) and chip not in unhealthy)
        lists[f"{resource}-Recovering"] = _ids(held)
        if ordered[0].generation in _FAULT_LISTS:
            faulty = [chip for chip in ordered if chip in unhealthy or chip.fault_class is not None]
            faults = [
                _fault(chip, since.get(chip.device_id, now_ms), chip in unhealthy, separated)
                for chip in faulty
            ]
            lists[f"{resource}-Fault"] = go_json(faults)
    return dict(sorted(lists.items()))


def device_info_cfg(
    device_list: Mapping[str, str],
    update_time: int,
    super_pod: tuple[int, int] = (UNKNOWN_INDEX, UNKNOWN_INDEX),
) -> str:
    """The ``DeviceInfoCfg`` value (``NodeDeviceInfoCache``) of ``device_list`` written at ``update_time``
    (Unix seconds), with the node's ``super_pod`` (id, server index; :func:`node_super_pod`)."""
    info = {"DeviceList": dict(sorted(device_list.items())), "UpdateTime": update_time}
    return go_json(
        {
            "DeviceInfo": info,
            "SuperPodID": super_pod[0],
            "ServerIndex": super_pod[1],
            "CheckCode": check_code(info),
        }
    )


def node_super_pod(inventory: Inventory) -> tuple[int, int]:
    """The node's super-pod id and server index (:attr:`Inventory.super_pod`); -2 and -2 on other nodes.

    >>> from ascend_agent.model import SuperPod
    >>> chip = Chip.make(1, "910_9392", super_pod=SuperPod(sdid=7, size=384, super_pod_id=3, server_index=40))
    >>> node_super_pod(Inventory((Chip.make(0, "910_9392"), chip))), node_super_pod(Inventory())
    ((3, 40), (-2, -2))
    """
    super_pod = inventory.super_pod
    if super_pod is None:
        return UNKNOWN_INDEX, UNKNOWN_INDEX
    return super_pod.super_pod_id, super_pod.server_index


def base_device_infos(inventory: Inventory) -> str:
    """The ``baseDeviceInfos`` annotation: every chip's device ID (healthy or not) with its device IP (empty
    when it has none) and its super-pod device ID (the A3 die's SDID; 0 where there is none)."""
    chips = {chip.device_id: chip for chip in inventory.chips}
    return go_json(
        {
            device_id: {
                "IP": chips[device_id].device_ip or "",
                "SuperDeviceID": sdid.sdid if (sdid := chips[device_id].super_pod) is not None else 0,
            }
            for device_id in sorted(chips)
        }
    )


def _out(chip: Chip, separated: frozenset[str]) -> bool:
    """Unhealthy for a fault of its own: not for the flap hold, nor for an npu-smi that cannot be asked."""
    return chip.device_id in separated or not (chip.healthy or chip.held or chip.health_unknown)


def _ids(chips: Any) -> str:
    return ",".join(chip.device_id for chip in chips)


def _fault(chip: Chip, since_ms: int, out: bool, separated: frozenset[str]) -> dict[str, Any]:
    """One ``T-Fault`` entry, fields in the order of Huawei's struct. Its level and handling are the chip's
    fault class; a chip out of service for no class of that weight (a separated chip, a device node gone,
    a Health column with no code) is ``SeparateNPU``. Each code has its own class in the map."""
    level = chip.fault_class
    if chip.device_id in separated or (out and (level is None or not level.unhealthy)):
        level = FaultClass.SEPARATE_NPU
    assert level is not None  # a chip here is out, or has a class
    codes = {
        fault.code.upper(): level if fault.fault_class is None else fault.fault_class for fault in chip.faults
    }
    return {
        "fault_type": "CardUnhealthy",
        "npu_name": chip.device_id,
        "large_model_fault_level": level.huawei,
        "fault_level": level.huawei,
        "fault_handling": level.huawei,
        "fault_code": ",".join(sorted(codes)),
        "fault_time_and_level_map": {
            code: {"fault_time": since_ms, "fault_level": codes[code].huawei} for code in sorted(codes)
        },
    }
