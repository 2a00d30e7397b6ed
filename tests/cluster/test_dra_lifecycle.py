"""The DRA driver's life under the real kubelet: a chip's health carried by the health stream into the pod's
status (the newest service the kubelet knows: v1.DRAResourceHealth from 1.37, v1alpha1 before), the agent
restarted while a claim is prepared, a rolling update of the driver (a second process with another pod UID
while the first still serves), and the kubelet restarted (it deletes the node's slices at its start)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.agent import DRA_RENDER, ROOT, apply_chart, start_agent, stop_agents
from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.node import kubectl_watch
from tests.cluster.pods import chip_devices, claim_pod, delete_pods, runtime_spec, wait_running
from tests.cluster.polling import until
from tests.cluster.versions import needs_newer, server_release
from tests.support.agent_process import AgentProcess

pytestmark = [pytest.mark.e2e_cluster, pytest.mark.kubernetes("1.34", "resource.k8s.io/v1, GA from 1.34")]

DRIVER = "npu.huawei.com"
REGISTERED = f"Registered DRA driver {DRIVER}"


def fake_state(cluster: Cluster) -> Path:
    return cluster.work / "fake-state-dra-lifecycle.json"


# The pod UID each agent process was started with.
POD_UIDS: dict[AgentProcess, str] = {}


def start_dra_agent(cluster: Cluster, pod_uid: str, **overrides: Any) -> AgentProcess:
    # NoSchedule, not the chart's NoExecute: with NoExecute the device taint eviction controller deletes the
    # pod as soon as its chip is Unhealthy, and its status could not be seen to recover.
    process = start_agent(
        cluster,
        DRA_RENDER,
        env={"POD_UID": pod_uid},
        draTaintEffect="NoSchedule",
        backend="fake",
        fakeChips=8,
        fakeModel="910B4",
        fakeState=str(fake_state(cluster)),
        **overrides,
    )
    POD_UIDS[process] = pod_uid
    return process


@pytest.fixture(scope="module")
def agents(cluster: Cluster) -> Iterator[list[AgentProcess]]:
    """Every agent process the module started, the one serving last; each with a pod UID, as the chart
    runs it."""
    apply_chart(cluster, DRA_RENDER)
    cluster.kubectl("apply", "-f", str(ROOT / "examples" / "dra" / "deviceclasses.yaml"))
    fake_state(cluster).write_text("{}")
    started = [start_dra_agent(cluster, str(uuid.uuid4()))]
    try:
        started[0].wait_log(REGISTERED, timeout=60)
        yield started
    finally:
        stop_agents(cluster, started, "agent-dra-lifecycle")


def get_json(cluster: Cluster, *what: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(cluster.kubectl("get", *what, "-o", "json").stdout)
    return found


def pod_claim(cluster: Cluster, pod: str) -> dict[str, Any]:
    """The ResourceClaim the controller made for the pod's claim ``npus``."""
    statuses = get_json(cluster, "pod", pod)["status"]["resourceClaimStatuses"]
    (name,) = [s["resourceClaimName"] for s in statuses if s["name"] == "npus"]
    return get_json(cluster, "resourceclaim", name)


def allocated_devices(claim: dict[str, Any]) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def wait_resource_health(cluster: Cluster, pod: str, health: str, timeout: float = 90) -> dict[str, Any]:
    """Until the pod's container status carries ``claim:npus`` with every device's health ``health``."""

    def claim_npus() -> dict[str, Any]:
        containers = get_json(cluster, "pod", pod)["status"].get("containerStatuses", [])
        statuses = [s for c in containers for s in c.get("allocatedResourcesStatus") or []]
        return next((s for s in statuses if s["name"] == "claim:npus"), {})

    def healthy(entry: dict[str, Any]) -> bool:
        resources = entry.get("resources") or []
        return bool(resources) and all(r["health"] == health for r in resources)

    return until(claim_npus, healthy, f"pod {pod}: claim:npus with health {health}", timeout)


@pytest.mark.kubernetes("1.36", "device health in the pod's status, beta and on by default from 1.36")
def test_an_unhealthy_chip_reaches_the_pods_status_through_the_newest_health_service_and_recovers(
    cluster: Cluster, agents: list[AgentProcess]
) -> None:
    claim_pod(cluster, "health")
    try:
        wait_running(cluster, "health")
        claim = pod_claim(cluster, "health")
        (device,) = allocated_devices(claim)
        resource_id = f"{DRIVER}/claim={claim['metadata']['uid']}-{device}"
        healthy = wait_resource_health(cluster, "health", "Healthy")
        assert [r["resourceID"] for r in healthy["resources"]] == [resource_id], healthy
        # The kubelet opens the newest health service the driver lists: v1 from 1.37, v1alpha1 before.
        service = "v1alpha1" if needs_newer(server_release(cluster), "1.37") else "v1"
        (agent,) = agents[-1:]
        said = agent.matching(r"watches the devices' health through \S+")
        assert said and all(f"through {service}.DRAResourceHealth" in line for line in said), said
        fake_state(cluster).write_text(json.dumps({"unhealthy": [int(device.removeprefix("npu-"))]}))
        unhealthy = wait_resource_health(cluster, "health", "Unhealthy")
        (entry,) = unhealthy["resources"]
        assert entry["resourceID"] == resource_id, unhealthy
        assert entry.get("message"), unhealthy  # the reason (ResourceHealthStatusMessage, on in 1.36)
        fake_state(cluster).write_text("{}")
        wait_resource_health(cluster, "health", "Healthy")
    finally:
        fake_state(cluster).write_text("{}")
        delete_pods(cluster, "health")


def cdi_specs_naming(cluster: Cluster, claim_uid: str) -> list[str]:
    return [p.name for p in (cluster.work / "cdi").glob("*") if claim_uid in p.name]


def test_the_agent_restarted_with_a_claim_prepared_unprepare_removes_its_spec(
    cluster: Cluster, agents: list[AgentProcess]
) -> None:
    claim_pod(cluster, "across-restart")
    try:
        wait_running(cluster, "across-restart")
        uid = pod_claim(cluster, "across-restart")["metadata"]["uid"]
        assert cdi_specs_naming(cluster, uid), list((cluster.work / "cdi").glob("*"))
        # The container restarted in its pod: the same pod UID, a new process.
        agents[-1].terminate(timeout=20)
        agents.append(start_dra_agent(cluster, POD_UIDS[agents[-1]]))
        agents[-1].wait_log(REGISTERED, timeout=60)
    finally:
        delete_pods(cluster, "across-restart")
    agents[-1].wait_log("Unprepared claim default/across-restart-npus", timeout=60)
    assert not cdi_specs_naming(cluster, uid)


def slice_events(cluster: Cluster) -> subprocess.Popen[str]:
    """A watch of the ResourceSlices printing each event's type and slice name, one a line."""
    return kubectl_watch(
        cluster,
        "resourceslices",
        "--watch",
        "--output-watch-events",
        "-o",
        'jsonpath={.type} {.object.metadata.name} {.object.spec.nodeName}{"\\n"}',
    )


def test_a_rolling_update_of_the_driver_prepares_a_claim_made_during_the_overlap(
    cluster: Cluster, agents: list[AgentProcess]
) -> None:
    """The DaemonSet's maxSurge update: a second process with another pod UID starts while the first serves;
    a claim pod created while both run is prepared; the first stops; the pod is deleted and its claim
    unprepared by the second. The node's ResourceSlice is never deleted."""
    watch = slice_events(cluster)
    try:
        assert watch.stdout is not None
        first_line = watch.stdout.readline().split()
        assert first_line[:1] == ["ADDED"] and NODE_NAME in first_line, first_line
        old = agents[-1]
        agents.append(start_dra_agent(cluster, str(uuid.uuid4())))
        new = agents[-1]
        new.wait_log(REGISTERED, timeout=60)
        assert old.proc.poll() is None
        claim_pod(cluster, "overlap")
        wait_running(cluster, "overlap")
        assert len(chip_devices(runtime_spec(cluster, "overlap", "overlap"))) == 1
        uid = pod_claim(cluster, "overlap")["metadata"]["uid"]
        old.terminate(timeout=20)
        # The kubelet goes on with the second instance: the pod deleted, its claim unprepared by it.
        delete_pods(cluster, "overlap")
        new.wait_log("Unprepared claim default/overlap-npus", timeout=60)
        assert not cdi_specs_naming(cluster, uid)
        claim_pod(cluster, "after-roll")
        wait_running(cluster, "after-roll")
    finally:
        delete_pods(cluster, "overlap")
        delete_pods(cluster, "after-roll")
        watch.terminate()
        seen, _ = watch.communicate(timeout=20)
    events = [line.split() for line in seen.splitlines() if line.strip()]
    assert not [e for e in events if e[:1] == ["DELETED"]], events


def test_a_claim_pod_made_right_after_a_kubelet_restart_runs(
    cluster: Cluster, agents: list[AgentProcess]
) -> None:
    """A starting kubelet deletes every ResourceSlice of its node, then registers the driver again; the slice
    is back within seconds of that (not at the 300 s refresh), so a claim pod made at once is scheduled and
    runs within wait_running's 90 s."""
    agent = agents[-1]
    registrations = len(agent.matching(REGISTERED))
    watch = slice_events(cluster)
    events: list[tuple[float, list[str]]] = []

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            events.append((time.monotonic(), line.split()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        until(lambda: list(events), bool, "the slice watch's first event")
        restarted = time.monotonic()
        cluster.restart_kubelet()
        claim_pod(cluster, "after-kubelet-restart")
        wait_running(cluster, "after-kubelet-restart")
        running = time.monotonic() - restarted
        agent.wait_log(REGISTERED, timeout=60, count=registrations + 1)
    finally:
        delete_pods(cluster, "after-kubelet-restart")
        watch.terminate()
        watch.wait(20)
        reader.join(5)
    ours = [(at, e[0]) for at, e in events if NODE_NAME in e and at >= restarted]
    deleted = next((at for at, kind in ours if kind == "DELETED"), None)
    assert deleted is not None, f"the kubelet deleted no slice at its start: {events}"
    back = next((at for at, kind in ours if kind == "ADDED" and at > deleted), None)
    assert back is not None, events
    print(
        f"kubelet restart -> slice deleted {deleted - restarted:.1f} s, back {back - restarted:.1f} s "
        f"({back - deleted:.1f} s after the deletion); claim pod Running {running:.1f} s after the restart"
    )
