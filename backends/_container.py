"""What a container gets for a set of chips, shared by every backend."""

from __future__ import annotations

from collections.abc import Sequence

from ascend_agent import naming
from ascend_agent.config import ASCEND_RUNTIME_MODE
from ascend_agent.model import Chip, ContainerSpec, DeviceNode, HostMount

VISIBLE_DEVICES_ENV = "ASCEND_VISIBLE_DEVICES"
RUNTIME_OPTIONS_ENV = "ASCEND_RUNTIME_OPTIONS"
# What Ascend Docker Runtime reads as "the visible devices are vNPUs".
VIRTUAL = "VIRTUAL"


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

    A vNPU is its ID for Ascend Docker Runtime, and its ``/dev/vdavinci<id>`` node seen as
    ``/dev/davinci<id>``:

    >>> from ascend_agent.model import VNpu
    >>> part = Chip.make(1, "310P3").slice(VNpu(116, "vir04"))
    >>> spec = container_spec([part], mode="plain", management_devices=[])
    >>> spec.envs
    {'ASCEND_VISIBLE_DEVICES': '116', 'ASCEND_RUNTIME_OPTIONS': 'VIRTUAL'}
    >>> [(d.host_path, d.container_path) for d in spec.devices]
    [('/dev/vdavinci116', '/dev/davinci116')]
    """
    ordered = sorted(chips, key=lambda chip: (chip.phys_id, chip.vnpu.vnpu_id if chip.vnpu else -1))
    virtual = any(chip.vnpu is not None for chip in ordered)
    envs = {
        VISIBLE_DEVICES_ENV: ",".join(
            str(chip.vnpu.vnpu_id if chip.vnpu else chip.phys_id) for chip in ordered
        ),
        RUNTIME_OPTIONS_ENV: VIRTUAL if virtual else "",
    }
    if mode == ASCEND_RUNTIME_MODE:
        return ContainerSpec(envs=envs)
    chip_nodes = [
        DeviceNode(host_path=chip.device_path, container_path=_container_path(chip)) for chip in ordered
    ]
    return ContainerSpec(
        envs=envs,
        devices=(*chip_nodes, *management_devices),
        mounts=tuple(HostMount(host_path=path, container_path=path) for path in driver_mounts),
    )


def _container_path(chip: Chip) -> str:
    """Where the container sees the device: a vNPU's ``/dev/vdavinci<id>`` as ``/dev/davinci<id>``."""
    return naming.device_path(chip.vnpu.vnpu_id) if chip.vnpu is not None else chip.device_path
