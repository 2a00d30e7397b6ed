"""The agent as a DRA driver (the chart's DRA values) under the real API server, scheduler and kubelet: its
ResourceSlice accepted, the DeviceClasses of examples/dra applied and their CEL evaluated by the scheduler, a
claim prepared by the kubelet's DRA manager and its chip in the container containerd made from the CDI spec
the agent wrote, and a pod asking for `huawei.com/Ascend910` through the DeviceClass's
extendedResourceName."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.cluster.agent import DRA_DRIVER as DRIVER
from tests.cluster.agent import fake_dra_agent
from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.pods import (
    chip_devices,
    claim_pod,
    claim_uids,
    container,
    one_pod_spec,
    runtime_spec,
    wait_running,
    wait_unschedulable,
)
from tests.cluster.polling import poll
from tests.cluster.versions import needs_newer, server_release
from tests.support.agent_process import AgentProcess

pytestmark = [pytest.mark.e2e_cluster, pytest.mark.kubernetes("1.34", "resource.k8s.io/v1, GA from 1.34")]


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
        (uid,) = claim_uids(cluster, "claims-one")
        # containerd resolved the claim's CDI device in the spec the agent wrote for it: the chip it names is
        # the container's one chip.
        (chip,) = chip_devices(runtime_spec(cluster, "claims-one", "claimer"))
        specs = [yaml.safe_load(p.read_text()) for p in cluster.cdi_dir.glob("*") if uid in p.read_text()]
        named = [d for spec in specs for d in spec.get("devices", []) if d["name"].startswith(uid)]
        assert len(named) == 1, specs
        nodes = [n["path"] for n in named[0]["containerEdits"].get("deviceNodes", [])]
        assert chip in nodes, named
    finally:
        cluster.kubectl(
            "delete", "pod", "claims-one", "--wait=true", "--timeout=60s", check=False, timeout=90
        )
    # Unprepare (the kubelet's, after the pod is gone) removes the claim's spec.
    dra_agent.wait_log("Unprepared claim default/claims-one-npu", timeout=60)
    left = [p.name for p in cluster.cdi_dir.glob("*") if uid in p.read_text()]
    assert not left, left


@pytest.mark.kubernetes("1.36", "extended resources through DRA, beta and on by default from 1.36")
def test_a_pod_asking_for_the_extended_resource_runs_on_the_dra_node(
    cluster: Cluster, dra_agent: AgentProcess
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "extended", "namespace": "default"},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 2,
            "containers": [container("ext", resources={"limits": {"huawei.com/Ascend910": "1"}})],
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        wait_running(cluster, "extended")
        # The scheduler made a claim for the extended resource, which the driver prepared: its chip is in
        # the container (the node has no device plugin).
        status = json.loads(cluster.kubectl("get", "pod", "extended", "-o", "json").stdout)["status"]
        assert status.get("extendedResourceClaimStatus", {}).get("resourceClaimName"), status
        assert len(chip_devices(runtime_spec(cluster, "extended", "ext"))) == 1
    finally:
        cluster.kubectl("delete", "pod", "extended", "--wait=true", "--timeout=60s", check=False, timeout=90)


def test_a_tainted_chip_is_never_allocated(cluster: Cluster, dra_agent: AgentProcess) -> None:
    """Chip 3 Unhealthy: its device in the ResourceSlice is tainted (from 1.36, where device taints are on by
    default; before, the API server drops taints and the device is left out instead); a claim of eight cannot
    be allocated, a claim of seven gets every chip but that one."""
    (cluster.work / "fake-state-dra.json").write_text(json.dumps({"unhealthy": [3]}))
    try:
        if needs_newer(server_release(cluster), "1.36"):

            def names() -> set[str]:
                return {d["name"] for s in node_slices(cluster) for d in s["spec"].get("devices", [])}

            left = poll(names, lambda found: len(found) == 7)
            assert len(left) == 7 and "npu-3" not in left, left
            dra_agent.wait_log("dropped the device taints of ResourceSlice", timeout=30)
        else:
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
        wait_unschedulable(cluster, "eight")
        cluster.kubectl("delete", "pod", "eight", "--wait=true", "--timeout=60s", timeout=90)
        claim_pod(cluster, "seven", count=7)
        wait_running(cluster, "seven")
        chips = chip_devices(runtime_spec(cluster, "seven", "seven"))
        assert len(chips) == 7 and "/dev/davinci3" not in chips, sorted(chips)
    finally:
        for name in ("eight", "seven"):
            cluster.kubectl("delete", "pod", name, "--wait=true", "--timeout=60s", check=False, timeout=90)
        (cluster.work / "fake-state-dra.json").write_text("{}")


def test_a_claim_aligned_on_the_standard_pcie_root_gets_chips_of_one_root(
    cluster: Cluster, dra_agent: AgentProcess
) -> None:
    """Every device carries Kubernetes' standard ``resource.kubernetes.io/pcieRoot`` and ``numaNode``; a claim
    of four chips with ``matchAttribute`` on the root (as one aligning a chip with a NIC of another driver
    does) is allocated by the scheduler four chips under one root."""
    slices = poll(lambda: node_slices(cluster), bool)
    attributes = {d["name"]: d["attributes"] for s in slices for d in s["spec"].get("devices", [])}
    roots = {name: a["resource.kubernetes.io/pcieRoot"]["string"] for name, a in attributes.items()}
    numa = {name: a["resource.kubernetes.io/numaNode"]["int"] for name, a in attributes.items()}
    assert len(set(roots.values())) == 2 and set(numa.values()) == {0, 1}, attributes
    request = {"deviceClassName": "ascend910b4", "allocationMode": "ExactCount", "count": 4}
    constraint = {"requests": ["npus"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-root", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "npus", "exactly": request}]}}},
    }
    pod = one_pod_spec("one-root", "aligned", 1)
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "npus"}]}
    pod["spec"]["resourceClaims"] = [{"name": "npus", "resourceClaimTemplateName": "one-root"}]
    template["spec"]["spec"]["devices"]["constraints"] = [constraint]
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(template))
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        wait_running(cluster, "one-root")
        status = json.loads(cluster.kubectl("get", "pod", "one-root", "-o", "json").stdout)["status"]
        (name,) = [s["resourceClaimName"] for s in status["resourceClaimStatuses"]]
        claim = json.loads(cluster.kubectl("get", "resourceclaim", name, "-o", "json").stdout)
        devices = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
        assert len(devices) == 4 and len({roots[d] for d in devices}) == 1, (devices, roots)
        assert len(chip_devices(runtime_spec(cluster, "one-root", "aligned"))) == 4
    finally:
        cluster.kubectl("delete", "pod", "one-root", "--wait=true", "--timeout=60s", check=False, timeout=90)
        cluster.kubectl("delete", "resourceclaimtemplate", "one-root", "--ignore-not-found", timeout=60)
