"""`ascend-agent doctor` under ``resourceNaming: model``: it looks for the socket the agent serves under that
naming (``Ascend910B4.sock``), not for Huawei's per-generation names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import FIXTURES
from tests.support.agent_process import fake_agent
from tests.support.cli import run_cli
from tests.support.host_tree import HostTree
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi

B4_INFO = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()
RESOURCE = "huawei.com/Ascend910B4"
SOCKET = "Ascend910B4.sock"


def _doctor(*args: str) -> tuple[int, dict[str, dict[str, Any]], str]:
    result = run_cli("doctor", "--json", *args, timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, {c["check"]: c for c in json.loads(result.stdout)}, result.stdout


@pytest.mark.parametrize("backend", ["fake", "devfs"])
def test_doctor_checks_the_socket_of_model_naming(
    kubelet: KubeletStandin, short_dir: Path, backend: str
) -> None:
    host = HostTree(short_dir / "host").add_driver().add_management().add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", B4_INFO)
    config = short_dir / "config.yaml"
    config.write_text(yaml.safe_dump({"backend": backend, "resourceNaming": "model"}))
    # The agent runs the fake backend (910B4 chips) under the same naming.
    agent = fake_agent(kubelet.directory, "--config", str(config), "--backend", "fake")
    try:
        (registration,) = kubelet.wait_registrations(1)
        assert registration.resource_name == RESOURCE
        assert registration.endpoint == SOCKET
        kubelet.wait_update(lambda u: u.resource == RESOURCE and len(u.devices) == 8)
        code, checks, output = _doctor_on(config, host, npu_smi, kubelet)
        assert f"plugin socket {SOCKET}" in checks, output
        check = checks[f"plugin socket {SOCKET}"]
        assert check["ok"] is True, check
        assert "8 devices, 8 Healthy" in check["detail"]
        assert "plugin socket" not in checks, "no failed 'plugin socket' check naming other sockets"
        assert "Ascend310.sock" not in output and "Ascend910.sock" not in output
        assert code == 0, output
    finally:
        agent.close()


def _doctor_on(
    config: Path, host: HostTree, npu_smi: FakeNpuSmi, kubelet: KubeletStandin
) -> tuple[int, dict[str, dict[str, Any]], str]:
    """The doctor with ``config``, looking at ``host`` through ``npu_smi`` and at ``kubelet``'s directory."""
    return _doctor(
        "--config", str(config),
        "--host-root", str(host.root),
        "--npu-smi", str(npu_smi.path),
        "--kubelet-dir", str(kubelet.directory),
        "--metrics-address", "",
    )  # fmt: skip


def test_doctor_finds_the_model_named_socket_when_discovery_finds_no_chips(
    kubelet: KubeletStandin, short_dir: Path
) -> None:
    # npu-smi fails and there are no device files: the doctor cannot learn the resources from the chips, yet
    # the agent (elsewhere, or before the fault) serves Ascend910B4.sock under model naming.
    host = HostTree(short_dir / "host").add_driver()
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_mode("fail")
    config = short_dir / "config.yaml"
    config.write_text(yaml.safe_dump({"backend": "devfs", "resourceNaming": "model"}))
    agent = fake_agent(kubelet.directory, "--config", str(config), "--backend", "fake")
    try:
        kubelet.wait_registrations(1)
        kubelet.wait_update(lambda u: u.resource == RESOURCE and len(u.devices) == 8)
        _, checks, output = _doctor_on(config, host, npu_smi, kubelet)
        assert checks["npu-smi reports chips"]["ok"] is False
        assert f"plugin socket {SOCKET}" in checks, output
        assert checks[f"plugin socket {SOCKET}"]["ok"] is True
    finally:
        agent.close()
