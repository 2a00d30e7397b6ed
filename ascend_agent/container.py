"""What a container gets for a set of chips: a pure function of the chips and the node's
:class:`~ascend_agent.model.ContainerBase`, from memory (it runs inside Allocate).

>>> base = ContainerBase(devices=(DeviceNode("/dev/davinci_manager", "/dev/davinci_manager"),))
>>> spec = container_spec([Chip.make(1, "910B4"), Chip.make(0, "910B4")], base)
>>> spec.envs["ASCEND_VISIBLE_DEVICES"], [d.host_path for d in spec.devices]
('0,1', ['/dev/davinci0', '/dev/davinci1', '/dev/davinci_manager'])
"""

from __future__ import annotations

from collections.abc import Sequence

from ascend_agent import naming
from ascend_agent.model import Chip, ContainerBase, ContainerSpec, DeviceNode

VISIBLE_DEVICES_ENV = "ASCEND_VISIBLE_DEVICES"
RUNTIME_OPTIONS_ENV = "ASCEND_RUNTIME_OPTIONS"


def container_spec(chips: Sequence[Chip], base: ContainerBase) -> ContainerSpec:
    """The environment, device nodes, mounts and CDI device names for ``chips``, all with host paths."""
    ordered = sorted(chips, key=lambda chip: chip.phys_id)
    envs = {
        VISIBLE_DEVICES_ENV: ",".join(str(chip.phys_id) for chip in ordered),
        RUNTIME_OPTIONS_ENV: "",
    }
    cdi_devices = tuple(naming.cdi_device_name(chip.device_id) for chip in ordered) if base.cdi else ()
    if not base.chip_nodes:
        return ContainerSpec(envs=envs, cdi_devices=cdi_devices)
    chip_nodes = [DeviceNode(host_path=chip.device_path, container_path=chip.device_path) for chip in ordered]
    return ContainerSpec(
        envs=envs, devices=(*chip_nodes, *base.devices), mounts=base.mounts, cdi_devices=cdi_devices
    )
