"""vNPUs under the real kubelet: the fake backend's 310P3 with chip 0 split into two 2-core vNPUs; a pod
asking for `huawei.com/Ascend310P-2c: 1` runs with one vNPU's device node and the runtime's VIRTUAL option."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.cluster.agent import apply_chart, running_agent
from tests.cluster.harness import Cluster
from tests.cluster.node import wait_allocatable
from tests.cluster.pods import one_pod_spec, recorded_containers, recorded_envs, wait_running
from tests.support.agent_process import AgentProcess

pytestmark = pytest.mark.e2e_cluster

VNPU_RESOURCE = "huawei.com/Ascend310P-2c"


@pytest.fixture(scope="module")
def vnpu_agent(cluster: Cluster) -> Iterator[AgentProcess]:
    apply_chart(cluster)
    with running_agent(
        cluster,
        "agent-vnpu",
        registered=f"Registered resource {VNPU_RESOURCE}",
        fakeModel="310P3",
        fakeChips=2,
        fakeVnpus="0:vir02,0:vir02",
    ) as process:
        yield process


def test_a_pod_asking_for_a_vnpu_runs_with_it(cluster: Cluster, vnpu_agent: AgentProcess) -> None:
    wait_allocatable(cluster, "2", VNPU_RESOURCE)
    pod = one_pod_spec("vnpu", "on-vnpu", 1)
    pod["spec"]["containers"][0]["resources"]["limits"] = {VNPU_RESOURCE: "1"}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        wait_running(cluster, "vnpu")
        (request,) = recorded_containers(cluster, "on-vnpu")
        devices = {d["hostPath"] for d in request["config"].get("devices", [])}
        vnpus = {d for d in devices if re.fullmatch(r"/dev/vdavinci\d+", d)}
        assert len(vnpus) == 1, devices
        assert not {d for d in devices if re.fullmatch(r"/dev/davinci\d+", d)}, devices
        envs = recorded_envs(request)
        (vnpu,) = vnpus
        assert envs.get("ASCEND_VISIBLE_DEVICES") == vnpu.removeprefix("/dev/vdavinci"), envs
        assert envs.get("ASCEND_RUNTIME_OPTIONS") == "VIRTUAL", envs
    finally:
        cluster.kubectl("delete", "pod", "vnpu", "--wait=true", "--timeout=60s", check=False, timeout=90)
