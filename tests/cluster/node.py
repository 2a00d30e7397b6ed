"""The node's chip count as the API server holds it, waited for; kubectl watches read line by line."""

from __future__ import annotations

import subprocess

from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.pods import RESOURCE

# kubectl's JSONPath: the dot in the resource's name escaped.
CAPACITY_PATH = "{.status.capacity." + RESOURCE.replace(".", "\\.") + "}"


def allocatable_path(resource: str) -> str:
    """kubectl's JSONPath of the node's allocatable ``resource``: the dot in its name escaped."""
    return "{.status.allocatable." + resource.replace(".", "\\.") + "}"


def wait_allocatable(cluster: Cluster, count: str, resource: str = RESOURCE) -> None:
    cluster.kubectl(
        "wait",
        f"node/{NODE_NAME}",
        f"--for=jsonpath={allocatable_path(resource)}={count}",
        "--timeout=60s",
        timeout=90,
    )


def kubectl_watch(cluster: Cluster, *args: str) -> subprocess.Popen[str]:
    """``kubectl get ARGS`` as a process in the cluster's network namespace, its output read line by line."""
    return subprocess.Popen(
        cluster.in_netns(
            [str(cluster.binary), "kubectl", f"--kubeconfig={cluster.admin_kubeconfig}", "get", *args]
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def watch_capacity(cluster: Cluster) -> subprocess.Popen[str]:
    """``kubectl get node --watch``: one line ``CAPACITY ALLOCATABLE`` per change, the node as it is first."""
    return kubectl_watch(
        cluster,
        "node",
        NODE_NAME,
        "--watch",
        "-o",
        f'jsonpath={CAPACITY_PATH} {allocatable_path(RESOURCE)}{{"\\n"}}',
    )
