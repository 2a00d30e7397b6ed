"""Static vNPUs on a DRA node under the real scheduler: the fake 310P3 with chip 0 split into two vir02 vNPUs
publishes chip 1 whole and chip 0 only as its vNPUs. The whole-chip DeviceClasses of examples/dra leave vNPUs
out (`!("vnpuId" in ...)`, evaluated by the scheduler), the vNPU class selects them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.agent import DRA_RENDER, ROOT, apply_chart, running_agent
from tests.cluster.devices import numbers
from tests.cluster.harness import Cluster
from tests.cluster.pods import (
    claim_pod,
    delete_pods,
    runtime_spec,
    spec_device_numbers,
    wait_running,
    wait_unschedulable,
)
from tests.support.agent_process import AgentProcess

pytestmark = [pytest.mark.e2e_cluster, pytest.mark.kubernetes("1.34", "resource.k8s.io/v1, GA from 1.34")]

DRIVER = "npu.huawei.com"


@pytest.fixture(scope="module")
def vnpu_dra_agent(cluster: Cluster) -> Iterator[AgentProcess]:
    apply_chart(cluster, DRA_RENDER)
    cluster.kubectl("apply", "-f", str(ROOT / "examples" / "dra" / "deviceclasses.yaml"))
    # The fake chip 0's two vir02 vNPUs (ids 100 and 101): their nodes in /dev, where containerd looks.
    with (
        cluster.devices.present(["vdavinci100", "vdavinci101"]),
        running_agent(
            cluster,
            "agent-dra-vnpu",
            DRA_RENDER,
            registered=f"Registered DRA driver {DRIVER}",
            backend="fake",
            fakeModel="310P3",
            fakeChips=2,
            fakeVnpus="0:vir02,0:vir02",
        ) as process,
    ):
        yield process


def allocated(cluster: Cluster, pod: str) -> list[str]:
    statuses = json.loads(cluster.kubectl("get", "pod", pod, "-o", "json").stdout)["status"]
    (name,) = [s["resourceClaimName"] for s in statuses["resourceClaimStatuses"]]
    claim: dict[str, Any] = json.loads(cluster.kubectl("get", "resourceclaim", name, "-o", "json").stdout)
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def test_the_whole_chip_classes_never_get_a_vnpu_and_the_vnpu_class_does(
    cluster: Cluster, vnpu_dra_agent: AgentProcess
) -> None:
    names = ("two-whole", "one-whole", "one-vnpu")
    try:
        # Three devices match ascend310p's deviceType/generation (chip 1 and chip 0's two vNPUs); the clause
        # leaves one: a claim of two whole chips cannot be allocated.
        claim_pod(cluster, "two-whole", "ascend310p", 2)
        wait_unschedulable(cluster, "two-whole")
        delete_pods(cluster, "two-whole")
        claim_pod(cluster, "one-whole", "ascend310p", 1)
        wait_running(cluster, "one-whole")
        assert allocated(cluster, "one-whole") == ["npu-1"]
        claim_pod(cluster, "one-vnpu", "ascend-vnpu", 1)
        wait_running(cluster, "one-vnpu")
        (device,) = allocated(cluster, "one-vnpu")
        assert re.fullmatch(r"npu-0-vnpu-\d+", device), device
        # containerd applied the claim's CDI spec: the vNPU's node, seen as /dev/davinci<id>.
        vnpu_id = int(device.rsplit("-", 1)[1])
        devices = spec_device_numbers(runtime_spec(cluster, "one-vnpu", "one-vnpu"))
        assert devices.get(f"/dev/davinci{vnpu_id}") == numbers(f"vdavinci{vnpu_id}"), devices
    finally:
        for name in names:
            delete_pods(cluster, name)
