"""/metrics, /healthz and /readyz of a running agent, and JSON logs."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from ascend_agent import __version__
from tests.support.agent_process import AgentProcess
from tests.support.http_probe import without_node
from tests.support.kubelet_standin import KubeletStandin


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, without_node(response.read().decode())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _agent(directory: Path, port: int, *extra: str) -> AgentProcess:
    return AgentProcess(
        [
            "run",
            "--backend",
            "fake",
            "--kubelet-dir",
            str(directory),
            "--metrics-address",
            f"127.0.0.1:{port}",
            *extra,
        ]
    )


def test_probes_follow_registration(kubelet_api: tuple[object, object], short_dir: Path) -> None:
    port = _free_port()
    directory = short_dir / "k"
    directory.mkdir()  # the kubelet's directory is there; the kubelet is not listening
    (short_dir / "plugins").mkdir()
    process = _agent(directory, port)
    try:
        process.wait_log("Serving /metrics")
        process.wait_log("the kubelet is not listening")
        assert _get(f"http://127.0.0.1:{port}/healthz") == (200, "ok\n")
        status, body = _get(f"http://127.0.0.1:{port}/readyz")
        assert status == 503
        assert "not registered with the kubelet: huawei.com/Ascend910" in body
        standin = KubeletStandin(directory, *kubelet_api)  # type: ignore[arg-type]
        standin.start(wipe=False)
        try:
            standin.wait_registrations(1)
            process.wait_log("Registered resource")
            assert _get(f"http://127.0.0.1:{port}/readyz") == (200, "ready\n")
            standin.wait_update(lambda u: len(u.devices) == 8)
            status, metrics = _get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200
            assert 'ascend_agent_devices{health="Healthy",resource="huawei.com/Ascend910"} 8.0' in metrics
            assert 'ascend_agent_registrations_total{resource="huawei.com/Ascend910"} 1.0' in metrics
            assert 'ascend_agent_list_and_watch_streams{resource="huawei.com/Ascend910"} 1.0' in metrics
            assert "ascend_agent_kubelet_restarts_total 1.0" in metrics
            assert f'ascend_agent_build_info{{version="{__version__}"}} 1.0' in metrics
            for name in (
                "ascend_agent_allocate_seconds",
                "ascend_agent_npu_smi_seconds",
                "ascend_agent_npu_smi_failures_total",
                "ascend_agent_allocations_total",
            ):
                assert f"# TYPE {name.removesuffix('_total')}" in metrics
            assert _get(f"http://127.0.0.1:{port}/nope")[0] == 404
        finally:
            standin.stop()
    finally:
        process.close()


def test_allocations_are_counted_by_code(kubelet: KubeletStandin) -> None:
    port = _free_port()
    process = _agent(kubelet.directory, port)
    try:
        kubelet.wait_registrations(1)
        channel, stub = kubelet.plugin_stub()
        pb = kubelet.pb
        stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["Ascend910-0"])])
        )
        with pytest.raises(grpc.RpcError):
            stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["x"])])
            )
        channel.close()
        metrics = _get(f"http://127.0.0.1:{port}/metrics")[1]
        assert 'ascend_agent_allocations_total{code="OK",resource="huawei.com/Ascend910"} 1.0' in metrics
        assert (
            'ascend_agent_allocations_total{code="INVALID_ARGUMENT",resource="huawei.com/Ascend910"} 1.0'
            in metrics
        )
        assert "ascend_agent_allocate_seconds_count 2.0" in metrics
    finally:
        process.close()


def test_json_log_lines(kubelet: KubeletStandin) -> None:
    process = AgentProcess(
        [
            "run",
            "--backend",
            "fake",
            "--kubelet-dir",
            str(kubelet.directory),
            "--metrics-address",
            "",
            "--log-format",
            "json",
        ]
    )
    try:
        (line,) = process.wait_log(r'"msg": "Registered resource huawei.com/Ascend910"')
        entry = json.loads(line)
        assert entry["level"] == "info"
        assert entry["time"].endswith("Z")
        found = [json.loads(item)["msg"] for item in process.wait_log("Found device", count=8)]
        assert found == [f"Found device /dev/davinci{i}" for i in range(8)]
    finally:
        process.close()


def test_json_log_lines_carry_fields(kubelet: KubeletStandin, short_dir: Path) -> None:
    state = short_dir / "state.json"
    state.write_text('{"absent": [99]}')
    process = AgentProcess(
        ["run", "--backend", "fake", "--kubelet-dir", str(kubelet.directory), "--metrics-address", "",
         "--log-format", "json", "--fake-state", str(state)]
    )  # fmt: skip
    try:
        (line,) = process.wait_log(r'"msg": "fake state file .* names chips that do not exist')
        entry = json.loads(line)
        assert (entry["level"], entry["path"], entry["ids"]) == ("warning", str(state), [99])
        kubelet.wait_registrations(1)
        state.unlink()
        (line,) = process.wait_log(r"keeping the previous state")
        entry = json.loads(line)
        assert entry["path"] == str(state)
        assert "does not exist" in entry["reason"]
    finally:
        process.close()
