"""What an operator meets on the real cluster beyond the first checks: the doctor run on the node while a
pod stays Pending for want of chips, and the agent rolled to a new process as the DaemonSet's update does it
(the new one started while the old one runs, waiting on the instance lock, then the old one stopped), with
the node's Allocatable watched the whole time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.agent import ROOT, apply_chart, run_doctor, start_agent, stop_agents
from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.node import wait_allocatable, watch_capacity
from tests.cluster.pods import (
    RESOURCE,
    chip_devices,
    one_pod_spec,
    runtime_spec,
    wait_running,
    wait_unschedulable,
)
from tests.support import FIXTURES
from tests.support.agent_process import AgentProcess
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi

pytestmark = pytest.mark.e2e_cluster

B4_INFO = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()


def host(cluster: Cluster) -> HostTree:
    """The node as the devfs backend and the doctor see it: eight 910B4 chips' device files, the driver."""
    return HostTree(cluster.work / "host")


def npu_smi(cluster: Cluster) -> FakeNpuSmi:
    return FakeNpuSmi(cluster.work / "npu-smi")


def host_settings(cluster: Cluster) -> dict[str, Any]:
    """The devfs backend on the host tree. No driver mounts: the tree has the driver's files, the host does
    not, and a container's bind mount of a host path the host lacks would make it there."""
    return {
        "backend": "devfs",
        "hostRoot": str(host(cluster).root),
        "npuSmi": str(npu_smi(cluster).path),
        "driverMounts": [],
    }


@pytest.fixture(scope="module")
def agents(cluster: Cluster) -> Iterator[list[AgentProcess]]:
    """Every agent process the module started (the devfs backend on the host tree); a test may stop one or
    start another."""
    apply_chart(cluster)
    # A device-plugin cluster: no DeviceClass with extendedResourceName huawei.com/Ascend910 (the DRA
    # modules apply examples/dra's). With one, the scheduler serves such a pod through DRA, and a pod with no
    # chip left is Pending for "cannot allocate all claims", not "Insufficient huawei.com/Ascend910".
    classes = str(ROOT / "examples" / "dra" / "deviceclasses.yaml")
    answer = cluster.kubectl("delete", "--ignore-not-found", "-f", classes, timeout=90, check=False)
    # Before 1.34 the API server has no DeviceClass of resource.k8s.io/v1, so none to delete.
    assert answer.returncode == 0 or 'no matches for kind "DeviceClass"' in answer.stderr, answer.stderr
    host(cluster).add_driver().add_management().add_chips(range(8))
    npu_smi(cluster).set_output("info", B4_INFO)
    started = [start_agent(cluster, **host_settings(cluster))]
    try:
        started[0].wait_log(f"Registered resource {RESOURCE}", timeout=60)
        yield started
    finally:
        stop_agents(cluster, started, "agent-operator")


def doctor(cluster: Cluster) -> tuple[int, list[dict[str, Any]], str]:
    """`ascend-agent doctor --json` on the node, with the DaemonSet's config and the agent's kubeconfig, as an
    operator runs it: exit status, its checks, and its text."""
    args = [
        "--config", str(cluster.work / "agent.yaml"),
        "--kubeconfig", str(cluster.work / "agent.kubeconfig"),
        "--node-name", NODE_NAME,
    ]  # fmt: skip
    text = run_doctor(cluster, *args)
    answer = run_doctor(cluster, *args, "--json")
    checks: list[dict[str, Any]] = json.loads(answer.stdout)
    return answer.returncode, checks, text.stdout + text.stderr


def pending_for_want_of_chips(cluster: Cluster, name: str) -> str:
    """A one-chip pod created and left Unschedulable by the scheduler: its `kubectl describe`."""
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(one_pod_spec(name, "npu", 1)))
    wait_unschedulable(cluster, name)
    described = cluster.kubectl("describe", "pod", name).stdout
    assert "Pending" in described and f"Insufficient {RESOURCE}" in described, described
    return described


def newly_failed(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, str]:
    """The checks that failed in ``after`` and passed in ``before``: what the doctor blames for the change.
    (The DaemonSet's own pod never runs here: the agent is a host process, and the pod's hostPath volumes
    name driver paths this machine has not, so the doctor's DaemonSet checks fail throughout.)"""
    passed = {kind(check) for check in before if check["ok"] is True}
    return {kind(c): c["detail"] for c in after if c["ok"] is False and kind(c) in passed}


def kind(check: dict[str, Any]) -> str:
    """A check's name without what it found (`plugin socket Ascend910.sock` is `plugin socket`)."""
    return " ".join(check["check"].split()[:2])


def test_the_agent_stopped_a_pod_stays_pending_and_the_doctor_names_the_cause(
    cluster: Cluster, agents: list[AgentProcess]
) -> None:
    wait_allocatable(cluster, "8")
    _, healthy, text = doctor(cluster)
    print(text)
    agents[-1].terminate(timeout=20)
    try:
        # The kubelet marks the chips unhealthy when the agent's stream ends; Capacity stays 8.
        wait_allocatable(cluster, "0")
        pending_for_want_of_chips(cluster, "no-agent")
        status, checks, text = doctor(cluster)
        print(text)
        assert status == 1, text
        failed = newly_failed(healthy, checks)
        assert "plugin socket" in failed, text
        assert "agent readiness" in failed, text
        assert "node capacity" in failed and "allocatable 0" in failed["node capacity"], text
    finally:
        cluster.kubectl("delete", "pod", "no-agent", "--wait=true", "--timeout=60s", check=False, timeout=90)
        agents.append(start_agent(cluster, **host_settings(cluster)))
        agents[-1].wait_log(f"Registered resource {RESOURCE}", timeout=60)
    wait_allocatable(cluster, "8")


def test_the_chips_gone_a_pod_stays_pending_and_the_doctor_names_the_cause(
    cluster: Cluster, agents: list[AgentProcess]
) -> None:
    wait_allocatable(cluster, "8")
    _, healthy, _ = doctor(cluster)
    for phys_id in range(8):
        (host(cluster).dev / f"davinci{phys_id}").unlink()
    try:
        wait_allocatable(cluster, "0")
        pending_for_want_of_chips(cluster, "no-chips")
        status, checks, text = doctor(cluster)
        print(text)
        assert status == 1, text
        failed = newly_failed(healthy, checks)
        assert "device files" in failed, text
    finally:
        cluster.kubectl("delete", "pod", "no-chips", "--wait=true", "--timeout=60s", check=False, timeout=90)
        host(cluster).add_chips(range(8))
    wait_allocatable(cluster, "8")


def test_the_agent_rolled_to_a_new_process_capacity_stays_and_the_gap_is_short(
    cluster: Cluster, agents: list[AgentProcess]
) -> None:
    """The DaemonSet's update with a surge: the new agent starts while the old one serves (it waits on the
    instance lock, ready as a standby), then the old one gets SIGTERM and the new one takes over at once.

    The device plugin API has no hand-over: when the old process's ListAndWatch stream ends the kubelet marks
    every chip of the resource Unhealthy until the new one registers and lists them (a second registration
    while the first is connected would be worse: kubelet 1.36 then disconnects the new client when the old
    stream ends). The API server sees Allocatable below 8 only if the kubelet's node status update falls in
    that gap; the test asserts the gap stays far below one status period and prints it."""
    wait_allocatable(cluster, "8")
    before = len(cluster.device_plugin_gaps())
    watch = watch_capacity(cluster)
    try:
        assert watch.stdout is not None
        assert watch.stdout.readline().split() == ["8", "8"]  # the node as it is now
        old = agents[-1]
        # The same settings, as two pods of the DaemonSet share its ConfigMap (and the host's /metrics port:
        # the new one serves it once the old one has stopped).
        agents.append(start_agent(cluster, **host_settings(cluster)))
        new = agents[-1]
        new.wait_log("waiting for it to stop", timeout=60)
        old.terminate(timeout=20)
        new.wait_log(f"Registered resource {RESOURCE}", timeout=60)
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(one_pod_spec("rolled-eight", "rolled", 8)))
        wait_running(cluster, "rolled-eight")
        assert len(chip_devices(runtime_spec(cluster, "rolled-eight", "rolled"))) == 8
    finally:
        watch.terminate()
        seen, _ = watch.communicate(timeout=20)
        cluster.kubectl(
            "delete", "pod", "rolled-eight", "--wait=true", "--timeout=60s", check=False, timeout=90
        )
    (gap,) = cluster.device_plugin_gaps()[before:]
    seen_pairs = [line.split() for line in seen.splitlines() if line.strip()]
    print(f"kubelet gap {gap * 1000:.0f} ms; (Capacity, Allocatable) seen {seen_pairs}")
    assert gap < 1.0, gap  # the standby takes over at once; far below one node status period
    assert all(pair[0] == "8" and pair[1] in ("8", "0") for pair in seen_pairs), seen_pairs
    wait_allocatable(cluster, "8")
