"""vNPUs under the real kubelet: the fake backend's 310P3 with chip 0 split into two 2-core vNPUs; a pod
asking for `huawei.com/Ascend310P-2c: 1` runs with one vNPU's device node and the runtime's VIRTUAL option."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.cluster.agent import apply_chart, running_agent
from tests.cluster.devices import numbers
from tests.cluster.harness import Cluster
from tests.cluster.node import wait_allocatable
from tests.cluster.pods import one_pod_spec, runtime_spec, shown, spec_device_numbers, spec_envs, wait_running
from tests.support.agent_process import AgentProcess

pytestmark = pytest.mark.e2e_cluster

VNPU_RESOURCE = "huawei.com/Ascend310P-2c"


@pytest.fixture(scope="module")
def vnpu_agent(cluster: Cluster) -> Iterator[AgentProcess]:
    apply_chart(cluster)
    # The fake chip 0's two vir02 vNPUs (ids 100 and 101): their nodes in /dev, where containerd looks.
    with (
        cluster.devices.present(["vdavinci100", "vdavinci101"]),
        running_agent(
            cluster,
            "agent-vnpu",
            registered=f"Registered resource {VNPU_RESOURCE}",
            fakeModel="310P3",
            fakeChips=2,
            fakeVnpus="0:vir02,0:vir02",
        ) as process,
    ):
        yield process


def test_a_pod_asking_for_a_vnpu_runs_with_it(cluster: Cluster, vnpu_agent: AgentProcess) -> None:
    wait_allocatable(cluster, "2", VNPU_RESOURCE)
    pod = one_pod_spec("vnpu", "on-vnpu", 1)
    pod["spec"]["containers"][0]["resources"]["limits"] = {VNPU_RESOURCE: "1"}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        wait_running(cluster, "vnpu")
        spec = runtime_spec(cluster, "vnpu", "on-vnpu")
        devices = spec_device_numbers(spec)
        # One vNPU's node (/dev/vdavinci<id> on the host), seen as /dev/davinci<id>; no whole chip.
        chips = {path for path in devices if re.fullmatch(r"/dev/davinci\d+", path)}
        assert len(chips) == 1, devices
        (path,) = chips
        vnpu_id = path.removeprefix("/dev/davinci")
        assert devices[path] == numbers(f"vdavinci{vnpu_id}"), devices
        envs = spec_envs(spec)
        assert envs.get("ASCEND_VISIBLE_DEVICES") == vnpu_id, envs
        assert envs.get("ASCEND_RUNTIME_OPTIONS") == "VIRTUAL", envs
        # What the container itself sees: the node by its numbers, and the variables.
        seen, seen_envs = shown(cluster, "vnpu")
        assert seen.get(path) == f"f2:{int(vnpu_id):x}", seen
        assert seen_envs["ASCEND_VISIBLE_DEVICES"] == vnpu_id, seen_envs
    finally:
        cluster.kubectl("delete", "pod", "vnpu", "--wait=true", "--timeout=60s", check=False, timeout=90)
