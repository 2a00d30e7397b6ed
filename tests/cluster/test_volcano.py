"""`--volcano` (the chart's Volcano values) under the real API server and kubelet: no Volcano scheduler runs,
so the pod is bound to the node directly and carries the annotations Volcano's ascend plugin would write; the
kubelet's Allocate gets the chips those annotations name, and the marks the agent writes back (and its
device-info ConfigMap and Node annotation) pass the real API server's validation and the chart's RBAC. The
pod's configuration carries the Node's InternalIP, and `ascend-agent ranktable` with the chart's token prints
a valid v1.0 rank-table part with the pod's real IP."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.cluster.agent import RENDERS, apply_chart, running_agent
from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.node import wait_allocatable
from tests.cluster.pods import (
    RESOURCE,
    chip_devices,
    one_pod_spec,
    runtime_spec,
    spec_envs,
    wait_running,
)
from tests.cluster.polling import poll
from tests.support.agent_process import AgentProcess
from tests.support.hccl import gather, hccl_json

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
        fakeTraining=True,
    ) as process:
        yield process


def test_the_chips_volcano_chose_and_the_marks_written_back(
    cluster: Cluster, volcano_agent: AgentProcess
) -> None:
    wait_allocatable(cluster, "8")
    pod = one_pod_spec("placed", "placed", 2)
    pod["metadata"]["annotations"] = {
        RESOURCE: "Ascend910-3,Ascend910-5",
        "predicate-time": "1700000000000",
        "hccl/rankIndex": "0",
    }
    pod["spec"]["schedulerName"] = "volcano"  # only pods Volcano placed name their chips
    pod["spec"]["nodeName"] = NODE_NAME  # bound as Volcano binds it
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        wait_running(cluster, "placed")
        spec = runtime_spec(cluster, "placed", "placed")
        assert chip_devices(spec) == {"/dev/davinci3", "/dev/davinci5"}, spec["linux"].get("devices")
        assert spec_envs(spec)["ASCEND_VISIBLE_DEVICES"] == "3,5"
        annotations: dict[str, str] = poll(
            lambda: json.loads(cluster.kubectl("get", "pod", "placed", "-o", "json").stdout)["metadata"].get(
                "annotations", {}
            ),
            lambda got: got.get("huawei.com/AscendReal") is not None,
        )
        assert annotations.get("huawei.com/AscendReal") == "Ascend910-3,Ascend910-5", annotations
        assert annotations.get("predicate-time") == "18446744073709551615", annotations
        _the_rank_table(cluster, annotations)
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


def _the_rank_table(cluster: Cluster, annotations: dict[str, str]) -> None:
    """The configuration's host_ip is the Node's InternalIP; `ascend-agent ranktable` (the chart's token, its
    RBAC) prints the pod's part of a v1.0 table with the pod's IP."""
    node = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    configuration = json.loads(annotations["ascend.kubectl.kubernetes.io/ascend-910-configuration"])
    assert configuration["host_ip"] == configuration["server_ip"] == internal[0], configuration
    pod = json.loads(cluster.kubectl("get", "pod", "placed", "-o", "json").stdout)
    argv = [sys.executable, "-m", "ascend_agent", "ranktable", "--pod", "default/placed"]
    argv += ["--kubeconfig", str(cluster.work / "agent.kubeconfig"), "--node-name", NODE_NAME]
    printed = subprocess.run(cluster.in_netns(argv), capture_output=True, text=True, timeout=60, check=False)
    assert printed.returncode == 0 and printed.stderr == "", printed.stderr
    table = hccl_json(gather([json.loads(printed.stdout)]), "1.0")
    (server,) = table["server_list"]
    assert (server["host_ip"], server["container_ip"]) == (internal[0], pod["status"]["podIP"])
    assert [(d["device_id"], d["rank_id"]) for d in server["device"]] == [("3", "0"), ("5", "1")]
