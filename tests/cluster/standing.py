"""`make cluster`: the real node of `make e2e` kept up for a person. The cluster starts on containerd, the
agent's image is imported, the chart is installed with Helm's engine over the node's driver tree (eight 910B4
stand-ins), and two lines are printed once the agent is registered::

    kubectl: /tmp/ae2e-xxxx/kubectl
    ready

That executable runs kubectl against this cluster from the host's shell (it enters the cluster's network
namespace; root). SIGINT (Ctrl-C: on a terminal this process takes the terminal's foreground, so that make,
which started it, is not interrupted) or SIGTERM tears everything down, as `make e2e` does, and exits 0, also
when it comes while the cluster starts. Where a kubelet already answers, one line and exit 2 (``--check``
says so before anything is built).

    python -m tests.cluster.standing --check
    python -m tests.cluster.standing K8S_BINARY IMAGE_ARCHIVE
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tests.cluster import helm
from tests.cluster.harness import KUBELET_SOCKET, Cluster, ClusterError, KubeletPresent, kubelet_answers
from tests.cluster.node import wait_allocatable
from tests.cluster.released import DriverTree, agent_pod, chart_values, released, remove_applied_chart
from tests.cluster.runtime import RuntimeProblem, binaries

USAGE = "usage: python -m tests.cluster.standing --check | K8S_BINARY IMAGE_ARCHIVE"
REFUSED = 2


def kubectl_for(cluster: Cluster) -> Path:
    """An executable in the work directory that runs this cluster's kubectl as its admin."""
    path = cluster.work / "kubectl"
    kubectl = [str(cluster.binary), "kubectl", f"--kubeconfig={cluster.admin_kubeconfig}"]
    path.write_text(f'#!/bin/sh\nexec {shlex.join(cluster.in_netns(kubectl))} "$@"\n')
    path.chmod(0o755)
    return path


def take_the_terminal() -> Callable[[], None]:
    """On a terminal, this process in a process group of its own made the terminal's foreground: Ctrl-C
    reaches it alone (make would otherwise die of the SIGINT too and report an interrupt). Returns what hands
    the terminal back."""
    try:
        terminal = os.open("/dev/tty", os.O_RDWR)
    except OSError:
        return lambda: None
    try:
        before = os.tcgetpgrp(terminal)
        os.setpgid(0, 0)
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may set the foreground so
        os.tcsetpgrp(terminal, os.getpgrp())
    except OSError:
        os.close(terminal)
        return lambda: None

    def hand_back() -> None:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(terminal, before)
        os.close(terminal)

    return hand_back


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        if kubelet_answers():
            print(
                f"make cluster: a kubelet already answers at {KUBELET_SOCKET}; stop it first", file=sys.stderr
            )
            return REFUSED
        return 0
    if len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return REFUSED
    if not helm.HELM_PYTHON.exists():
        print(f"make cluster: {helm.HELM_PYTHON} is missing: `make cluster` makes it", file=sys.stderr)
        return 1
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    hand_back = take_the_terminal()
    cluster: Cluster | None = None
    try:
        cluster = Cluster(Path(argv[0]), binaries(), images=(Path(argv[1]),))
        cluster.start()
        remove_applied_chart(cluster)
        released(helm.install(cluster, chart_values(cluster, DriverTree.make(cluster))))
        agent_pod(cluster)
        wait_allocatable(cluster, "8")
        if not stop.is_set():
            print(f"kubectl: {kubectl_for(cluster)}", flush=True)
            print("ready", flush=True)
        stop.wait()
        return 0
    except KubeletPresent as refused:
        print(f"make cluster: {refused}", file=sys.stderr)
        return REFUSED
    except (ClusterError, RuntimeProblem, AssertionError, OSError) as failed:
        if stop.is_set():  # a stop asked for while it started: the step it cut short failed
            return 0
        print(f"make cluster: {' '.join(str(failed).split())[:2000]}", file=sys.stderr)
        return 1
    finally:
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_IGN)  # the teardown is not cut short
        if cluster is not None:
            problems = cluster.stop() + cluster.leftovers()
            if problems:
                print("make cluster: left behind: " + "; ".join(problems), file=sys.stderr)
        hand_back()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
