"""The kubelet's own directories are never made by the agent: on a node where they are missing it waits for
them (inotify on the nearest parent that exists), /readyz and the log say so, and it registers once the
kubelet makes them and listens."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.support.agent_process import AgentProcess
from tests.support.http_probe import free_port, wait_answer
from tests.support.kubelet_standin import KubeletStandin


def test_a_missing_kubelet_directory_is_waited_for_not_made(
    kubelet_api: tuple[ModuleType, ModuleType], short_dir: Path
) -> None:
    root = short_dir / "var-lib-kubelet"
    kubelet_dir = root / "device-plugins"
    port = free_port()
    agent = AgentProcess(["run", "--backend", "fake", "--kubelet-dir", str(kubelet_dir),
                          "--metrics-address", f"127.0.0.1:{port}"])  # fmt: skip
    try:
        agent.wait_log(f"Waiting for the kubelet's directory {kubelet_dir} to appear")
        status, body = wait_answer(port, "/readyz", lambda status, _: status is not None, what="an answer")
        assert status == 503
        assert f"waiting for the kubelet's directory {kubelet_dir} to appear" in body
        assert not root.exists(), "the agent made the kubelet's directory"
        assert agent.proc.poll() is None, agent.output
        root.mkdir()
        kubelet_dir.mkdir()
        agent.wait_log(f"Waiting for the kubelet's directory {root / 'plugins'} to appear")
        assert not (root / "plugins").exists(), "the agent made the kubelet's plugins directory"
        kubelet = KubeletStandin(kubelet_dir, *kubelet_api)  # type: ignore[arg-type]
        kubelet.start()
        try:
            kubelet.wait_registrations(1)
            assert (root / "plugins" / "ascend-agent" / "agent.lock").exists()
            wait_answer(port, "/readyz", lambda status, _: status == 200, what="ready")
        finally:
            kubelet.stop()
        code, _ = agent.terminate()
        assert code == 0, agent.output
    finally:
        agent.close()


def test_a_kubelet_directory_that_is_there_is_not_waited_for(kubelet: KubeletStandin) -> None:
    agent = AgentProcess(["run", "--backend", "fake", "--kubelet-dir", str(kubelet.directory),
                          "--metrics-address", ""])  # fmt: skip
    try:
        kubelet.wait_registrations(1)
        assert not agent.matching("Waiting for the kubelet's directory")
    finally:
        agent.close()
