"""The chips the kubelet says a pod holds on this node, for ``ascend-agent ranktable`` of a pod without
Volcano's configuration annotation (placed by the default scheduler, or holding chips through a DRA claim):
the pod's device IDs of the agent's resources in PodResources, or its claims' devices of the agent's DRA
driver, as the chips the backend finds::

    chips = await held_chips(settings, "team-a", "train-0")   # RankTableError when it cannot be told
    chips_held(inventory, holders, "team-a", "train-0", replicas=1, driver="npu.huawei.com")   # pure
"""

from __future__ import annotations

from collections.abc import Iterable

from ascend_agent import naming
from ascend_agent.backends import discover_once
from ascend_agent.cluster.ranktable import CONFIGURATION, RankTableError
from ascend_agent.config import Settings
from ascend_agent.kubelet.dra.partitions import template_device_of
from ascend_agent.kubelet.podresources import PodResourcesError, list_holders
from ascend_agent.model import Chip, Holder, Holders, Inventory, VNpu


async def held_chips(settings: Settings, namespace: str, pod: str) -> list[Chip]:
    """The chips of this node the kubelet's PodResources lists for the pod ``namespace/pod``, each with
    what the backend finds of it (device IP, super pod); :class:`RankTableError` when the kubelet cannot be
    asked."""
    try:
        holders = await list_holders(settings.pod_resources_socket)
    except PodResourcesError as exc:
        raise RankTableError(
            f"pod {namespace}/{pod} has no {CONFIGURATION} annotation, and which chips the kubelet gave it "
            f"cannot be told: {exc}"
        ) from None
    inventory = await discover_once(settings)
    return chips_held(inventory, holders, namespace, pod, settings.replicas, settings.dra_driver_name)


def chips_held(
    inventory: Inventory, holders: Holders, namespace: str, pod: str, replicas: int, driver: str
) -> list[Chip]:
    """The chips and vNPUs of ``inventory`` the pod holds: by the device IDs of ``huawei.com`` resources
    PodResources lists for it (a shared chip's replicas are its chip), and by the devices of ``driver`` its
    claims got (a template device carved at prepare is a vNPU of its chip).

    >>> inventory = Inventory((Chip.make(3, "910B3"), Chip.make(5, "910B3")))
    >>> holders = Holders({("huawei.com/Ascend910", "Ascend910-5"): (Holder("ns", "p", "main"),)})
    >>> [chip.device_id for chip in chips_held(inventory, holders, "ns", "p", 1, "npu.huawei.com")]
    ['Ascend910-5']
    """

    def mine(found: Iterable[Holder]) -> bool:
        return any(holder.namespace == namespace and holder.pod == pod for holder in found)

    ids = {
        device
        for (resource, device), found in holders.by_device.items()
        if resource.startswith(f"{naming.RESOURCE_DOMAIN}/") and mine(found)
    }
    claimed = {device for (by, device), found in holders.by_claimed.items() if by == driver and mine(found)}
    chips: dict[str, Chip] = {}
    for chip in inventory.advertised:
        shared = 1 if chip.vnpu is not None else replicas
        if ids.intersection(naming.replica_ids(chip.device_id, shared)):
            chips[chip.device_id] = chip
    whole = {chip.phys_id: chip for chip in inventory.chips}
    for chip in (*inventory.chips, *inventory.vnpus):
        vnpu_id = chip.vnpu.vnpu_id if chip.vnpu is not None else None
        if naming.dra_device_name(chip.phys_id, vnpu_id) in claimed:
            chips[chip.device_id] = chip
    for name in sorted(claimed):
        carved = template_device_of(name)
        if carved is not None and carved[0] in whole:
            chips[name] = whole[carved[0]].slice(VNpu(0, carved[1]))
    return list(chips.values())
