"""The driver's device nodes under ``/dev``: which entries count (a chip's ``davinci<n>``, a vNPU's
``vdavinci<n>``, the management devices), the management devices every container gets, and the listing of
``/dev`` kept through a transient failure (out of descriptors or memory is not "no device nodes")::

    listing = DeviceListing(Path("/dev"))
    names = await listing.names()         # {"davinci0", "davinci_manager", ...}; listing.error says why not
    management_devices(names, is_310b=False)
"""

from __future__ import annotations

import errno
import logging
import re
from pathlib import Path

import aiofiles.os

from ascend_agent.backends.vnpu import VNPU_NODE
from ascend_agent.model import DeviceNode
from ascend_agent.observability import ProblemLog

log = logging.getLogger(__name__)

CHIP_NODE = re.compile(r"^davinci(\d+)$")
MANAGER = "davinci_manager"
# Shared management devices, handed to every container that gets a chip, each only if present.
_MANAGEMENT = (MANAGER, "devmm_svm", "hisi_hdc", "dvpp_cmdlist")
# 310B exposes its manager for containers under another name; it is mounted where the runtime expects it.
MANAGER_310B = "davinci_manager_docker"
# Listing /dev can fail for want of descriptors or memory; that is not "no device nodes".
TRANSIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})
SHORT_OF_RESOURCES = "the agent is out of file descriptors or memory; it tries again next health interval"


def is_device_name(name: str) -> bool:
    """The ``/dev`` entries whose appearance or loss changes what the node can offer."""
    return bool(CHIP_NODE.match(name) or VNPU_NODE.match(name)) or name in _MANAGEMENT or name == MANAGER_310B


def management_devices(nodes: set[str], is_310b: bool) -> tuple[DeviceNode, ...]:
    """The management devices among ``nodes``, as a container gets them."""
    devices = [DeviceNode(host_path=f"/dev/{name}", container_path=f"/dev/{name}") for name in _MANAGEMENT]
    if MANAGER_310B in nodes and (is_310b or MANAGER not in nodes):
        devices[0] = DeviceNode(host_path=f"/dev/{MANAGER_310B}", container_path=f"/dev/{MANAGER}")
    return tuple(device for device in devices if device.host_path.removeprefix("/dev/") in nodes)


class DeviceListing:
    """The device entries of ``dev_root``, as last listed."""

    def __init__(self, dev_root: Path) -> None:
        self.dev_root = dev_root
        self.last: set[str] = set()
        self.error: OSError | None = None
        self._log = ProblemLog()

    async def names(self) -> set[str]:
        """The device entries of /dev; the last known ones when listing fails for want of descriptors or
        memory (:attr:`error` says why), none when /dev is not there."""
        try:
            names = await aiofiles.os.listdir(self.dev_root)
        except OSError as exc:
            if exc.errno in TRANSIENT_ERRNOS:
                if self._log.changed(exc.errno):
                    log.warning("Cannot list %s (%s): keeping the last known device nodes",
                                self.dev_root, exc.strerror or exc)  # fmt: skip
                self.error = exc
                return self.last
            names = []
        if self._log.clear():
            log.info("Listing %s works again", self.dev_root)
        self.error = None
        self.last = {name for name in names if is_device_name(name)}
        return self.last
