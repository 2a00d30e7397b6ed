"""Every captured npu-smi sample through the devfs backend and a fake npu-smi: `ascend-agent list --json`
gives the right chips, models, resources and A3 modules; the error samples give one clear line; A3 and Ascend
950 nodes register and prefer as the kubelet sees them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import CONSTRUCTED, FIXTURES
from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.host_tree import HostTree
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi

A3_INFO = "Ascend910-A3x16-24.1.rc3.7-info.txt"
A3_BOARD = (CONSTRUCTED / "Ascend910-A3-24.1.rc3.7-info-t-board-i-0-c-0.txt").read_text()
A3_NO_SPOD = "This device does not support get spod info.\n"
NPU950_INFO = "Ascend950PRx1-25.7.rc1.6-info-excerpt.txt"


@dataclass(frozen=True)
class Expected:
    ids: list[str]
    model: str
    resource: str = "huawei.com/Ascend910"
    npu_ids: list[int] | None = None


# What each captured `npu-smi info` sample must list. Names redacted (910A) come from `info -m`, tested in
# test_devfs.py; the other captured files are not `npu-smi info` tables and feed the tests below.
EXPECTED = {
    "910B4x8-25.0.rc1.1-info.txt": Expected(
        [f"Ascend910-{i}" for i in range(8)], "910B4", npu_ids=[*range(8)]
    ),
    "910B1-23.0.rc2-info-elided.txt": Expected(["Ascend910-0", "Ascend910-1", "Ascend910-7"], "910B1"),
    "910B3x8-26.1.0-info-with-process.txt": Expected([f"Ascend910-{i}" for i in range(8)], "910B3"),
    "310P3-23.0.0-info.txt": Expected(["Ascend310P-0"], "310P3", "huawei.com/Ascend310P", npu_ids=[24]),
    A3_INFO: Expected([f"Ascend910-{i}" for i in range(16)], "910_93", npu_ids=[i // 2 for i in range(16)]),
    NPU950_INFO: Expected(["npu-0"], "950PR", "huawei.com/npu", npu_ids=[0]),
}
ERRORS = {
    FIXTURES / "error-unknownchip-unknownver-info-dcmi-8005-container.txt": (
        "dcmi module initialize failed, ret -8005",
        "mount the host's driver and its libraries",
    ),
    CONSTRUCTED / "error-info-dcmi-8020-busy.txt": ("ret -8020): another process holds the device", "wait"),
    CONSTRUCTED / "error-info-permission-denied.txt": ("permission denied", "run the agent as root"),
}
NOT_INFO_TABLES = {
    "910A-24.1.RC2-info-warning.txt",
    "910A-diag-collection-ok.txt",
    "910B-D802-IT21HMDC-25.5.1-info-t-board-i0.txt",
    "910B1-23.0.rc2-info-t-common-i-1.txt",
    "910B1-23.0.rc2-info-t-usages-i-0.txt",
    "910B4x8-25.0.rc1.1-info-l.txt",
    "910B4x8-25.0.rc1.1-info-m.txt",
}


@pytest.fixture
def npu_smi(short_dir: Path) -> FakeNpuSmi:
    return FakeNpuSmi(short_dir / "npu-smi")


def _run_list(
    host: HostTree, npu_smi: FakeNpuSmi, *extra: str, status: int = 0
) -> tuple[list[dict[str, Any]], str]:
    """``list --json``; ``status`` 1 where no chip can be listed for a problem."""
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "list", "--backend", "devfs", "--host-root", str(host.root),
         "--npu-smi", str(npu_smi.path), "--npu-smi-timeout", "5", "--json", *extra],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout), result.stderr


def test_every_captured_sample_is_checked() -> None:
    captured = {path.name for path in FIXTURES.glob("*.txt")}
    errors = {path.name for path in ERRORS if path.parent == FIXTURES}
    assert captured == set(EXPECTED) | errors | NOT_INFO_TABLES


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_captured_sample_lists_the_right_chips(host: HostTree, npu_smi: FakeNpuSmi, name: str) -> None:
    expected = EXPECTED[name]
    host.add_chips(int(device_id.rpartition("-")[2]) for device_id in expected.ids)
    npu_smi.set_output("info", (FIXTURES / name).read_text())
    if name == A3_INFO:  # this capture comes without its spod-info: as on a driver that has none
        for die in range(16):
            npu_smi.set_error(f"info -t spod-info -i {die // 2} -c {die % 2}", A3_NO_SPOD)
    rows, problems = _run_list(host, npu_smi)
    assert problems == ""
    assert [row["id"] for row in rows] == expected.ids
    assert {row["model"] for row in rows} == {expected.model}
    assert {row["resource"] for row in rows} == {expected.resource}
    assert {row["health"] for row in rows} == {"Healthy"}
    assert all(row["faults"] == [] and row["held"] is None for row in rows), "no running agent to ask"
    if expected.npu_ids is not None:
        assert [row["npu_id"] for row in rows] == expected.npu_ids


def test_a3_modules_are_the_two_dies_of_each_npu_id(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    host.add_chips(range(16))
    npu_smi.set_output("info", (FIXTURES / A3_INFO).read_text())
    rows, _ = _run_list(host, npu_smi)
    modules: dict[int, list[int]] = {}
    for row in rows:
        modules.setdefault(row["npu_id"], []).append(row["phys_id"])
    assert modules == {npu: [2 * npu, 2 * npu + 1] for npu in range(8)}
    assert npu_smi.count("info -t board -i 0 -c 0") == 1, "the board is asked once, for one die"


def test_a3_soc_from_the_board(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    host.add_chips(range(16))
    npu_smi.set_output("info", (FIXTURES / A3_INFO).read_text())
    npu_smi.set_output("info -t board -i 0 -c 0", A3_BOARD)
    rows, _ = _run_list(host, npu_smi)
    assert {row["model"] for row in rows} == {"910_9392"}
    assert {row["resource"] for row in rows} == {"huawei.com/Ascend910"}


def test_a3_named_910c1(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    host.add_chips(range(4))
    npu_smi.set_output("info", (CONSTRUCTED / "910C1-A3x4-24.1.rc3.7-info.txt").read_text())
    rows, _ = _run_list(host, npu_smi)
    assert [(row["id"], row["model"], row["npu_id"]) for row in rows] == [
        (f"Ascend910-{i}", "910_93", i // 2) for i in range(4)
    ]


def test_950_names_the_model_on_request(host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path) -> None:
    host.add_chips([0])
    npu_smi.set_output("info", (FIXTURES / NPU950_INFO).read_text())
    config = short_dir / "c.yaml"
    config.write_text("resourceNaming: model\n")
    rows, _ = _run_list(host, npu_smi, "--config", str(config))
    assert [(row["id"], row["resource"], row["model"]) for row in rows] == [
        ("Ascend950PR-0", "huawei.com/Ascend950PR", "950PR")
    ]


def test_950_phys_ids_come_from_info_m(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    host.add_chips(range(8))
    npu_smi.set_output("info", (CONSTRUCTED / "Ascend950PRx8-25.7.rc1.6-info.txt").read_text())
    chip_map = (CONSTRUCTED / "Ascend950PRx8-25.7.rc1.6-info-m.txt").read_text()
    # Phy-IDs in reverse order of the NPU ids: the device nodes follow the Phy-IDs.
    lines = chip_map.splitlines(keepends=True)
    reversed_map = lines[0] + "".join(
        line.replace(f"{n}{' ' * 30}Ascend950PR", f"{7 - n}{' ' * 30}Ascend950PR")
        for n, line in enumerate(lines[1:])
    )
    npu_smi.set_output("info -m", reversed_map)
    rows, _ = _run_list(host, npu_smi)
    assert [(row["npu_id"], row["id"]) for row in rows] == [(7 - i, f"npu-{i}") for i in range(8)]
    assert {row["bus_id"] for row in rows if row["id"] == "npu-7"} == {"0000:61:00.0"}


@pytest.mark.parametrize("path", sorted(ERRORS), ids=lambda path: path.name)
def test_error_samples_give_one_clear_line(host: HostTree, npu_smi: FakeNpuSmi, path: Path) -> None:
    host.add_chips(range(2))
    npu_smi.set_output("info", path.read_text())
    rows, problems = _run_list(host, npu_smi, status=1)
    assert rows == []
    cause, next_step = ERRORS[path]
    (line,) = problems.splitlines()
    assert cause in line and next_step in line


def test_doctor_shows_the_same_text(host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path) -> None:
    host.add_chips(range(2))
    npu_smi.set_output(
        "info", (FIXTURES / "error-unknownchip-unknownver-info-dcmi-8005-container.txt").read_text()
    )
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "doctor", "--host-root", str(host.root), "--npu-smi",
         str(npu_smi.path), "--kubelet-dir", str(short_dir / "kubelet"), "--metrics-address", "", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Traceback" not in result.stderr
    check = next(c for c in json.loads(result.stdout) if c["check"] == "npu-smi reports chips")
    assert check["ok"] is False
    assert "dcmi module initialize failed, ret -8005" in check["detail"]
    assert "mount the host's driver and its libraries" in check["hint"]


@pytest.mark.parametrize(
    ("sample", "unadvertised"),
    [
        ("910B1-23.0.rc2-info-elided.txt", "5 of 8 device files would not be advertised (davinci2, davinci3, "
         "davinci4, davinci5, davinci6)"),
        ("910A-24.1.RC2-info-warning.txt", "8 of 8 device files would not be advertised"),
    ],
)  # fmt: skip
def test_doctor_fails_when_device_files_would_not_be_advertised(
    host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path, sample: str, unadvertised: str
) -> None:
    """An elided table, or names redacted as ``xxx`` with no ``info -m`` to name them: npu-smi answers, the
    device files are there, and still chips would not reach the kubelet."""
    host.add_chips(range(8))
    npu_smi.set_output("info", (FIXTURES / sample).read_text())
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "doctor", "--host-root", str(host.root), "--npu-smi",
         str(npu_smi.path), "--kubelet-dir", str(short_dir / "kubelet"), "--metrics-address", "", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Traceback" not in result.stderr
    assert result.returncode == 1
    checks = {c["check"]: c for c in json.loads(result.stdout)}
    assert checks["npu-smi reports chips"]["ok"] is True
    check = checks["chips advertised"]
    assert check["ok"] is False
    assert unadvertised in check["detail"]
    assert "set model: in the config file" in check["hint"]


# Registered agents ----------------------------------------------------------------------------------------


def _agent(kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, *extra: str) -> AgentProcess:
    return AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", "", *extra]
    )  # fmt: skip


@pytest.fixture
def a3_agent(kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi) -> Iterator[AgentProcess]:
    host.add_chips(range(16))
    npu_smi.set_output("info", (FIXTURES / A3_INFO).read_text())
    npu_smi.set_output("info -t board -i 0 -c 0", A3_BOARD)
    process = _agent(kubelet, host, npu_smi, "--health-interval", "1")
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda u: len(u.devices) == 16)
    yield process
    process.close()


def _prefer(kubelet: KubeletStandin, available: list[int], size: int, must: list[int] = ()) -> list[str]:
    channel, stub = kubelet.plugin_stub()
    try:
        pb = kubelet.pb
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[f"Ascend910-{i}" for i in available],
                    must_include_deviceIDs=[f"Ascend910-{i}" for i in must],
                    allocation_size=size,
                )
            ]
        )
        return sorted(stub.GetPreferredAllocation(request).container_responses[0].deviceIDs)
    finally:
        channel.close()


def test_a3_prefers_the_two_dies_of_one_npu_id(
    kubelet: KubeletStandin, a3_agent: AgentProcess, npu_smi: FakeNpuSmi
) -> None:
    assert kubelet.registrations[0].resource_name == "huawei.com/Ascend910"
    assert _prefer(kubelet, list(range(16)), 2) == ["Ascend910-0", "Ascend910-1"]
    # NPU 0 half used, NPU 1 whole: the whole module, not two halves.
    assert _prefer(kubelet, [1, 2, 3, 5], 2) == ["Ascend910-2", "Ascend910-3"]
    assert _prefer(kubelet, list(range(16)), 2, must=[9]) == ["Ascend910-8", "Ascend910-9"]
    assert _prefer(kubelet, [0, 1, 3, 4, 5, 7], 4) == [
        "Ascend910-0",
        "Ascend910-1",
        "Ascend910-4",
        "Ascend910-5",
    ]
    # Several health queries later the board was still asked only once.
    npu_smi.wait_count("info", npu_smi.count("info") + 2)
    assert npu_smi.count("info -t board -i 0 -c 0") == 1


def test_950_registers_huawei_com_npu(kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi) -> None:
    host.add_chips(range(8))
    npu_smi.set_output("info", (CONSTRUCTED / "Ascend950PRx8-25.7.rc1.6-info.txt").read_text())
    process = _agent(kubelet, host, npu_smi)
    try:
        (registration,) = kubelet.wait_registrations(1)
        assert registration.resource_name == "huawei.com/npu"
        assert registration.endpoint == "npu.sock"
        update = kubelet.wait_update(lambda u: u.resource == "huawei.com/npu" and len(u.devices) == 8)
        assert sorted(update.health()) == sorted(f"npu-{i}" for i in range(8))
        assert set(update.health().values()) == {"Healthy"}
        process.wait_log("Registered resource huawei.com/npu")
    finally:
        process.close()


def test_fake_a3_has_two_dies_per_npu_id(kubelet: KubeletStandin) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "list", "--backend", "fake", "--fake-model", "910_9392",
         "--json"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    rows = json.loads(result.stdout)
    assert [(row["phys_id"], row["npu_id"]) for row in rows] == [(i, i // 2) for i in range(8)]
    process = fake_agent(kubelet.directory, "--fake-model", "910_9392")
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 8)
        assert _prefer(kubelet, [0, 2, 3, 5], 2) == ["Ascend910-2", "Ascend910-3"]
    finally:
        process.close()


def test_fake_950_registers_huawei_com_npu(kubelet: KubeletStandin) -> None:
    process = fake_agent(kubelet.directory, "--fake-model", "950PR")
    try:
        (registration,) = kubelet.wait_registrations(1)
        assert (registration.resource_name, registration.endpoint) == ("huawei.com/npu", "npu.sock")
    finally:
        process.close()


@pytest.mark.parametrize(
    ("config", "ok", "detail", "hint"),
    [
        ("model: 910B4\n", False, "2 chips (910B4), every one Unhealthy: npu-smi does not answer",
         "healthyWithoutNpuSmi: true"),
        ("model: 910B4\nhealthyWithoutNpuSmi: true\n", True, "Healthy from their device files alone", ""),
        ("{}\n", False, "npu-smi does not answer, so the chip model is unknown", "set model:"),
    ],
)  # fmt: skip
def test_doctor_says_what_the_kubelet_gets_while_npu_smi_fails(
    host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path, config: str, ok: bool, detail: str, hint: str
) -> None:
    """npu-smi failing in the agent's container: the doctor says what becomes of the chips and what to
    mount (the -8005 sample's next step), and that only healthyWithoutNpuSmi runs them unwatched."""
    host.add_chips(range(2))
    npu_smi.set_output(
        "info", (FIXTURES / "error-unknownchip-unknownver-info-dcmi-8005-container.txt").read_text()
    )
    path = short_dir / "c.yaml"
    path.write_text(config)
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "doctor", "--host-root", str(host.root), "--npu-smi",
         str(npu_smi.path), "--kubelet-dir", str(short_dir / "kubelet"), "--metrics-address", "", "--json",
         "--config", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Traceback" not in result.stderr
    check = next(c for c in json.loads(result.stdout) if c["check"] == "chips advertised")
    assert check["ok"] is ok
    assert detail in check["detail"]
    if not ok:
        assert "mount the host's driver and its libraries" in check["hint"]
        assert hint in check["hint"]
