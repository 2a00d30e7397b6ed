"""The cluster itself: the components up, the node Ready, the version pinned in go.mod."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cluster.harness import NODE_NAME, Cluster

pytestmark = pytest.mark.e2e_cluster

GO_MOD = Path(__file__).with_name("go.mod")


def pinned_version() -> str:
    match = re.search(r"k8s\.io/kubernetes (v1\.\d+\.\d+)", GO_MOD.read_text())
    assert match is not None
    return match.group(1)


def test_the_node_is_ready_and_runs_the_pinned_kubelet(cluster: Cluster) -> None:
    node = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True", node["status"]["conditions"]
    assert node["status"]["nodeInfo"]["kubeletVersion"] == pinned_version()


def test_the_apiserver_reports_the_pinned_version(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == pinned_version()
    assert version["clientVersion"]["gitVersion"] == pinned_version()
