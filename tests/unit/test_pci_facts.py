"""Each chip's NUMA node and PCIe root read from sysfs (backends/pci.py, the devfs backend): the root as
Kubernetes' standard attribute derives it from the bus/pci/devices link, on a real file tree with a fake
npu-smi; a chip whose PCI address cannot be read has neither, said once however often npu-smi is asked."""

from __future__ import annotations

import logging
import posixpath
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_agent.backends.devfs import DevfsBackend
from ascend_agent.backends.pci import PciAddressError, pcie_root, sysfs_bus_id
from ascend_agent.config import Settings
from ascend_agent.kubelet.dra.devices import STANDARD_NUMA_NODE, STANDARD_PCIE_ROOT, DeviceTaints, pool_slices
from tests.support import FIXTURES
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi

# The 910B4 capture, chip 6 without a bus id (as npu-smi prints a chip it cannot read) and chip 7's with a
# domain of 8 digits: a PCI address sysfs never names a device by.
B4_INFO = (
    (FIXTURES / "910B4x8-25.0.rc1.1-info.txt")
    .read_text()
    .replace("0000:41:00.0", "NA          ")
    .replace("0000:42:00.0", "00000000:42:00.0")
)
C1_LINK = "../../../devices/pci0000:80/0000:80:01.0/0000:c1:00.0"


def _host(root: Path) -> HostTree:
    """Chip 0 as sysfs lays it out, and what can be wrong with the others' entries."""
    host = HostTree(root).add_driver().add_management().add_chips(range(8))
    (host.sys / "devices/pci0000:80/0000:80:01.0/0000:c1:00.0").mkdir(parents=True)
    (host.sys / "devices/pci0000:80/0000:80:01.0/0000:c1:00.0/numa_node").write_text("1\n")
    host.link_pci_device("0000:c1:00.0", C1_LINK)
    # chip 1 (0000:C2:00.0): no entry at all
    host.link_pci_device("0000:81:00.0", "../../../devices/platform/soc/0000:81:00.0")
    host.link_pci_device("0000:82:00.0", "../../../devices/pci0000:80/0000:80:02.0/0000:83:00.0")
    host.add_pci_device("0000:01:00.0", -1, "pci0000:00")  # no NUMA affinity, as on a one-socket host
    (host.sys / "bus/pci/devices/0000:02:00.0").mkdir()  # a directory where sysfs has a link
    (host.sys / "bus/pci/devices/0000:02:00.0/numa_node").write_text("0\n")
    return host


async def test_the_root_and_numa_node_come_from_sysfs_and_a_chip_without_either_is_said_once(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host = _host(short_dir / "host")
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", B4_INFO)
    backend = DevfsBackend(Settings(host_root=host.root, npu_smi=str(npu_smi.path), network_health=False))
    with caplog.at_level(logging.INFO, logger="ascend_agent"):
        for _ in range(3):
            await backend.query()
            inventory = await backend.discover()
    assert [(chip.numa_node, chip.pcie_root) for chip in inventory.chips] == [
        (1, "pci0000:80"),
        *[(None, None)] * 3,
        (None, "pci0000:00"),
        (0, None),  # its entry is there, but no link: its NUMA node still counts
        *[(None, None)] * 2,
    ]
    said = [r.getMessage() for r in caplog.records if "resource.kubernetes.io/pcieRoot" in r.getMessage()]
    entry = host.sys / "bus/pci/devices"
    neither = "its NUMA node and PCIe root are unknown, so its DRA devices leave out the standard attributes "
    neither += "resource.kubernetes.io/pcieRoot and resource.kubernetes.io/numaNode"
    no_root = "its PCIe root is unknown, so its DRA devices leave out the standard attribute "
    no_root += "resource.kubernetes.io/pcieRoot"
    assert sorted(said) == sorted(
        f"Chip {phys_id}: {reason}; {gap}"
        for phys_id, reason, gap in [
            (1, f"{entry}/0000:c2:00.0 does not exist (sysRoot {host.sys} must be the host's /sys)", neither),
            (2, f"{entry}/0000:81:00.0: it links to ../../../devices/platform/soc/0000:81:00.0, not under "
                "devices/pci", no_root),
            (3, f"{entry}/0000:82:00.0: it links to ../../../devices/pci0000:80/0000:80:02.0/0000:83:00.0, "
                "which does not end with 0000:82:00.0", no_root),
            (5, f"{entry}/0000:02:00.0 is not a symbolic link", no_root),
            (6, "npu-smi gives no bus id for it", neither),
            (7, "bus id '00000000:42:00.0' is not a PCI address like 0000:c1:00.0", neither),
        ]
    ), "one line per chip, none for a chip whose only gap is its NUMA node"  # fmt: skip

    (spec,) = pool_slices(inventory, DeviceTaints("npu.huawei.com", "NoSchedule"))
    standard = {
        device["name"]: {
            k: v for k, v in device["attributes"].items() if k.startswith("resource.kubernetes.io/")
        }
        for device in spec["devices"]
    }
    assert standard == {
        "npu-0": {STANDARD_PCIE_ROOT: {"string": "pci0000:80"}, STANDARD_NUMA_NODE: {"int": 1}},
        "npu-4": {STANDARD_PCIE_ROOT: {"string": "pci0000:00"}},
        "npu-5": {STANDARD_NUMA_NODE: {"int": 0}},
        **{f"npu-{i}": {} for i in (1, 2, 3, 6, 7)},
    }


async def test_the_host_tree_lays_out_sysfs_as_the_kernel_does(short_dir: Path) -> None:
    """``HostTree.add_numa``, which the end-to-end tests use, makes entries the backend reads whole."""
    bus_ids = {"0000:C1:00.0": 1, "0000:01:00.0": 0}
    host = HostTree(short_dir / "host").add_driver().add_management().add_chips(range(8)).add_numa(bus_ids)
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
    backend = DevfsBackend(Settings(host_root=host.root, npu_smi=str(npu_smi.path), network_health=False))
    await backend.query()
    chips = {chip.bus_id: chip for chip in (await backend.discover()).chips}
    assert [(chips[bus].numa_node, chips[bus].pcie_root) for bus in bus_ids] == [
        (1, "pci0000:00"),
        (0, "pci0000:00"),
    ]


_HEX = "0123456789abcdef"
_BUS_IDS = st.builds(
    "{}:{}:{}.{}".format,
    st.text(_HEX, min_size=4, max_size=4),
    st.text(_HEX, min_size=2, max_size=2),
    st.text(_HEX, min_size=2, max_size=2),
    st.sampled_from(_HEX),
)


@given(bus_id=_BUS_IDS, domain=st.text(_HEX, min_size=4, max_size=4), bridges=st.lists(_BUS_IDS, max_size=4))
def test_the_root_is_the_first_element_under_devices(bus_id: str, domain: str, bridges: list[str]) -> None:
    root = f"pci{domain}:{bus_id[5:7]}"
    path = "/".join(["devices", root, *bridges, bus_id])
    assert pcie_root(bus_id, f"../../../{path}") == root
    assert pcie_root(bus_id, f"/sys/{path}") == root, "an absolute link, from the sys root"
    assert pcie_root(bus_id, f"/host/sys/{path}", "/host/sys") == root


_SEGMENTS = st.sampled_from(["..", ".", "", "sys", "devices", "pci0000:80", "platform", "0000:c1:00.0", "x"])


@given(
    bus_id=st.sampled_from(["0000:c1:00.0", "0000:80:01.0"]),
    link=st.lists(_SEGMENTS, max_size=8).map("/".join) | st.text(max_size=60),
)
def test_any_link_gives_a_root_it_holds_or_says_why(bus_id: str, link: str) -> None:
    try:
        root = pcie_root(bus_id, link)
    except PciAddressError as exc:
        assert str(exc).startswith("it links to ")
        return
    assert root.startswith("pci") and "/" not in root
    assert root in link.split("/") and posixpath.basename(posixpath.normpath(link)) == bus_id


@given(text=st.text(max_size=20) | _BUS_IDS.map(str.upper))
def test_a_bus_id_is_an_extended_bdf_in_lower_case_or_refused(text: str) -> None:
    try:
        name = sysfs_bus_id(text)
    except PciAddressError as exc:
        assert "is not a PCI address like 0000:c1:00.0" in str(exc)
        return
    assert name == text.lower() and len(name) == 12
