"""The agent as a DRA driver (the chart's DRA values) under the real API server, scheduler and kubelet: its
ResourceSlice accepted, the DeviceClasses of examples/dra applied and their CEL evaluated by the scheduler, a
claim prepared by the kubelet's DRA manager with the CDI devices in the recorded container, and a pod asking
for `huawei.com/Ascend910` through the DeviceClass's extendedResourceName."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.cluster.agent import DRA_DRIVER as DRIVER
from tests.cluster.agent import fake_dra_agent
from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.pods import IMAGE, claim_pod, one_pod_spec, recorded_containers, wait_running
from tests.cluster.polling import poll
from tests.support.agent_process import AgentProcess

pytestmark = pytest.mark.e2e_cluster


@pytest.fixture(scope="module")
def dra_agent(cluster: Cluster) -> Iterator[AgentProcess]:
    with fake_dra_agent(cluster, "agent-dra", cluster.work / "fake-state-dra.json") as process:
        yield process


def node_slices(cluster: Cluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)[
        "items"
    ]
    return [s for s in items if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE_NAME]


def test_the_resourceslice_is_accepted(cluster: Cluster, dra_agent: AgentProcess) -> None:
    slices = poll(lambda: node_slices(cluster), bool)
    assert slices, dra_agent.output[-3000:]
    devices = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert len(devices) == 8, devices


def test_a_claim_from_a_template_is_scheduled_prepared_and_in_the_container(
    cluster: Cluster, dra_agent: AgentProcess
) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-910b4", "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "npu", "exactly": {"deviceClassName": "ascend910b4"}}]}
            }
        },
    }
    pod = one_pod_spec("claims-one", "claimer", 1)
    container = pod["spec"]["containers"][0]
    del container["resources"]
    container["resources"] = {"claims": [{"name": "npu"}]}
    pod["spec"]["resourceClaims"] = [{"name": "npu", "resourceClaimTemplateName": "one-910b4"}]
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(template))
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        wait_running(cluster, "claims-one")
        (request,) = recorded_containers(cluster, "claimer")
        # protobuf's JSON name of CRI's CDI_devices field
        cdi = [d["name"] for d in request["config"].get("CDIDevices", [])]
        assert len(cdi) == 1 and cdi[0].startswith(f"{DRIVER}/claim="), request["config"]
        # The runtime would resolve that name in the CDI spec the agent wrote for the claim.
        device = cdi[0].split("=", 1)[1]
        specs = [yaml.safe_load(p.read_text()) for p in (cluster.work / "cdi").glob("*")]
        named = [d for spec in specs for d in spec.get("devices", []) if d["name"] == device]
        assert len(named) == 1, specs
        nodes = [n["path"] for n in named[0]["containerEdits"].get("deviceNodes", [])]
        assert any(re.fullmatch(r"/dev/davinci\d+", n) for n in nodes), named
    finally:
        cluster.kubectl(
            "delete", "pod", "claims-one", "--wait=true", "--timeout=60s", check=False, timeout=90
        )
    # Unprepare (the kubelet's, after the pod is gone) removes the claim's spec.
    dra_agent.wait_log("Unprepared claim default/claims-one-npu", timeout=60)
    left = [p.name for p in (cluster.work / "cdi").glob("*") if device in p.read_text()]
    assert not left, left


def test_a_pod_asking_for_the_extended_resource_runs_on_the_dra_node(
    cluster: Cluster, dra_agent: AgentProcess
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "extended", "namespace": "default"},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "ext", "image": IMAGE, "resources": {"limits": {"huawei.com/Ascend910": "1"}}}
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        wait_running(cluster, "extended")
        (request,) = recorded_containers(cluster, "ext")
        cdi = [d["name"] for d in request["config"].get("CDIDevices", [])]
        assert len(cdi) == 1 and cdi[0].startswith(f"{DRIVER}/claim="), request["config"]
    finally:
        cluster.kubectl("delete", "pod", "extended", "--wait=true", "--timeout=60s", check=False, timeout=90)


def test_a_tainted_chip_is_never_allocated(cluster: Cluster, dra_agent: AgentProcess) -> None:
    """Chip 3 Unhealthy: its device in the ResourceSlice is tainted; a claim of eight cannot be allocated, a
    claim of seven gets every chip but that one."""
    (cluster.work / "fake-state-dra.json").write_text(json.dumps({"unhealthy": [3]}))
    try:
        tainted = poll(
            lambda: [
                d["name"]
                for s in node_slices(cluster)
                for d in s["spec"].get("devices", [])
                if d.get("taints")
            ],
            bool,
        )
        assert len(tainted) == 1, node_slices(cluster)
        claim_pod(cluster, "eight", count=8)
        cluster.kubectl(
            "wait",
            "pod/eight",
            "--for=jsonpath={.status.conditions[?(@.type=='PodScheduled')].reason}=Unschedulable",
            "--timeout=60s",
            timeout=90,
        )
        cluster.kubectl("delete", "pod", "eight", "--wait=true", "--timeout=60s", timeout=90)
        claim_pod(cluster, "seven", count=7)
        wait_running(cluster, "seven")
        (request,) = recorded_containers(cluster, "seven")
        names = {d["name"].split("=", 1)[1] for d in request["config"].get("CDIDevices", [])}
        specs = [yaml.safe_load(p.read_text()) for p in (cluster.work / "cdi").glob("*")]
        edits = [d["containerEdits"] for spec in specs for d in spec.get("devices", []) if d["name"] in names]
        nodes = {n["path"] for e in edits for n in e.get("deviceNodes", [])}
        chips = {n for n in nodes if re.fullmatch(r"/dev/davinci\d+", n)}
        assert len(chips) == 7 and "/dev/davinci3" not in chips, sorted(nodes)
    finally:
        for name in ("eight", "seven"):
            cluster.kubectl("delete", "pod", name, "--wait=true", "--timeout=60s", check=False, timeout=90)
        (cluster.work / "fake-state-dra.json").write_text("{}")
