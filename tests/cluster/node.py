"""The node's chip count as the API server holds it: waited for, and watched line by line."""

from __future__ import annotations

import subprocess

from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.pods import RESOURCE

# kubectl's JSONPath: the dot in the resource's name escaped.
ALLOCATABLE_PATH = "{.status.allocatable." + RESOURCE.replace(".", "\\.") + "}"
CAPACITY_PATH = "{.status.capacity." + RESOURCE.replace(".", "\\.") + "}"


def wait_allocatable(cluster: Cluster, count: str) -> None:
    cluster.kubectl(
        "wait",
        f"node/{NODE_NAME}",
        f"--for=jsonpath={ALLOCATABLE_PATH}={count}",
        "--timeout=60s",
        timeout=90,
    )


def watch_capacity(cluster: Cluster) -> subprocess.Popen[str]:
    """``kubectl get node --watch``: one line ``CAPACITY ALLOCATABLE`` per change, the node as it is first."""
    return subprocess.Popen(
        cluster.in_netns(
            [
                str(cluster.binary),
                "kubectl",
                f"--kubeconfig={cluster.admin_kubeconfig}",
                "get",
                "node",
                NODE_NAME,
                "--watch",
                "-o",
                f'jsonpath={CAPACITY_PATH} {ALLOCATABLE_PATH}{{"\\n"}}',
            ]
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
