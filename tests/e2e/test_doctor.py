"""`ascend-agent doctor` on a healthy temporary node with a running agent, and on a node without a driver."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import FIXTURES
from tests.support.agent_process import AgentProcess
from tests.support.cli import run_cli
from tests.support.host_tree import HostTree
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi

B4_INFO = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()


def _doctor(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    result = run_cli("doctor", "--json", *args, timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


def test_doctor_passes_on_a_healthy_node(kubelet: KubeletStandin, short_dir: Path) -> None:
    host = HostTree(short_dir / "host").add_driver(version="24.1.rc2").add_management().add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", B4_INFO)
    common = [
        "--host-root",
        str(host.root),
        "--npu-smi",
        str(npu_smi.path),
        "--kubelet-dir",
        str(kubelet.directory),
    ]
    agent = AgentProcess(["run", "--backend", "devfs", "--metrics-address", "127.0.0.1:0", *common])
    try:
        kubelet.wait_registrations(1)
        code, checks, _ = _doctor(*common, "--metrics-address", "")
        by_name = {check["check"]: check for check in checks}
        assert code == 0, checks
        assert [c["check"] for c in checks][:6] == [
            "device files",
            "driver installed",
            "npu-smi reports chips",
            "chips match device files",
            "chips advertised",
            "kubelet socket",
        ]
        assert by_name["chips advertised"]["detail"] == "8 chips would be advertised, 8 of them Healthy"
        assert by_name["driver installed"]["ok"] is True
        assert "24.1.rc2" in by_name["driver installed"]["detail"]
        assert "8 chips" in by_name["npu-smi reports chips"]["detail"]
        assert "8 devices, 8 Healthy" in by_name["plugin socket Ascend910.sock"]["detail"]
        assert by_name["agent readiness"]["ok"] is None
        assert all(set(check) == {"check", "ok", "detail", "hint"} for check in checks)
        text = subprocess.run(
            [sys.executable, "-m", "ascend_agent", "doctor", *common, "--metrics-address", ""],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert text.returncode == 0
        assert "[     ok] device files" in text.stdout
    finally:
        agent.close()


def test_doctor_names_the_driver_on_a_node_without_device_files(short_dir: Path) -> None:
    host = HostTree(short_dir / "bare")
    code, checks, _ = _doctor(
        "--host-root", str(host.root), "--npu-smi", str(short_dir / "none"),
        "--kubelet-dir", str(short_dir / "k"), "--metrics-address", "",
    )  # fmt: skip
    assert code == 1
    first = checks[0]
    assert first["check"] == "device files" and first["ok"] is False
    assert "driver and firmware" in first["hint"]
    driver = checks[1]
    assert driver["ok"] is False and "version.info" in driver["detail"]
    assert any(c["check"] == "plugin socket" and c["ok"] is False for c in checks)


class _FakeApi(http.server.BaseHTTPRequestHandler):
    """Just enough of the Kubernetes API for the doctor's three cluster checks."""

    node = "npu-node-1"
    allocatable = "7"
    daemonset = "ascend-device-plugin-daemonset"
    namespace = "kube-system"

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        ds = f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets/{self.daemonset}"
        if path == ds:
            body: dict[str, Any] = {
                "kind": "DaemonSet", "apiVersion": "apps/v1",
                "metadata": {"name": self.daemonset, "namespace": self.namespace},
                "spec": {"selector": {"matchLabels": {"app": "a"}},
                         "template": {"metadata": {"labels": {"app": "a"}},
                                      "spec": {"containers": [{"name": "agent"}]}}},
                "status": {"desiredNumberScheduled": 2, "numberReady": 2, "currentNumberScheduled": 2,
                           "numberMisscheduled": 0},
            }  # fmt: skip
        elif path == f"/api/v1/namespaces/{self.namespace}/pods":
            assert f"spec.nodeName%3D{self.node}" in self.path or f"spec.nodeName={self.node}" in self.path
            body = {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                    "items": [{"metadata": {"name": f"{self.daemonset}-x7k2p"},
                               "status": {"phase": "Running"}}]}  # fmt: skip
        elif path == f"/api/v1/nodes/{self.node}":
            body = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": self.node},
                    "status": {"capacity": {"huawei.com/Ascend910": "8", "cpu": "192"},
                               "allocatable": {"huawei.com/Ascend910": self.allocatable}}}  # fmt: skip
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.mark.parametrize(
    "daemonset",
    [(), ("--daemonset-name", "npu-agent", "--daemonset-namespace", "npu-system")],
    ids=["defaults", "flags"],
)
def test_doctor_cluster_checks_through_the_api(short_dir: Path, daemonset: tuple[str, ...]) -> None:
    api = type("_Api", (_FakeApi,), dict(zip(("daemonset", "namespace"), daemonset[1::2], strict=False)))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = short_dir / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1", "kind": "Config", "current-context": "t",
                "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                "users": [{"name": "t", "user": {"token": "test"}}],
                "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
            }
        )
    )  # fmt: skip
    try:
        env = {"KUBECONFIG": str(kubeconfig), "NODE_NAME": _FakeApi.node}
        result = subprocess.run(
            [sys.executable, "-m", "ascend_agent", "doctor", "--json", "--host-root", str(short_dir),
             "--kubelet-dir", str(short_dir / "k"), "--metrics-address", "",
             "--npu-smi", str(short_dir / "x"), *daemonset],
            capture_output=True, text=True, timeout=60, env={**os.environ, **env},
        )  # fmt: skip
        assert "Traceback" not in result.stderr, result.stderr
        checks = {c["check"]: c for c in json.loads(result.stdout)}
        assert checks["daemonset"]["ok"] is True and "2 of 2 pods ready" in checks["daemonset"]["detail"]
        assert checks["pod on this node"]["ok"] is True
        assert "x7k2p is Running" in checks["pod on this node"]["detail"]
        assert checks["node capacity"]["ok"] is True
        assert "huawei.com/Ascend910 capacity 8, allocatable 7" in checks["node capacity"]["detail"]
    finally:
        server.shutdown()
        server.server_close()
