"""What a newcomer meets first: a typo in ``model:``, a non-root user, a plugin directory that is a file, an
``--npu-smi`` that is not there. One line and exit 2 at start (never a traceback); at a live reload the agent
keeps going."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.agent_process import AgentProcess
from tests.support.cli import run_cli
from tests.support.host_tree import HostTree
from tests.support.kubelet_standin import KubeletStandin

NOBODY = 65534


def _one_line(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("ascend-agent: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def _as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    """``ascend-agent ARGS`` as an unprivileged user (util-linux's setpriv), in a directory it may read."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a command as another user")
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return subprocess.run(
        [*drop, sys.executable, "-m", "ascend_agent", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/tmp",
        env={**{k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, "HOME": "/tmp"},
        stdin=subprocess.DEVNULL,
    )


def test_a_model_typo_at_start_is_one_line(short_dir: Path) -> None:
    config = short_dir / "c.yaml"
    config.write_text('model: "banana"\n')
    line = _one_line(run_cli("run", "--backend", "devfs", "--config", str(config)))
    assert f"config file {config}: model 'banana' is not an Ascend chip name; the nearest is " in line


def test_a_model_typo_at_reload_keeps_the_agent_running(kubelet: KubeletStandin, short_dir: Path) -> None:
    config = short_dir / "c.yaml"
    config.write_text(f"backend: fake\nmetricsAddress: ''\nkubeletDir: {kubelet.directory}\nmodel: 910B4\n")
    agent = AgentProcess(["run", "--config", str(config)])
    try:
        kubelet.wait_registrations(1)
        config.write_text(config.read_text().replace("model: 910B4", "model: banana"))
        agent.proc.send_signal(signal.SIGHUP)
        agent.wait_log("Config not applied, keeping the running settings: .*model 'banana'")
        assert not agent.matching("Config applied")
        code, _ = agent.terminate()
        assert code == 0, agent.output
        assert "Traceback" not in agent.output
    finally:
        agent.close()


def test_run_as_non_root_is_one_line(short_dir: Path) -> None:
    short_dir.chmod(0o755)
    kubelet_dir = short_dir / "kubelet" / "device-plugins"
    kubelet_dir.mkdir(parents=True)
    (short_dir / "kubelet" / "plugins").mkdir()
    line = _one_line(_as_nobody("run", "--backend", "fake", "--kubelet-dir", str(kubelet_dir),
                                "--metrics-address", ""))  # fmt: skip
    assert "cannot create the instance lock" in line and "Permission denied" in line
    assert "run the agent as root" in line


def test_run_as_non_root_where_only_root_may_look_is_one_line(short_dir: Path) -> None:
    short_dir.chmod(0o755)
    kubelet_dir = short_dir / "kubelet" / "device-plugins"
    kubelet_dir.mkdir(parents=True)
    (short_dir / "kubelet").chmod(0o700)  # as /var/lib/kubelet is on many nodes
    line = _one_line(_as_nobody("run", "--backend", "fake", "--kubelet-dir", str(kubelet_dir),
                                "--metrics-address", ""))  # fmt: skip
    assert f"cannot look at the kubelet's directory {kubelet_dir}: Permission denied" in line
    assert "run the agent as root" in line


def test_a_plugin_dir_that_is_a_file_is_one_line(short_dir: Path) -> None:
    (short_dir / "k").mkdir()
    (short_dir / "plain").write_text("")
    line = _one_line(run_cli("run", "--backend", "fake", "--kubelet-dir", str(short_dir / "k"),
                             "--plugin-dir", str(short_dir / "plain"), "--metrics-address", ""))  # fmt: skip
    assert f"{short_dir / 'plain'} (or a directory above it) is a file, not a directory" in line
    assert "File exists" not in line


def test_doctor_as_non_root_says_so_in_its_checks(short_dir: Path) -> None:
    short_dir.chmod(0o755)
    kubelet_dir = short_dir / "kubelet" / "device-plugins"
    kubelet_dir.mkdir(parents=True)
    (short_dir / "kubelet").chmod(0o700)
    result = _as_nobody("doctor", "--kubelet-dir", str(kubelet_dir), "--metrics-address", "",
                        "--npu-smi", str(short_dir / "none"))  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "kubelet socket: cannot look at" in result.stdout
    assert "run the doctor as root" in result.stdout


@pytest.mark.parametrize("kind", ["missing", "not executable", "directory"])
def test_an_explicit_npu_smi_that_cannot_run_is_bad_usage(short_dir: Path, kind: str) -> None:
    host = HostTree(short_dir / "host").add_driver().add_management().add_chips(range(2))
    given = short_dir / "npu-smi"
    if kind == "not executable":
        given.write_text("#!/bin/sh\n")
    elif kind == "directory":
        given.mkdir()
    line = _one_line(run_cli("list", "--backend", "devfs", "--host-root", str(host.root),
                             "--npu-smi", str(given)))  # fmt: skip
    assert line.startswith(f"ascend-agent: --npu-smi {given}: ")
    assert {"missing": "no such file", "not executable": "not executable", "directory": "is a directory"}[
        kind
    ] in line
