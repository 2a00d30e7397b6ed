"""Dynamic vNPUs under the real scheduler (Kubernetes 1.36: DRAPartitionableDevices, beta and on by
default): the devfs backend on a host tree of two 310P3 chips and a stand-in npu-smi that keeps vNPUs,
`vnpu: {dynamic: true}`. The API server takes the counter slices, the scheduler allocates a template device
of examples/dra's `ascend310p-vir04` class, the kubelet prepares it (the vNPU is carved) and unprepares it
after the pod is deleted (the vNPU is destroyed)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.agent import DRA_RENDER, ROOT, apply_chart, running_agent
from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.pods import one_pod_spec, runtime_spec, spec_envs, wait_running
from tests.support.agent_process import AgentProcess
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.vnpu_node import TEMPLATE_INFO, TEMPLATES_310P, info_310p

pytestmark = [
    pytest.mark.e2e_cluster,
    pytest.mark.kubernetes("1.36", "partitionable devices, beta and on by default from 1.36"),
]

DRIVER = "npu.huawei.com"


def _npu_smi(cluster: Cluster) -> FakeNpuSmi:
    return FakeNpuSmi(cluster.work / "npu-smi-dynamic")


def _vnpus(cluster: Cluster) -> list[tuple[int, str]]:
    state = _npu_smi(cluster).vnpu_state()
    return [(v["id"], v["template"]) for chip in state["chips"].values() for v in chip["vnpus"]]


@pytest.fixture(scope="module")
def dynamic_agent(cluster: Cluster) -> Iterator[AgentProcess]:
    apply_chart(cluster, DRA_RENDER)
    cluster.kubectl("apply", "-f", str(ROOT / "examples" / "dra" / "deviceclasses.yaml"))
    host = HostTree(cluster.work / "host-dynamic").add_driver().add_management().add_chips([0, 1])
    npu_smi = _npu_smi(cluster)
    npu_smi.set_output("info", info_310p([0, 1]))
    for npu_id in (0, 1):
        npu_smi.set_output(f"info -t template-info -i {npu_id}", TEMPLATE_INFO)
    chips = {(n, 0): {"phys": n, "aicore": 8, "memory": 21, "aicpu": 7, "vnpus": []} for n in (0, 1)}
    npu_smi.set_vnpu_state(host.dev, chips, TEMPLATES_310P)
    with running_agent(
        cluster,
        "agent-dra-dynamic",
        DRA_RENDER,
        registered=f"Registered DRA driver {DRIVER}",
        backend="devfs",
        hostRoot=str(host.root),
        npuSmi=str(npu_smi.path),
        vnpu={"dynamic": True},
        # The tree has the driver's files, the host not: no bind mount may make them on the host.
        driverMounts=[],
        # The pool's slices go with the agent: the next module's agent must not find whole chips of these.
        draCleanup=True,
    ) as process:
        process.wait_log("ResourceSlices of pool", timeout=60)
        yield process


def _slices(cluster: Cluster) -> list[dict[str, Any]]:
    found = json.loads(cluster.kubectl("get", "resourceslices", "-o", "json").stdout)["items"]
    return [s for s in found if s["spec"].get("nodeName") == NODE_NAME and s["spec"]["driver"] == DRIVER]


def _claim_pod(cluster: Cluster, name: str, template: str) -> None:
    pod = one_pod_spec(name, name, 1)
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "vnpu"}]}
    pod["spec"]["resourceClaims"] = [{"name": "vnpu", "resourceClaimTemplateName": template}]
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))


def test_a_dynamic_vnpu_is_scheduled_carved_and_destroyed(
    cluster: Cluster, dynamic_agent: AgentProcess
) -> None:
    slices = _slices(cluster)
    counters = [c["name"] for s in slices for c in s["spec"].get("sharedCounters") or ()]
    assert counters == ["npu-0", "npu-1"]
    devices = {d["name"] for s in slices for d in s["spec"].get("devices") or ()}
    assert {"npu-0", "npu-1", "npu-0-vir04-0", "npu-1-vir04-0"} <= devices
    claims = [d for d in ROOT.joinpath("examples", "dra", "claims.yaml").read_text().split("\n---\n")]
    (template,) = [d for d in claims if "name: vir04-on-310p" in d]
    cluster.kubectl("apply", "-f", "-", stdin=template)
    _claim_pod(cluster, "dynamic-vir04", "vir04-on-310p")
    try:
        wait_running(cluster, "dynamic-vir04")
        statuses = json.loads(cluster.kubectl("get", "pod", "dynamic-vir04", "-o", "json").stdout)["status"]
        (name,) = [s["resourceClaimName"] for s in statuses["resourceClaimStatuses"]]
        claim = json.loads(cluster.kubectl("get", "resourceclaim", name, "-o", "json").stdout)
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert re.fullmatch(r"npu-[01]-vir04-0", result["device"]), result
        phys = int(result["device"].split("-")[1])
        ((vnpu_id, kind),) = _vnpus(cluster)
        assert kind == "vir04" and vnpu_id == 100 + 16 * phys
        # containerd applied the claim's CDI spec (the only source of these): the template's claim asks
        # for the Ascend runtime, which adds the vNPU's node from the variables.
        envs = spec_envs(runtime_spec(cluster, "dynamic-vir04", "dynamic-vir04"))
        assert envs.get("ASCEND_VISIBLE_DEVICES") == str(vnpu_id), envs
        assert envs.get("ASCEND_RUNTIME_OPTIONS") == "VIRTUAL", envs
        dynamic_agent.wait_log(re.escape(f"Carved vNPU {vnpu_id} (vir04) on chip {phys}"))
    finally:
        cluster.kubectl(
            "delete", "pod", "dynamic-vir04", "--wait=true", "--timeout=60s", check=False, timeout=90
        )
    _npu_smi(cluster).wait_count(f"set -t destroy-vnpu -i {phys} -c 0 -v {vnpu_id}", 1, timeout=60)
    dynamic_agent.wait_log(f"Unprepared claim default/{name}", timeout=30)
    assert _vnpus(cluster) == []
