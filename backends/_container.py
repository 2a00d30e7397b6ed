"""What a container gets for a set of chips, shared by every backend."""

from __future__ import annotations

from collections.abc import Sequence

from ascend_agent.config import ASCEND_RUNTIME_MODE
from ascend_agent.model import Chip, ContainerSpec, DeviceNode, HostMount

VISIBLE_DEVICES_ENV = "ASCEND_VISIBLE_DEVICES"
RUNTIME_OPTIONS_ENV = "ASCEND_RUNTIME_OPTIONS"


def container_spec(
    chips: Sequence[Chip],
    *,
    mode: str,
    management_devices: Sequence[DeviceNode],
    driver_mounts: Sequence[str] = (),
) -> ContainerSpec:
    """The environment, device nodes and mounts for ``chips``, all with host paths.

    >>> spec = container_spec([Chip.make(1, "910B4"), Chip.make(0, "910B4")], mode="plain",
    ...                       management_devices=[DeviceNode("/dev/davinci_manager", "/dev/davinci_manager")])
    >>> spec.envs["ASCEND_VISIBLE_DEVICES"], [d.host_path for d in spec.devices]
    ('0,1', ['/dev/davinci0', '/dev/davinci1', '/dev/davinci_manager'])
    """
    ordered = sorted(chips, key=lambda chip: chip.phys_id)
    envs = {
        VISIBLE_DEVICES_ENV: ",".join(str(chip.phys_id) for chip in ordered),
        RUNTIME_OPTIONS_ENV: "",
    }
    if mode == ASCEND_RUNTIME_MODE:
        return ContainerSpec(envs=envs)
    chip_nodes = [DeviceNode(host_path=chip.device_path, container_path=chip.device_path) for chip in ordered]
    return ContainerSpec(
        envs=envs,
        devices=(*chip_nodes, *management_devices),
        mounts=tuple(HostMount(host_path=path, container_path=path) for path in driver_mounts),
    )
