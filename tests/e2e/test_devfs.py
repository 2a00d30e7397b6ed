"""The devfs backend on temporary host trees, with a fake npu-smi, as `list` and as a registered agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import CONSTRUCTED, FIXTURES
from tests.support.agent_process import AgentProcess
from tests.support.host_tree import HostTree
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi, with_health

B4_INFO = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()
B4_BUS = ["0000:C1:00.0", "0000:C2:00.0", "0000:81:00.0", "0000:82:00.0",
          "0000:01:00.0", "0000:02:00.0", "0000:41:00.0", "0000:42:00.0"]  # fmt: skip
B4_NUMA = {bus: (1 if bus[5] in "C8" else 0) for bus in B4_BUS}


@pytest.fixture
def npu_smi(short_dir: Path) -> FakeNpuSmi:
    fake = FakeNpuSmi(short_dir / "npu-smi")
    fake.set_output("info", B4_INFO)
    return fake


def _list(
    host: HostTree, npu_smi: FakeNpuSmi | Path | None, *extra: str, status: int = 0
) -> tuple[list[dict[str, Any]], str]:
    """``list`` on ``host``; ``npu_smi`` None: the default lookup (no npu-smi on PATH here); ``status`` 1
    where no chip can be listed for a problem."""
    path = npu_smi.path if isinstance(npu_smi, FakeNpuSmi) else npu_smi
    given = [] if path is None else ["--npu-smi", str(path)]
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "list", "--backend", "devfs", "--host-root", str(host.root),
         *given, "--npu-smi-timeout", "5", "--json", *extra],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "PATH": os.path.dirname(sys.executable)},
    )  # fmt: skip
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout), result.stderr


def test_910b4_node(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    host.add_chips(range(8)).add_numa(B4_NUMA)
    rows, problems = _list(host, npu_smi)
    assert problems == ""
    assert [row["id"] for row in rows] == [f"Ascend910-{i}" for i in range(8)]
    assert {row["model"] for row in rows} == {"910B4"}
    assert {row["resource"] for row in rows} == {"huawei.com/Ascend910"}
    assert {row["health"] for row in rows} == {"Healthy"}
    assert [row["bus_id"] for row in rows] == B4_BUS
    assert [row["numa_node"] for row in rows] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert [row["device"] for row in rows] == [f"/dev/davinci{i}" for i in range(8)]


def test_model_naming_can_carry_the_sku(host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path) -> None:
    host.add_chips(range(8))
    config = short_dir / "c.yaml"
    config.write_text("resourceNaming: model\n")
    rows, _ = _list(host, npu_smi, "--config", str(config))
    assert rows[0]["resource"] == "huawei.com/Ascend910B4"
    assert rows[0]["id"] == "Ascend910B4-0"


def test_redacted_names_fall_back_to_the_configured_model(
    host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path
) -> None:
    host.add_chips(range(8))
    npu_smi.set_output("info", (FIXTURES / "910A-24.1.RC2-info-warning.txt").read_text())
    rows, problems = _list(host, npu_smi, status=1)
    assert rows == []
    assert "cannot tell the model of NPU 0" in problems
    config = short_dir / "c.yaml"
    config.write_text("model: 910A\n")
    rows, problems = _list(host, npu_smi, "--config", str(config))
    assert [row["model"] for row in rows] == ["910A"] * 8
    assert {row["health"] for row in rows} == {"Healthy"}, "Warning counts as Healthy"


def test_redacted_names_come_from_info_m(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    host.add_chips(range(8))
    npu_smi.set_output("info", (FIXTURES / "910A-24.1.RC2-info-warning.txt").read_text())
    diag = (FIXTURES / "910A-diag-collection-ok.txt").read_text()
    block = diag.split("/usr/local/bin/npu-smi info -m\n", 1)[1].split("\n\n", 1)[0]
    npu_smi.set_output("info -m", block + "\n")
    rows, _ = _list(host, npu_smi)
    assert [row["model"] for row in rows] == ["910A"] * 8
    assert rows[3]["bus_id"] == "0000:01:00.0"


def test_310p3_single_uses_the_device_column(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    host.add_chips([0])
    npu_smi.set_output("info", (FIXTURES / "310P3-23.0.0-info.txt").read_text())
    rows, _ = _list(host, npu_smi)
    assert [(row["id"], row["resource"], row["phys_id"], row["model"]) for row in rows] == [
        ("Ascend310P-0", "huawei.com/Ascend310P", 0, "310P3")
    ]


def _is_info_table(name: str) -> bool:
    return name.endswith("-info.txt") or "-info-alarm" in name or "-info-in-container" in name


@pytest.mark.parametrize("name", sorted(p.name for p in CONSTRUCTED.glob("*.txt") if _is_info_table(p.name)))
def test_constructed_shapes_list_every_chip(host: HostTree, npu_smi: FakeNpuSmi, name: str) -> None:
    from ascend_agent.backends.npusmi import parse_info, physical_ids

    text = (CONSTRUCTED / name).read_text()
    table = parse_info(text)
    expected = list(physical_ids(table.chips))
    host.add_chips(expected)
    npu_smi.set_output("info", text)
    rows, _ = _list(host, npu_smi, "--config", str(_model_config(host.root.parent, name)))
    assert sorted(row["phys_id"] for row in rows) == sorted(expected)
    healthy = {row["phys_id"] for row in rows if row["health"] == "Healthy"}
    reported_ok = {
        p for p, chip in zip(expected, table.chips, strict=True) if chip.health in ("OK", "Warning")
    }
    assert healthy == reported_ok


def _model_config(directory: Path, name: str) -> Path:
    config = directory / "model.yaml"
    config.write_text(f"model: '{name.split('-')[0].split('x')[0]}'\n")
    return config


def test_a_chip_without_its_device_node_is_unhealthy(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    host.add_chips([0, 1, 2, 4, 5, 6, 7, 9])
    rows, _ = _list(host, npu_smi)
    by_id = {row["phys_id"]: row for row in rows}
    assert sorted(by_id) == list(range(8)), "davinci9 is not invented"
    assert by_id[3]["health"] == "Unhealthy"
    assert "/dev/davinci3 is missing" in by_id[3]["reason"]
    assert sum(row["health"] == "Healthy" for row in rows) == 7


def test_without_davinci_manager_every_chip_is_unhealthy(short_dir: Path, npu_smi: FakeNpuSmi) -> None:
    host = HostTree(short_dir / "host").add_driver().add_chips(range(8))
    rows, problems = _list(host, npu_smi)
    assert {row["health"] for row in rows} == {"Unhealthy"}
    assert "davinci_manager is missing" in problems


def test_no_device_files_points_at_the_driver(short_dir: Path, npu_smi: FakeNpuSmi) -> None:
    host = HostTree(short_dir / "host")
    npu_smi.set_mode("fail")
    rows, problems = _list(host, npu_smi, status=1)
    assert rows == []
    assert "no /dev/davinci* device files" in problems
    assert "driver or firmware" in problems


def test_missing_npu_smi_is_explained(host: HostTree, short_dir: Path) -> None:
    """The default lookup may find no npu-smi (an explicit --npu-smi that is not there is bad usage)."""
    host.add_chips(range(2))
    (host.root / "usr/local/bin/npu-smi").unlink()
    rows, problems = _list(host, None, status=1)
    assert rows == []
    assert "usr/local/bin/npu-smi" in problems
    assert "model: in the config file" in problems
    config = short_dir / "c.yaml"
    config.write_text("model: 910B4\n")
    rows, _ = _list(host, None, "--config", str(config))
    assert [row["id"] for row in rows] == ["Ascend910-0", "Ascend910-1"]


# A registered agent on devfs -------------------------------------------------------------------------------


@pytest.fixture
def devfs_agent(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, request: pytest.FixtureRequest
) -> Iterator[AgentProcess]:
    host.add_chips(range(8)).add_numa(B4_NUMA)
    extra = getattr(request, "param", ())
    process = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", "", *extra]
    )  # fmt: skip
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda u: len(u.devices) == 8)
    yield process
    process.close()


def _allocate(kubelet: KubeletStandin, ids: list[str], timeout: float = 5) -> Any:
    channel, stub = kubelet.plugin_stub()
    try:
        pb = kubelet.pb
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        return stub.Allocate(request, timeout=timeout).container_responses[0]
    finally:
        channel.close()


def test_allocate_plain_mode_hands_over_host_paths(
    kubelet: KubeletStandin, devfs_agent: AgentProcess, host: HostTree
) -> None:
    for i in range(8):
        devfs_agent.wait_log(rf"Found device /dev/davinci{i}$")
    update = kubelet.latest()
    assert update is not None
    assert {d[0]: d[2] for d in update.devices}["Ascend910-0"] == [1]
    assert {d[0]: d[2] for d in update.devices}["Ascend910-4"] == [0]
    container = _allocate(kubelet, ["Ascend910-2", "Ascend910-0"])
    assert dict(container.envs) == {"ASCEND_VISIBLE_DEVICES": "0,2", "ASCEND_RUNTIME_OPTIONS": ""}
    assert [(d.host_path, d.container_path, d.permissions) for d in container.devices] == [
        ("/dev/davinci0", "/dev/davinci0", "rw"),
        ("/dev/davinci2", "/dev/davinci2", "rw"),
        ("/dev/davinci_manager", "/dev/davinci_manager", "rw"),
        ("/dev/devmm_svm", "/dev/devmm_svm", "rw"),
        ("/dev/hisi_hdc", "/dev/hisi_hdc", "rw"),
    ]
    mounts = [(m.host_path, m.container_path, m.read_only) for m in container.mounts]
    assert mounts == [
        (path, path, True)
        for path in (
            "/usr/local/Ascend/driver/lib64",
            "/usr/local/Ascend/driver/include",
            "/usr/local/Ascend/driver/version.info",
            "/usr/local/dcmi",
            "/usr/local/bin/npu-smi",
            "/etc/ascend_install.info",
        )
    ]
    assert not any(
        str(host.root) in path for m in container.mounts for path in (m.host_path, m.container_path)
    )


def test_a_driver_path_that_appears_is_mounted_from_then_on(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi
) -> None:
    (host.root / "etc/ascend_install.info").unlink()
    (host.root / "usr/local/dcmi/libdcmi.so").unlink()
    (host.root / "usr/local/dcmi").rmdir()
    host.add_chips(range(8))
    process = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", ""]
    )  # fmt: skip
    try:
        kubelet.wait_registrations(1)
        paths = [m.host_path for m in _allocate(kubelet, ["Ascend910-1"]).mounts]
        assert "/etc/ascend_install.info" not in paths
        assert "/usr/local/dcmi" not in paths
        assert "/usr/local/Ascend/driver/lib64" in paths
    finally:
        process.close()


@pytest.mark.parametrize("devfs_agent", [("--mode", "ascend-runtime")], indirect=True)
def test_allocate_ascend_runtime_mode_is_env_only(kubelet: KubeletStandin, devfs_agent: AgentProcess) -> None:
    container = _allocate(kubelet, ["Ascend910-5"])
    assert dict(container.envs) == {"ASCEND_VISIBLE_DEVICES": "5", "ASCEND_RUNTIME_OPTIONS": ""}
    assert list(container.devices) == []
    assert list(container.mounts) == []


@pytest.mark.parametrize("devfs_agent", [("--health-interval", "60")], indirect=True)
def test_hot_unplug_and_return_by_event(
    kubelet: KubeletStandin, devfs_agent: AgentProcess, host: HostTree
) -> None:
    # The health interval is a minute: what follows can only come from inotify.
    before = len(kubelet.updates)
    (host.dev / "davinci3").unlink()
    gone = kubelet.wait_update(lambda u: u.health()["Ascend910-3"] == "Unhealthy", after=before, timeout=5)
    assert len(gone.devices) == 8, "a chip that disappears stays listed"
    assert sum(h == "Healthy" for h in gone.health().values()) == 7
    (host.dev / "davinci3").write_text("")
    kubelet.wait_update(lambda u: set(u.health().values()) == {"Healthy"}, after=before + 1, timeout=5)
    (host.dev / "davinci_manager").unlink()
    kubelet.wait_update(lambda u: set(u.health().values()) == {"Unhealthy"}, after=before + 2, timeout=5)
    (host.dev / "davinci_manager").write_text("")
    kubelet.wait_update(lambda u: set(u.health().values()) == {"Healthy"}, after=before + 3, timeout=5)


@pytest.mark.parametrize("devfs_agent", [("--health-interval", "60")], indirect=True)
def test_a_removal_after_an_inotify_overflow_is_seen(
    kubelet: KubeletStandin, devfs_agent: AgentProcess, host: HostTree
) -> None:
    """The agent paused (a throttled or stopped container) while the kubelet directory churns: the queue
    overflows, and the removal of a device node after it is in no event."""
    before = len(kubelet.updates)
    devfs_agent.proc.send_signal(signal.SIGSTOP)
    try:
        limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
        for n in range(limit // 2 + 100):
            name = kubelet.directory / f"churn{n}"
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o600))
            os.unlink(name)
        (host.dev / "davinci3").unlink()
    finally:
        devfs_agent.proc.send_signal(signal.SIGCONT)
    kubelet.wait_update(lambda u: u.health()["Ascend910-3"] == "Unhealthy", after=before)
    devfs_agent.wait_log("Events may have been missed \\(the inotify queue overflowed\\)")


@pytest.mark.parametrize(
    "devfs_agent",
    [("--health-interval", "1", "--npu-smi-timeout", "3", "--health-failure-threshold", "2")],
    indirect=True,
)
@pytest.mark.parametrize("mode", ["hang", "flood", "orphan"])
def test_hanging_npu_smi_fails_after_the_threshold_and_recovers(
    kubelet: KubeletStandin, devfs_agent: AgentProcess, npu_smi: FakeNpuSmi, mode: str
) -> None:
    """A hanging npu-smi, one that prints without end, and a wrapper whose child hangs holding the pipes:
    each a failed query, never a stopped health loop."""
    npu_smi.set_mode(mode)
    devfs_agent.wait_log("Health query failed, keeping the last known health: ")
    # The kubelet's calls never wait for npu-smi (a hung one is killed after 3 s).
    assert _allocate(kubelet, ["Ascend910-0"], timeout=2).envs["ASCEND_VISIBLE_DEVICES"] == "0"
    down = kubelet.wait_update(lambda u: set(u.health().values()) == {"Unhealthy"})
    assert len(down.devices) == 8
    devfs_agent.wait_log("npu-smi failed 2 times in a row")
    npu_smi.set_mode("ok")
    kubelet.wait_update(
        lambda u: set(u.health().values()) == {"Healthy"}, after=kubelet.updates.index(down) + 1
    )
    devfs_agent.wait_log("npu-smi answers again")


@pytest.mark.parametrize("devfs_agent", [("--health-interval", "1")], indirect=True)
def test_health_from_npu_smi_goes_and_comes_back(
    kubelet: KubeletStandin, devfs_agent: AgentProcess, npu_smi: FakeNpuSmi
) -> None:
    npu_smi.set_output("info", with_health(B4_INFO, 5, "Critical"))
    sick = kubelet.wait_update(lambda u: u.health()["Ascend910-5"] == "Unhealthy")
    assert sum(h == "Healthy" for h in sick.health().values()) == 7
    npu_smi.set_output("info", B4_INFO)
    kubelet.wait_update(
        lambda u: set(u.health().values()) == {"Healthy"}, after=kubelet.updates.index(sick) + 1
    )


def test_the_env_names_every_flag(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    host.add_chips(range(8))
    env = {**os.environ, "ASCEND_AGENT_BACKEND": "devfs", "ASCEND_AGENT_HOST_ROOT": str(host.root),
           "ASCEND_AGENT_NPU_SMI": str(npu_smi.path)}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "list", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)) == 8


def test_list_names_a_failing_npu_smi_and_exits_non_zero(host: HostTree, npu_smi: FakeNpuSmi) -> None:
    host.add_chips(range(8))
    npu_smi.set_mode("fail")
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "list", "--backend", "devfs", "--host-root", str(host.root),
         "--npu-smi", str(npu_smi.path), "--npu-smi-timeout", "5"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "no chips found" not in result.stdout, "eight device files are there: npu-smi failed"
    (line,) = result.stderr.splitlines()
    assert line.startswith("ascend-agent: ") and "dcmi module initialize failed, ret -8005" in line
