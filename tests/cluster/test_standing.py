"""`make cluster`'s program (tests/cluster/standing.py) as a person uses it: it prints a kubectl for the node
and `ready`, that kubectl sees the node and the agent's pod, and SIGTERM tears everything down and exits 0.
It runs before the other modules start their cluster (conftest.py puts it first): one kubelet at a time."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.cluster.devices import DEV
from tests.cluster.harness import NODE_NAME, kubelet_answers

pytestmark = pytest.mark.e2e_cluster


# What _lines puts once the program's output has ended.
ENDED = "(its output ended)"


def _lines(stream: object, into: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line.rstrip("\n"))
    into.put(ENDED)


def _exit(standing: subprocess.Popen[str]) -> str:
    """How the program ended, with what it said on stderr."""
    status = standing.wait(60)
    return f"exited {status}: {standing.stderr.read() if standing.stderr else ''}"


def test_make_cluster_prints_a_kubectl_then_ready_and_sigterm_leaves_nothing(k8s_binary: Path) -> None:
    images = [path for path in os.environ.get("E2E_IMAGES", "").split(":") if path]
    assert images, "E2E_IMAGES names no image archive: `make e2e` passes the agent's"
    standing = subprocess.Popen(
        [sys.executable, "-m", "tests.cluster.standing", str(k8s_binary), images[0]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    said: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(standing.stdout, said), daemon=True).start()
    try:
        first = said.get(timeout=600)
        assert first.startswith("kubectl: "), first if first != ENDED else _exit(standing)
        second = said.get(timeout=60)
        assert second == "ready", second if second != ENDED else _exit(standing)
        kubectl = first.removeprefix("kubectl: ")
        nodes = subprocess.run([kubectl, "get", "nodes", "-o", "name"], capture_output=True, text=True,
                               timeout=60, check=True)  # fmt: skip
        assert nodes.stdout.split() == [f"node/{NODE_NAME}"]
        phases = subprocess.run(
            [kubectl, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=ascend-agent",
             "-o", "jsonpath={.items[*].status.phase}"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert phases.stdout.split() == ["Running"]
        standing.send_signal(signal.SIGTERM)
        assert standing.wait(300) == 0, standing.stderr.read() if standing.stderr else ""
        assert not kubelet_answers()
        assert not (DEV / "davinci0").exists()
        assert not Path(kubectl).exists(), "its work directory is left"
    finally:
        if standing.poll() is None:
            standing.send_signal(signal.SIGTERM)
            standing.wait(300)
