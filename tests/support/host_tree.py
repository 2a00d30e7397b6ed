"""A temporary host tree for the devfs backend: device files (regular files stand in for device nodes), sysfs
PCI devices (a directory under their PCIe root with its numa_node, linked from bus/pci/devices) and the driver
paths, laid out as on a real Ascend node under a --host-root."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

DRIVER_FILES = (
    "usr/local/Ascend/driver/lib64/libascend_hal.so",
    "usr/local/Ascend/driver/include/dcmi_interface_api.h",
    "usr/local/dcmi/libdcmi.so",
    "etc/ascend_install.info",
)


class HostTree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.dev = root / "dev"
        self.sys = root / "sys"
        self.dev.mkdir(parents=True, exist_ok=True)

    def add_chips(self, phys_ids: Iterable[int]) -> HostTree:
        for phys_id in phys_ids:
            (self.dev / f"davinci{phys_id}").write_text("")
        return self

    def add_management(self, names: Iterable[str] = ("davinci_manager", "devmm_svm", "hisi_hdc")) -> HostTree:
        for name in names:
            (self.dev / name).write_text("")
        return self

    def add_numa(self, bus_ids: Mapping[str, int], root: str = "pci0000:00") -> HostTree:
        """Each bus id a PCI device of NUMA node ``bus_ids[bus_id]`` under the PCIe root complex ``root``."""
        for bus_id, node in bus_ids.items():
            self.add_pci_device(bus_id, node, root)
        return self

    def add_pci_device(self, bus_id: str, numa_node: int, root: str) -> Path:
        """The device ``bus_id`` as sysfs has it: ``devices/<root>/<root port>/<bus id>`` with its
        ``numa_node``, linked from ``bus/pci/devices/<bus id>`` by a relative link; its directory."""
        name = bus_id.lower()
        directory = self.sys / "devices" / root / f"{root.removeprefix('pci')}:01.0" / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "numa_node").write_text(f"{numa_node}\n")
        self.link_pci_device(name, f"../../../{directory.relative_to(self.sys)}")
        return directory

    def link_pci_device(self, bus_id: str, target: str) -> HostTree:
        """``bus/pci/devices/<bus id>`` as a symbolic link to ``target``, whatever it is."""
        link = self.sys / "bus/pci/devices" / bus_id
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)
        return self

    def add_driver(self, version: str = "24.1.rc2", files: Iterable[str] = DRIVER_FILES) -> HostTree:
        info = self.root / "usr/local/Ascend/driver/version.info"
        info.parent.mkdir(parents=True, exist_ok=True)
        info.write_text(f"Version={version}\nascendhal_version=7.35.19\n")
        for name in files:
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        npu_smi = self.root / "usr/local/bin/npu-smi"
        npu_smi.parent.mkdir(parents=True, exist_ok=True)
        npu_smi.write_text("")
        return self
