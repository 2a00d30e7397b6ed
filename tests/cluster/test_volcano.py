"""`--volcano` (the chart's Volcano values) under the real API server and kubelet: no Volcano scheduler runs,
so the pod is bound to the node directly and carries the annotations Volcano's ascend plugin would write; the
kubelet's Allocate gets the chips those annotations name, and the marks the agent writes back (and its
device-info ConfigMap and Node annotation) pass the real API server's validation and the chart's RBAC."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.cluster.agent import RENDERS, apply_chart, running_agent
from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.node import wait_allocatable
from tests.cluster.pods import (
    RESOURCE,
    chip_devices,
    one_pod_spec,
    recorded_containers,
    recorded_envs,
    wait_running,
)
from tests.support.agent_process import AgentProcess

pytestmark = pytest.mark.e2e_cluster

RENDER = RENDERS / "volcano.yaml"


@pytest.fixture(scope="module")
def volcano_agent(cluster: Cluster) -> Iterator[AgentProcess]:
    apply_chart(cluster, RENDER)
    with running_agent(
        cluster,
        "agent-volcano",
        RENDER,
        registered=f"Registered resource {RESOURCE}",
        backend="fake",
        fakeChips=8,
        fakeModel="910B4",
    ) as process:
        yield process


def test_the_chips_volcano_chose_and_the_marks_written_back(
    cluster: Cluster, volcano_agent: AgentProcess
) -> None:
    wait_allocatable(cluster, "8")
    pod = one_pod_spec("placed", "placed", 2)
    pod["metadata"]["annotations"] = {RESOURCE: "Ascend910-3,Ascend910-5", "predicate-time": "1700000000000"}
    pod["spec"]["schedulerName"] = "volcano"  # only pods Volcano placed name their chips
    pod["spec"]["nodeName"] = NODE_NAME  # bound as Volcano binds it
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        wait_running(cluster, "placed")
        (request,) = recorded_containers(cluster, "placed")
        assert chip_devices(request) == {"/dev/davinci3", "/dev/davinci5"}, request["config"].get("devices")
        assert recorded_envs(request)["ASCEND_VISIBLE_DEVICES"] == "3,5"
        deadline = time.monotonic() + 60
        annotations: dict[str, str] = {}
        while annotations.get("huawei.com/AscendReal") is None and time.monotonic() < deadline:
            time.sleep(0.5)
            got = json.loads(cluster.kubectl("get", "pod", "placed", "-o", "json").stdout)
            annotations = got["metadata"].get("annotations", {})
        assert annotations.get("huawei.com/AscendReal") == "Ascend910-3,Ascend910-5", annotations
        assert annotations.get("predicate-time") == "18446744073709551615", annotations
    finally:
        cluster.kubectl("delete", "pod", "placed", "--wait=true", "--timeout=60s", check=False, timeout=90)
    configmap = json.loads(
        cluster.kubectl(
            "get", "configmap", f"mindx-dl-deviceinfo-{NODE_NAME}", "-n", "kube-system", "-o", "json"
        ).stdout
    )
    assert "DeviceInfoCfg" in configmap["data"]
    node = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    assert "baseDeviceInfos" in node["metadata"].get("annotations", {}), node["metadata"].get("annotations")
