"""`make cluster`: the real node of `make e2e` kept up for a person. The cluster starts on containerd, the
agent's image is imported, the chart is installed with Helm's engine over the node's driver tree (eight 910B4
stand-ins), and two lines are printed once the agent is registered::

    kubectl: /tmp/ae2e-xxxx/kubectl
    ready

That executable runs kubectl against this cluster from the host's shell (it enters the cluster's network
namespace). SIGINT or SIGTERM tears everything down, as `make e2e` does, and exits 0. Where a kubelet already
answers, one line and exit 2.

    python -m tests.cluster.standing K8S_BINARY IMAGE_ARCHIVE
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from tests.cluster import helm
from tests.cluster.harness import Cluster, ClusterError, KubeletPresent
from tests.cluster.node import wait_allocatable
from tests.cluster.released import DriverTree, agent_pod, chart_values, released, remove_applied_chart
from tests.cluster.runtime import RuntimeProblem, binaries

USAGE = "usage: python -m tests.cluster.standing K8S_BINARY IMAGE_ARCHIVE"


def kubectl_for(cluster: Cluster) -> Path:
    """An executable in the work directory that runs this cluster's kubectl as its admin."""
    path = cluster.work / "kubectl"
    kubectl = [str(cluster.binary), "kubectl", f"--kubeconfig={cluster.admin_kubeconfig}"]
    argv = " ".join(cluster.in_netns(kubectl))
    path.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
    path.chmod(0o755)
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    cluster = Cluster(Path(argv[0]), runtime_tools=binaries(), images=(Path(argv[1]),))
    try:
        cluster.start()
        remove_applied_chart(cluster)
        released(helm.install(cluster, chart_values(cluster, DriverTree.make(cluster))))
        agent_pod(cluster)
        wait_allocatable(cluster, "8")
        print(f"kubectl: {kubectl_for(cluster)}", flush=True)
        print("ready", flush=True)
        stop.wait()
        return 0
    except KubeletPresent as refused:
        print(f"make cluster: {refused}", file=sys.stderr)
        return 2
    except (ClusterError, RuntimeProblem, AssertionError) as failed:
        print(f"make cluster: {failed}", file=sys.stderr)
        return 1
    finally:
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_IGN)  # the teardown is not cut short
        problems = cluster.stop() + cluster.leftovers()
        if problems:
            print("make cluster: left behind:\n" + "\n".join(problems), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
