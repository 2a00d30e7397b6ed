"""`ascend-agent doctor` on a healthy temporary node with a running agent, and on a node without a driver."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent_process import AgentProcess
from host_tree import HostTree
from kubelet_standin import KubeletStandin
from npusmi_fake import FakeNpuSmi

B4_INFO = (Path(__file__).parent / "fixtures" / "npu-smi" / "910B4x8-25.0.rc1.1-info.txt").read_text()


def _doctor(*args: str) -> tuple[int, list[dict[str, Any]], str]:
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "doctor", "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
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
        assert [c["check"] for c in checks][:5] == [
            "device files",
            "driver installed",
            "npu-smi reports chips",
            "chips match device files",
            "kubelet socket",
        ]
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
