"""What every container gets besides its chips, as the backends build it for their inventory."""

from __future__ import annotations

from collections.abc import Sequence

from ascend_agent.config import ASCEND_RUNTIME_MODE
from ascend_agent.model import ContainerBase, DeviceNode, HostMount


def container_base(
    mode: str, management_devices: Sequence[DeviceNode], driver_mounts: Sequence[str] = ()
) -> ContainerBase:
    """The management devices and driver mounts (at the same path inside), none in ``ascend-runtime`` mode.

    >>> container_base("ascend-runtime", [DeviceNode("/dev/davinci_manager", "/dev/davinci_manager")])
    ContainerBase(devices=(), mounts=(), chip_nodes=False, cdi=False)
    """
    if mode == ASCEND_RUNTIME_MODE:
        return ContainerBase(chip_nodes=False)
    return ContainerBase(
        devices=tuple(management_devices),
        mounts=tuple(HostMount(host_path=path, container_path=path) for path in driver_mounts),
    )
