"""A chip's place on the PCI bus as sysfs shows it: its NUMA node and the PCIe root complex it hangs under,
what Kubernetes' standard DRA attributes ``resource.kubernetes.io/numaNode`` and
``resource.kubernetes.io/pcieRoot`` carry. The root is read as Kubernetes' own drivers read it: from where
``<sys>/bus/pci/devices/<bus id>`` links to::

    facts = await read_pci_facts(Path("/sys"), "0000:C1:00.0")
    facts.numa_node, facts.pcie_root    # (1, 'pci0000:80')
"""

from __future__ import annotations

import errno
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

import aiofiles
import aiofiles.os

from ascend_agent.backends.devnodes import TRANSIENT_ERRNOS

# An extended BDF in lower case, as sysfs names PCI devices: domain:bus:device.function.
_BUS_ID = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")
_DEVICES = "bus/pci/devices"


@dataclass(frozen=True, slots=True)
class PciFacts:
    """A chip's NUMA node (None where the kernel gives it none: sysfs's -1) and its PCIe root complex
    (``pci0000:80``); None each where not known, and why the root is not (the device's entry is there but
    its link says no root: the NUMA node still counts)."""

    numa_node: int | None = None
    pcie_root: str | None = None
    root_problem: str = ""


UNKNOWN = PciFacts()


class PciAddressError(Exception):
    """Why a device's PCI address cannot be read from sysfs, in words for a log line."""


def sysfs_bus_id(bus_id: str) -> str:
    """``bus_id`` as sysfs names the device (npu-smi prints upper case); :class:`PciAddressError` when it is
    no extended BDF.

    >>> sysfs_bus_id("0000:C1:00.0")
    '0000:c1:00.0'
    >>> sysfs_bus_id("C1:00.0")
    Traceback (most recent call last):
    ...
    ascend_agent.backends.pci.PciAddressError: bus id 'C1:00.0' is not a PCI address like 0000:c1:00.0
    """
    lowered = bus_id.lower()
    if _BUS_ID.fullmatch(lowered) is None:
        raise PciAddressError(f"bus id {bus_id[:40]!r} is not a PCI address like 0000:c1:00.0")
    return lowered


def pcie_root(bus_id: str, link: str, sys_root: str = "/sys") -> str:
    """The PCIe root complex of the device ``bus_id`` (as :func:`sysfs_bus_id` gives it) whose
    ``<sys_root>/bus/pci/devices/<bus_id>`` links to ``link``: the first element after ``devices/`` of the
    path the link resolves to (a relative link from its own directory, by its text alone), which must be
    under ``devices/pci`` and end with the bus id; :class:`PciAddressError` otherwise.

    >>> pcie_root("0000:c1:00.0", "../../../devices/pci0000:80/0000:80:01.0/0000:c1:00.0")
    'pci0000:80'
    >>> pcie_root("0000:c1:00.0", "../../../devices/platform/0000:c1:00.0")
    Traceback (most recent call last):
    ...
    ascend_agent.backends.pci.PciAddressError: it links to ../../../devices/platform/0000:c1:00.0, not \
under devices/pci
    """
    if posixpath.isabs(link):
        resolved = posixpath.relpath(posixpath.normpath(link), posixpath.normpath(sys_root))
    else:
        resolved = posixpath.normpath(posixpath.join(_DEVICES, link))
    shown = link[:200]
    if not resolved.startswith("devices/pci"):
        raise PciAddressError(f"it links to {shown}, not under devices/pci")
    parts = resolved.split("/")
    if parts[-1] != bus_id:
        raise PciAddressError(f"it links to {shown}, which does not end with {bus_id}")
    return parts[1]


async def read_pci_facts(sys_root: Path, bus_id: str) -> PciFacts:
    """The NUMA node and PCIe root of the device npu-smi gives ``bus_id`` for. :class:`PciAddressError` says
    why its PCI address cannot be read (then neither is known); an entry whose link gives no root keeps its
    NUMA node and says why in ``root_problem``. An :class:`OSError` is raised only for what may pass (out of
    descriptors or memory). An unreadable ``numa_node`` is sysfs's own -1."""
    name = sysfs_bus_id(bus_id)
    entry = sys_root / _DEVICES / name
    try:
        link = await aiofiles.os.readlink(str(entry))
    except OSError as exc:
        if exc.errno in TRANSIENT_ERRNOS:
            raise
        if exc.errno == errno.ENOENT:
            raise PciAddressError(
                f"{entry} does not exist (sysRoot {sys_root} must be the host's /sys)"
            ) from None
        if exc.errno != errno.EINVAL:
            raise PciAddressError(f"cannot read {entry}: {exc.strerror or exc}") from None
        return PciFacts(await _numa_node(entry / "numa_node"), None, f"{entry} is not a symbolic link")
    numa_node = await _numa_node(entry / "numa_node")
    try:
        return PciFacts(numa_node, pcie_root(name, link, str(sys_root)))
    except PciAddressError as exc:
        return PciFacts(numa_node, None, f"{entry}: {exc}")


async def _numa_node(path: Path) -> int | None:
    try:
        async with aiofiles.open(path) as handle:
            node = int((await handle.read()).strip())
    except OSError as exc:
        if exc.errno in TRANSIENT_ERRNOS:
            raise
        return None
    except ValueError:
        return None
    return node if node >= 0 else None
