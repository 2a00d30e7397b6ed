"""The operator's checks against the real kubelet, scheduler and API server: the agent as the chart deploys it
(fake backend, eight 910B chips) advertises them, and a pod asking for one goes Running with one chip's
device node, the management devices and the environment in the container containerd made."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ascend_agent.allocation import preferred, topology_for
from ascend_agent.model import Chip
from tests.cluster.agent import agent_metrics, apply_chart, chart_objects, start_agent, stop_agents
from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.node import wait_allocatable, watch_capacity
from tests.cluster.pods import (
    RESOURCE,
    chip_devices,
    container_id,
    one_pod_spec,
    runtime_spec,
    spec_devices,
    spec_envs,
    wait_running,
    wait_unschedulable,
)
from tests.cluster.polling import poll
from tests.support.agent_process import AgentProcess

pytestmark = pytest.mark.e2e_cluster

MANAGEMENT_DEVICES = {"/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"}


@pytest.fixture(scope="module")
def agents(cluster: Cluster) -> Iterator[list[AgentProcess]]:
    """Every agent process the module started, the running one last (a test may restart it)."""
    apply_chart(cluster)
    fake_state(cluster).write_text("{}")
    started = [start_agent(cluster, fakeState=str(fake_state(cluster)))]
    try:
        started[0].wait_log(f"Registered resource {RESOURCE}", timeout=60)
        yield started
    finally:
        stop_agents(cluster, started, "agent")


@pytest.fixture
def agent(agents: list[AgentProcess]) -> AgentProcess:
    return agents[-1]


# A refusal in the agent's log ("403" alone is in many a timestamp).
REFUSAL = r"(?i)forbidden|\b403\b"


def fake_state(cluster: Cluster) -> Path:
    """The fake backend's state file: the faults it scripts are re-read at every discovery."""
    return cluster.work / "fake-state.json"


def node_resources(cluster: Cluster) -> tuple[dict[str, str], dict[str, str]]:
    node = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    return node["status"].get("capacity", {}), node["status"].get("allocatable", {})


def test_the_daemonset_its_pod_on_the_node_and_the_agents_log(cluster: Cluster, agent: AgentProcess) -> None:
    """The guides' first checks: the DaemonSet, its pod on the node, the chips found and the resource
    registered in the agent's log. (The pod's own container is the runtime's fake: the agent under test is
    the host process.)"""
    cluster.kubectl(
        "wait",
        "-n",
        "kube-system",
        "ds/ascend-device-plugin-daemonset",
        "--for=jsonpath={.status.currentNumberScheduled}=1",
        "--timeout=60s",
        timeout=90,
    )
    shown = cluster.kubectl("get", "ds", "-n", "kube-system", "ascend-device-plugin-daemonset").stdout
    assert re.search(r"ascend-device-plugin-daemonset\s+1\s", shown), shown
    pods = json.loads(
        cluster.kubectl(
            "get", "pods", "-n", "kube-system", "-l", "app.kubernetes.io/name=ascend-agent", "-o", "json"
        ).stdout
    )["items"]
    assert [pod["spec"].get("nodeName") for pod in pods] == [NODE_NAME], pods
    agent.wait_log(r"Found device /dev/davinci\d", timeout=10, count=8)
    agent.wait_log(f"Registered resource {RESOURCE}", timeout=10)


def test_describe_node_shows_eight_chips(cluster: Cluster, agent: AgentProcess) -> None:
    wait_allocatable(cluster, "8")
    capacity, allocatable = node_resources(cluster)
    assert capacity[RESOURCE] == "8"
    assert allocatable[RESOURCE] == "8"
    described = cluster.kubectl("describe", "node", NODE_NAME).stdout
    sections = re.findall(
        rf"(Capacity|Allocatable):\n(?:  .*\n)*?  {re.escape(RESOURCE)}:\s+(\d+)", described
    )
    assert sections == [("Capacity", "8"), ("Allocatable", "8")], described


def test_a_pod_with_one_chip_runs_with_its_device(cluster: Cluster, agent: AgentProcess) -> None:
    wait_allocatable(cluster, "8")
    pod = one_pod_spec("one-chip", "npu", 1)
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    try:
        wait_running(cluster, "one-chip")
        spec = runtime_spec(cluster, "one-chip", "npu")
        devices = spec_devices(spec)
        chips = chip_devices(spec)
        assert len(chips) == 1, devices
        assert devices >= MANAGEMENT_DEVICES, devices
        envs = spec_envs(spec)
        (chip,) = chips
        assert envs.get("ASCEND_VISIBLE_DEVICES") == chip.removeprefix("/dev/davinci"), envs
    finally:
        cluster.kubectl("delete", "pod", "one-chip", "--wait=true", "--timeout=60s", check=False, timeout=90)


def test_a_chip_turning_unhealthy_and_back(cluster: Cluster, agent: AgentProcess) -> None:
    wait_allocatable(cluster, "8")
    fake_state(cluster).write_text(json.dumps({"unhealthy": [3]}))
    try:
        wait_allocatable(cluster, "7")
        capacity, allocatable = node_resources(cluster)
        assert (capacity[RESOURCE], allocatable[RESOURCE]) == ("8", "7")
        events = cluster.kubectl("describe", "node", NODE_NAME).stdout.split("Events:", 1)[-1]
        assert re.search(r"Warning\s+NPUUnhealthy\s+.*Ascend910-3 is Unhealthy", events), events
    finally:
        fake_state(cluster).write_text("{}")
    wait_allocatable(cluster, "8")
    events = cluster.kubectl("describe", "node", NODE_NAME).stdout.split("Events:", 1)[-1]
    assert re.search(r"Normal\s+NPUHealthy\s+.*Ascend910-3 is Healthy again", events), events


def test_node_labels_in_show_labels(cluster: Cluster, agent: AgentProcess) -> None:
    cluster.kubectl(
        "wait",
        f"node/{NODE_NAME}",
        "--for=jsonpath={.metadata.labels.accelerator}=huawei-Ascend910",
        "--timeout=60s",
        timeout=90,
    )
    shown = cluster.kubectl("get", "node", NODE_NAME, "--show-labels").stdout
    labels = dict(pair.split("=", 1) for pair in shown.split()[-1].split(","))
    assert labels["accelerator"] == "huawei-Ascend910", labels
    assert labels["node.kubernetes.io/npu.chip.name"] == "910B4", labels
    assert labels["huawei.com/npu.count"] == "8", labels


def test_with_the_chips_gone_a_pod_stays_pending_for_want_of_chips(
    cluster: Cluster, agent: AgentProcess
) -> None:
    wait_allocatable(cluster, "8")
    fake_state(cluster).write_text(json.dumps({"absent": list(range(8))}))
    pod = one_pod_spec("no-chip-left", "npu", 1)
    try:
        wait_allocatable(cluster, "0")
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
        wait_unschedulable(cluster, "no-chip-left")
        described = cluster.kubectl("describe", "pod", "no-chip-left").stdout
        assert "Pending" in described, described
        assert f"Insufficient {RESOURCE}" in described, described
    finally:
        cluster.kubectl(
            "delete", "pod", "no-chip-left", "--wait=true", "--timeout=60s", check=False, timeout=90
        )
        fake_state(cluster).write_text("{}")
    wait_allocatable(cluster, "8")


def test_the_kubelet_restarted_capacity_comes_back_and_the_pod_keeps_its_chip(
    cluster: Cluster, agent: AgentProcess
) -> None:
    wait_allocatable(cluster, "8")
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(one_pod_spec("keeps-chip", "keeper", 1)))
    try:
        wait_running(cluster, "keeps-chip")
        before = container_id(cluster, "keeps-chip", "keeper")
        kept = chip_devices(runtime_spec(cluster, "keeps-chip", "keeper"))
        registrations = len(agent.matching(f"Registered resource {RESOURCE}"))
        cluster.restart_kubelet()
        agent.wait_log(f"Registered resource {RESOURCE}", timeout=60, count=registrations + 1)
        wait_allocatable(cluster, "8")
        capacity, _ = node_resources(cluster)
        assert capacity[RESOURCE] == "8"
        wait_running(cluster, "keeps-chip")
        assert container_id(cluster, "keeps-chip", "keeper") == before, "the running container was made again"
        # The kubelet still counts the running pod's chip as taken: seven more fit, none of them that one.
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(one_pod_spec("the-rest", "rest", 7)))
        wait_running(cluster, "the-rest")
        taken = chip_devices(runtime_spec(cluster, "the-rest", "rest"))
        assert len(kept) == 1 and len(taken) == 7 and not kept & taken, (kept, taken)
    finally:
        for name in ("keeps-chip", "the-rest"):
            cluster.kubectl("delete", "pod", name, "--wait=true", "--timeout=60s", check=False, timeout=90)


def test_pods_of_2_and_4_chips_get_the_sets_the_agent_prefers(cluster: Cluster, agent: AgentProcess) -> None:
    """The kubelet asks GetPreferredAllocation and takes its answer: each pod's container's chips are what the
    agent's policy picks from the chips still free (910B: mesh, two NUMA nodes of four)."""
    wait_allocatable(cluster, "8")
    chips = [
        Chip.make(i, "910B4", numa_node=i * 2 // 8, npu_id=i, bus_id=f"0000:{0x10 + i:02x}:00.0")
        for i in range(8)
    ]
    topology = topology_for(chips)
    held: set[str] = set()
    pods = [("one", 1), ("two", 2), ("four", 4)]
    try:
        for name, size in pods:
            free = sorted(f"Ascend910-{i}" for i in range(8) if f"/dev/davinci{i}" not in held)
            expected = {f"/dev/davinci{d.rsplit('-', 1)[1]}" for d in preferred(topology, free, [], size)}
            cluster.kubectl(
                "apply", "-f", "-", stdin=json.dumps(one_pod_spec(f"takes-{name}", f"c-{name}", size))
            )
            wait_running(cluster, f"takes-{name}")
            got = chip_devices(runtime_spec(cluster, f"takes-{name}", f"c-{name}"))
            assert got == expected, (name, sorted(got), sorted(expected), sorted(held))
            held |= got
    finally:
        for name, _ in pods:
            cluster.kubectl(
                "delete", "pod", f"takes-{name}", "--wait=true", "--timeout=60s", check=False, timeout=90
            )


def test_the_real_kubelets_podresources_name_the_holder(cluster: Cluster, agent: AgentProcess) -> None:
    """PodResources from the real kubelet: the pod holding a chip is in /metrics' labels and in `list`."""
    wait_allocatable(cluster, "8")
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(one_pod_spec("holder", "holds", 1)))
    try:
        wait_running(cluster, "holder")
        (chip,) = chip_devices(runtime_spec(cluster, "holder", "holds"))
        device = "Ascend910-" + chip.removeprefix("/dev/davinci")
        wanted = re.compile(rf'device="{device}"[^}}]*pod="holder"|pod="holder"[^}}]*device="{device}"')
        metrics = poll(lambda: agent_metrics(cluster), wanted.search)
        assert wanted.search(metrics), [line for line in metrics.splitlines() if device in line][:5]
        listed = subprocess.run(
            [sys.executable, "-m", "ascend_agent", "list", "--config", str(cluster.work / "agent.yaml")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert listed.returncode == 0, listed.stderr
        lines = [line for line in listed.stdout.splitlines() if re.search(rf"\b{device}\b", line)]
        assert lines and "holder" in lines[0], listed.stdout
    finally:
        cluster.kubectl("delete", "pod", "holder", "--wait=true", "--timeout=60s", check=False, timeout=90)


def test_the_device_info_configmap_is_accepted(cluster: Cluster, agent: AgentProcess) -> None:
    """The device-info ConfigMap through the real API server's validation and the chart's Role."""
    name = f"mindx-dl-deviceinfo-{NODE_NAME}"
    answer = poll(
        lambda: cluster.kubectl("get", "configmap", name, "-n", "kube-system", "-o", "json", check=False),
        lambda got: got.returncode == 0,
    )
    assert answer.returncode == 0, answer.stderr
    data = json.loads(answer.stdout)["data"]
    assert "DeviceInfoCfg" in data, data


def test_the_fault_config_map_is_read_and_watched(cluster: Cluster, agent: AgentProcess) -> None:
    """Huawei's mindx-dl-fault-config through the chart's Role (get, list, watch on that one name, by a
    field selector): created, it replaces the built-in faultCode.json; deleted, the built-in one applies
    again."""
    before = len(agent.lines)
    table = json.dumps({"SubHealthFaultCodes": ["80E3A201"]})
    cluster.kubectl(
        "create",
        "configmap",
        "mindx-dl-fault-config",
        "-n",
        "kube-system",
        f"--from-literal=faultCode.json={table}",
    )
    try:
        agent.wait_log("Fault table from ConfigMap kube-system/mindx-dl-fault-config: 1 codes", timeout=60)
    finally:
        cluster.kubectl("delete", "configmap", "mindx-dl-fault-config", "-n", "kube-system", check=False)
    agent.wait_log("mindx-dl-fault-config is gone: the built-in fault table applies again", timeout=60)
    refused = [line for line in agent.lines[before:] if re.search(REFUSAL, line)]
    assert not refused, "\n".join(refused)


def test_without_the_events_create_verb_the_agent_logs_the_403_once(
    cluster: Cluster, agent: AgentProcess
) -> None:
    """Real RBAC: the chart's ClusterRole without `create` on events; two chip transitions, one log line."""
    wait_allocatable(cluster, "8")
    (role,) = (doc for doc in chart_objects() if doc["kind"] == "ClusterRole")
    (index,) = (i for i, rule in enumerate(role["rules"]) if rule["resources"] == ["events"])
    verbs = role["rules"][index]["verbs"]
    patch = [{"op": "replace", "path": f"/rules/{index}/verbs", "value": [v for v in verbs if v != "create"]}]
    name = role["metadata"]["name"]
    before, already = len(agent.lines), len(agent.matching(REFUSAL))
    cluster.kubectl("patch", "clusterrole", name, "--type=json", f"-p={json.dumps(patch)}")
    try:
        fake_state(cluster).write_text(json.dumps({"unhealthy": [5]}))
        wait_allocatable(cluster, "7")
        agent.wait_log(REFUSAL, timeout=60, count=already + 1)
        fake_state(cluster).write_text("{}")
        wait_allocatable(cluster, "8")
        agent.wait_log("Ascend910-5 is Healthy again", timeout=60)
    finally:
        restore = [{"op": "replace", "path": f"/rules/{index}/verbs", "value": verbs}]
        cluster.kubectl("patch", "clusterrole", name, "--type=json", f"-p={json.dumps(restore)}")
        fake_state(cluster).write_text("{}")
    refused = [line for line in agent.lines[before:] if re.search(REFUSAL, line)]
    assert len(refused) == 1, "\n".join(refused)


def test_the_agent_restarted_capacity_stays_and_allocatable_comes_back(
    cluster: Cluster, agents: list[AgentProcess]
) -> None:
    """The agent stopped and started again (the DaemonSet's update with maxUnavailable 1). The kubelet marks
    every chip Unhealthy when the agent's ListAndWatch stream ends and keeps Capacity for its grace period:
    every (Capacity, Allocatable) the API server holds meanwhile is (8, 8), or (8, 0) when a node status
    update fell between the old process's end and the new one's registration (the gap is printed, from the
    kubelet's log: a new Python process's start, about half a second here, so with the harness's 2 s status
    period the API shows the dip in about one restart in four)."""
    wait_allocatable(cluster, "8")
    before = len(cluster.device_plugin_gaps())
    watch = watch_capacity(cluster)
    try:
        assert watch.stdout is not None
        assert watch.stdout.readline().split() == ["8", "8"]  # the watch's first line: the node as it is now
        agents[-1].terminate(timeout=20)
        agents.append(start_agent(cluster, fakeState=str(fake_state(cluster))))
        agents[-1].wait_log(f"Registered resource {RESOURCE}", timeout=60)
        # All eight allocatable after the restart: a pod of eight runs.
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(one_pod_spec("all-eight", "eight", 8)))
        wait_running(cluster, "all-eight")
        assert len(chip_devices(runtime_spec(cluster, "all-eight", "eight"))) == 8
    finally:
        watch.terminate()
        seen, _ = watch.communicate(timeout=20)
        cluster.kubectl("delete", "pod", "all-eight", "--wait=true", "--timeout=60s", check=False, timeout=90)
    (gap,) = cluster.device_plugin_gaps()[before:]
    pairs = [line.split() for line in seen.splitlines() if line.strip()]
    print(f"kubelet gap {gap * 1000:.0f} ms; (Capacity, Allocatable) seen {pairs}")
    assert all(pair[0] == "8" and pair[1] in ("8", "0") for pair in pairs), pairs
