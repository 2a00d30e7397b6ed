"""vNPUs on a devfs node whose fake npu-smi answers the shared samples: the resources and device IDs, whole
chips that hold vNPUs gone from the chip resource, Allocate, and vNPUs created and destroyed while the agent
runs, seen by the kubelet without a restart."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.agent_process import AgentProcess
from tests.support.cli import run_cli
from tests.support.host_tree import HostTree
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.vnpu_node import (
    INFO_VNPU_NONE,
    INFO_VNPU_TWO,
    NOT_SUPPORTED,
    TEMPLATE_INFO,
    info_310p,
    wait_gone,
)

CHIPS = "huawei.com/Ascend310P"
FOUR = "huawei.com/Ascend310P-4c"
TWO = "huawei.com/Ascend310P-2c"


@pytest.fixture
def npu_smi(short_dir: Path, host: HostTree) -> FakeNpuSmi:
    """Chips 0, 1, 2: chip 0 without vNPU support, chip 1 with the two-vNPU sample, chip 2 with none."""
    host.add_chips([0, 1, 2])
    fake = FakeNpuSmi(short_dir / "npu-smi")
    fake.set_output("info", info_310p([0, 1, 2]))
    fake.set_error("info -t info-vnpu -i 0 -c 0", NOT_SUPPORTED)
    fake.set_output("info -t info-vnpu -i 1 -c 0", INFO_VNPU_TWO)
    fake.set_output("info -t info-vnpu -i 2 -c 0", INFO_VNPU_NONE)
    fake.set_output("info -t template-info -i 1", TEMPLATE_INFO)
    return fake


def _add_vnpu_nodes(host: HostTree, ids: list[int]) -> None:
    for vnpu_id in ids:
        (host.dev / f"vdavinci{vnpu_id}").write_text("")


def test_list_shows_the_samples_vnpus_under_their_chip(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    _add_vnpu_nodes(host, [116, 117])
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "list", "--backend", "devfs", "--host-root", str(host.root),
         "--npu-smi", str(npu_smi.path), "--json"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", "a chip without vNPU support is a plain chip, quietly"
    rows = {row["phys_id"]: row for row in json.loads(result.stdout)}
    assert rows[0]["vnpus"] == [] and rows[2]["vnpus"] == []
    assert [(v["id"], v["resource"], v["template"], v["aicore"], v["memory_gb"], v["device"])
            for v in rows[1]["vnpus"]] == [
        ("Ascend310P-4c-116-1", FOUR, "vir04", 4, 12, "/dev/vdavinci116"),
        ("Ascend310P-2c-117-1", TWO, "vir02", 2, 6, "/dev/vdavinci117"),
    ]  # fmt: skip
    assert [v["container_id"] for v in rows[1]["vnpus"]] == ["3f2a9c1d7b4e", None]
    assert {v["health"] for v in rows[1]["vnpus"]} == {"Healthy"}
    table = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "list", "--backend", "devfs", "--host-root", str(host.root),
         "--npu-smi", str(npu_smi.path)],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    assert "  Ascend310P-4c-116-1  vir04: 4 AI cores, 12 GB" in table


@pytest.fixture
def agent(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path
) -> Iterator[AgentProcess]:
    # A long health interval: what the kubelet sees below comes from inotify, not from the timer.
    process = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", "", "--health-interval", "600",
         "--cdi-spec-dir", str(short_dir / "cdi")]
    )  # fmt: skip
    yield process
    process.close()


def _devices(kubelet: KubeletStandin, resource: str) -> set[str] | None:
    update = kubelet.latest(resource)
    return None if update is None else set(update.health())


def _allocate(kubelet: KubeletStandin, resource: str, ids: list[str]) -> Any:
    channel, stub = kubelet.plugin_stub(resource)
    try:
        pb = kubelet.pb
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        return stub.Allocate(request, timeout=5).container_responses[0]
    finally:
        channel.close()


def test_resources_ids_and_allocate(
    kubelet: KubeletStandin,
    host: HostTree,
    npu_smi: FakeNpuSmi,
    short_dir: Path,
    request: pytest.FixtureRequest,
) -> None:
    _add_vnpu_nodes(host, [116, 117])
    agent = request.getfixturevalue("agent")
    kubelet.wait_for(
        lambda: (
            _devices(kubelet, CHIPS) == {"Ascend310P-0", "Ascend310P-2"}
            and _devices(kubelet, FOUR) == {"Ascend310P-4c-116-1"}
            and _devices(kubelet, TWO) == {"Ascend310P-2c-117-1"}
        ),
        what="chips 0 and 2 whole, chip 1 as its two vNPUs",
    )
    assert sorted(r.resource_name for r in kubelet.registrations) == sorted([CHIPS, FOUR, TWO])
    assert kubelet.latest(TWO).health() == {"Ascend310P-2c-117-1": "Healthy"}  # type: ignore[union-attr]

    container = _allocate(kubelet, TWO, ["Ascend310P-2c-117-1"])
    assert dict(container.envs) == {"ASCEND_VISIBLE_DEVICES": "117", "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"}
    nodes = [(d.host_path, d.container_path, d.permissions) for d in container.devices]
    assert nodes[0] == ("/dev/vdavinci117", "/dev/davinci117", "rw")
    assert {path for path, _, _ in nodes[1:]} == {"/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"}
    assert [d.name for d in container.cdi_devices] == ["huawei.com/npu=Ascend310P-2c-117-1"]
    whole = _allocate(kubelet, CHIPS, ["Ascend310P-2"])
    assert dict(whole.envs)["ASCEND_RUNTIME_OPTIONS"] == ""
    with pytest.raises(grpc.RpcError) as refused:
        _allocate(kubelet, CHIPS, ["Ascend310P-1"])
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown device 'Ascend310P-1'" in (refused.value.details() or "")

    spec = (short_dir / "cdi" / "huawei.com-npu.yaml").read_text()
    assert "name: Ascend310P-4c-116-1" in spec and "name: Ascend310P-2c-117-1" in spec
    assert "path: /dev/davinci117" in spec and "hostPath: /dev/vdavinci117" in spec
    assert "Traceback" not in agent.output
    assert agent.matching(r"WARNING .*(vNPU|vnpu|-8255)") == [], "chip 0 without vNPU support, quietly"


def test_vnpus_made_and_removed_reach_the_kubelet_by_their_device_nodes(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, request: pytest.FixtureRequest
) -> None:
    npu_smi.set_output("info -t info-vnpu -i 1 -c 0", INFO_VNPU_NONE)
    request.getfixturevalue("agent")
    kubelet.wait_for(lambda: _devices(kubelet, CHIPS) == {"Ascend310P-0", "Ascend310P-1", "Ascend310P-2"})
    assert [r.resource_name for r in kubelet.registrations] == [CHIPS]

    # Made by hand on the node: npu-smi answers with them, and their device nodes appear.
    asked_chip_2 = npu_smi.count("info -t info-vnpu -i 2 -c 0")
    npu_smi.set_output("info -t info-vnpu -i 1 -c 0", INFO_VNPU_TWO)
    _add_vnpu_nodes(host, [116, 117])
    kubelet.wait_for(
        lambda: (
            _devices(kubelet, CHIPS) == {"Ascend310P-0", "Ascend310P-2"}
            and _devices(kubelet, FOUR) == {"Ascend310P-4c-116-1"}
            and kubelet.latest(TWO) is not None
            and kubelet.latest(TWO).health() == {"Ascend310P-2c-117-1": "Healthy"}
        ),  # type: ignore[union-attr]
        what="chip 1 split into its vNPUs",  # by inotify: the next health query is 600 s away
    )

    # Destroyed again: chip 1 comes back whole; the vNPU resources leave, their sockets removed.
    npu_smi.set_output("info -t info-vnpu -i 1 -c 0", INFO_VNPU_NONE)
    for vnpu_id in (116, 117):
        (host.dev / f"vdavinci{vnpu_id}").unlink()
    kubelet.wait_for(
        lambda: _devices(kubelet, CHIPS) == {"Ascend310P-0", "Ascend310P-1", "Ascend310P-2"},
        what="chip 1 whole again",
    )
    wait_gone(kubelet.plugin_socket(FOUR))
    wait_gone(kubelet.plugin_socket(TWO))
    assert npu_smi.count("info -t info-vnpu -i 2 -c 0") == asked_chip_2, "only the chip whose nodes changed"
    assert sorted(r.resource_name for r in kubelet.registrations) == sorted([CHIPS, FOUR, TWO]), "no restart"


def test_doctor_explains_the_smaller_chip_count(host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path) -> None:
    _add_vnpu_nodes(host, [116, 117])
    result = run_cli(
        "doctor", "--json", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
        "--kubelet-dir", str(short_dir / "kubelet"), "--metrics-address", "",
        env={"KUBECONFIG": str(short_dir / "none")}, timeout=60,
    )  # fmt: skip
    checks = {check["check"]: check for check in json.loads(result.stdout)}
    assert checks["vNPUs"]["detail"] == (
        "chip 1 is split into vNPUs, so huawei.com/Ascend310P shows 2, not 3; "
        "huawei.com/Ascend310P-2c: 1; huawei.com/Ascend310P-4c: 1"
    )


def test_sighup_asks_npu_smi_again(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, request: pytest.FixtureRequest
) -> None:
    # The device nodes are there from the start; only npu-smi's answer changes, which no event announces.
    _add_vnpu_nodes(host, [116, 117])
    npu_smi.set_output("info -t info-vnpu -i 1 -c 0", INFO_VNPU_NONE)
    agent = request.getfixturevalue("agent")
    kubelet.wait_for(lambda: _devices(kubelet, CHIPS) == {"Ascend310P-0", "Ascend310P-1", "Ascend310P-2"})
    npu_smi.set_output("info -t info-vnpu -i 1 -c 0", INFO_VNPU_TWO)
    agent.proc.send_signal(signal.SIGHUP)
    kubelet.wait_for(
        lambda: (
            _devices(kubelet, CHIPS) == {"Ascend310P-0", "Ascend310P-2"}
            and _devices(kubelet, TWO) == {"Ascend310P-2c-117-1"}
        ),
        timeout=5,
        what="chip 1's vNPUs after SIGHUP",
    )
