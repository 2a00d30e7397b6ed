"""A kubelet directory the agent cannot serve in: it retries, /readyz says the OS reason, then it exits 1 with
one line, so that Kubernetes shows the reason instead of a pod that runs and is never ready."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from tests.support.agent_process import AgentProcess
from tests.support.http_probe import free_port


def test_a_plain_file_as_kubelet_dir_is_retried_then_ends_the_agent(short_dir: Path) -> None:
    kubelet_dir = short_dir / "device-plugins"
    kubelet_dir.write_text("not a directory\n")
    port = free_port()
    process = AgentProcess(
        [
            "run",
            "--backend",
            "fake",
            "--kubelet-dir",
            str(kubelet_dir),
            "--plugin-dir",
            str(short_dir / "own"),
            "--metrics-address",
            f"127.0.0.1:{port}",
            "--serve-timeout",
            "2",
            "--log-level",
            "debug",
        ]
    )
    try:
        process.wait_log("Cannot serve huawei.com/Ascend910 on .*: Not a directory")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
            raise AssertionError("/readyz answered 200 while nothing can be served")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
            assert "Not a directory" in exc.read().decode()
        code = process.proc.wait(15)
        assert code == 1
        (last,) = process.matching("Giving up")
        assert "Not a directory" in last and "mounted read-write" in last
        assert "Traceback" not in process.output
    finally:
        process.close()
