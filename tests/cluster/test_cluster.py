"""The cluster itself: the components up, the node Ready, the release asked for (go.mod's, or K8S_VERSION),
the kubelet on containerd with pods on the cluster's own network."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import NODE_NAME, Cluster, kubelet_answers
from tests.cluster.pods import container, wait_running
from tests.cluster.runtime import POD_SUBNET
from tests.cluster.versions import expected_release

pytestmark = pytest.mark.e2e_cluster

CONTAINERD_VERSION = re.search(
    r"CONTAINERD_VERSION:-(v[\d.]+)", (Path(__file__).parent / "runtime" / "build.sh").read_text()
)[1]  # type: ignore[index]


def plain_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [container(name)]},
    }


def test_the_node_is_ready_and_runs_the_kubelet_asked_for(cluster: Cluster) -> None:
    node = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", node["status"]["conditions"]
    assert node["status"]["nodeInfo"]["kubeletVersion"] == expected_release()


def test_the_apiserver_reports_the_release_asked_for(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == expected_release()
    assert version["clientVersion"]["gitVersion"] == expected_release()


def test_the_kubelet_runs_on_containerd_and_pods_get_addresses_inside_the_cluster(cluster: Cluster) -> None:
    node = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    served = cluster.runtime.ctr("version").stdout.split("Server:")[1]
    (version,) = re.findall(r"Version:\s+(\S+)", served)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"] == f"containerd://{version}"
    assert version.startswith(CONTAINERD_VERSION.removeprefix("v")), version
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(plain_pod("addressed")))
    try:
        wait_running(cluster, "addressed")
        pod = json.loads(cluster.kubectl("get", "pod", "addressed", "-o", "json").stdout)
        address = ipaddress.ip_address(pod["status"]["podIP"])
        assert address in ipaddress.ip_network(POD_SUBNET), address
        # From inside the pod the API server answers at the kubernetes Service's address, as pods are told.
        reached = cluster.kubectl(
            "exec", "addressed", "--", "python3", "-c",
            "import os, socket; socket.create_connection((os.environ['KUBERNETES_SERVICE_HOST'], "
            "int(os.environ['KUBERNETES_SERVICE_PORT'])), timeout=10).close(); print('reached')",
        )  # fmt: skip
        assert reached.stdout.strip() == "reached"
    finally:
        cluster.kubectl("delete", "pod", "addressed", "--wait=true", "--timeout=60s", check=False, timeout=90)


def test_make_cluster_where_a_kubelet_answers_says_so_in_one_line_and_exits_2(cluster: Cluster) -> None:
    """`make cluster` run beside this cluster: refused at once, nothing of the running one touched."""
    answer = subprocess.run(
        [sys.executable, "-m", "tests.cluster.standing", str(cluster.binary), "/nonexistent.tar"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert answer.returncode == 2, answer
    assert answer.stdout == "", answer.stdout
    lines = answer.stderr.splitlines()
    assert len(lines) == 1, answer.stderr
    (line,) = lines
    assert line.startswith("make cluster: a kubelet already answers at /var/lib/kubelet/"), line
    assert cluster.kubectl("get", "--raw=/readyz").stdout.strip() == "ok"
    assert kubelet_answers() and cluster.runtime.ctr("version", check=False).returncode == 0
