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
# What Ascend Docker Runtime reads as "the visible devices are vNPUs".
VIRTUAL = "VIRTUAL"


def container_spec(chips: Sequence[Chip], base: ContainerBase) -> ContainerSpec:
    """The environment, device nodes, mounts and CDI device names for ``chips``, all with host paths.

    A vNPU is its ID for Ascend Docker Runtime, and its ``/dev/vdavinci<id>`` node seen as
    ``/dev/davinci<id>``:

    >>> from ascend_agent.model import VNpu
    >>> spec = container_spec([Chip.make(1, "310P3").slice(VNpu(116, "vir04"))], ContainerBase())
    >>> spec.envs
    {'ASCEND_VISIBLE_DEVICES': '116', 'ASCEND_RUNTIME_OPTIONS': 'VIRTUAL'}
    >>> [(d.host_path, d.container_path) for d in spec.devices]
    [('/dev/vdavinci116', '/dev/davinci116')]
    """
    ordered = sorted(chips, key=device_order)
    envs = {
        VISIBLE_DEVICES_ENV: ",".join(
            str(chip.vnpu.vnpu_id if chip.vnpu else chip.phys_id) for chip in ordered
        ),
        RUNTIME_OPTIONS_ENV: VIRTUAL if any(chip.vnpu is not None for chip in ordered) else "",
    }
    cdi_devices = tuple(naming.cdi_device_name(chip.device_id) for chip in ordered) if base.cdi else ()
    if not base.chip_nodes:
        return ContainerSpec(envs=envs, cdi_devices=cdi_devices)
    chip_nodes = [
        DeviceNode(host_path=chip.device_path, container_path=_container_path(chip)) for chip in ordered
    ]
    return ContainerSpec(
        envs=envs, devices=(*chip_nodes, *base.devices), mounts=base.mounts, cdi_devices=cdi_devices
    )


def device_order(chip: Chip) -> tuple[int, int]:
    """Chips by physical id, each vNPU after the chip it is part of, by vNPU id."""
    return (chip.phys_id, chip.vnpu.vnpu_id if chip.vnpu is not None else -1)


def _container_path(chip: Chip) -> str:
    """Where the container sees the device: a vNPU's ``/dev/vdavinci<id>`` as ``/dev/davinci<id>``."""
    return naming.device_path(chip.vnpu.vnpu_id) if chip.vnpu is not None else chip.device_path
