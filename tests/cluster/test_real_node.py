"""The real node: the chart installed and upgraded with Helm's engine, the DaemonSet's own pod running the
agent from its image on containerd (the devfs backend on the node's driver tree and the stand-in device nodes
in /dev), and workloads that start with their chips: what each container sees (`kubectl logs`, `kubectl
exec`) and what containerd made of it (the OCI spec), with the devices handed over by Allocate and through
CDI. Then day two: a rolling update of the agent to a second image tag while a workload runs, the agent's
container killed as an OOM kill would, and what bad input gets."""

from __future__ import annotations

import calendar
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import helm
from tests.cluster.agent import run_doctor, run_kubectl_ascend
from tests.cluster.devices import MANAGEMENT, numbers
from tests.cluster.harness import FIGURES, NODE_NAME, Cluster
from tests.cluster.node import wait_allocatable
from tests.cluster.pods import (
    IMAGE,
    RESOURCE,
    chip_devices,
    container_id,
    delete_pods,
    one_pod_spec,
    runtime_spec,
    shown,
    spec_envs,
    wait_running,
    wait_unschedulable,
)
from tests.cluster.polling import until
from tests.cluster.released import (
    DAEMONSET,
    NAMESPACE,
    DriverTree,
    agent_log,
    agent_pod,
    agent_pods,
    chart_values,
    keep_agent_logs,
    log_time,
    logged,
    released,
    remove_applied_chart,
    upgraded,
)

pytestmark = pytest.mark.e2e_cluster

REGISTERED = f"Registered resource {RESOURCE}"


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[DriverTree]:
    """The chart installed by Helm with CDI off (devices handed over by Allocate only), its pod registered."""
    remove_applied_chart(cluster)
    tree = DriverTree.make(cluster)
    installed = time.time()
    try:
        released(helm.install(cluster, chart_values(cluster, tree, cdiSpecDir=None)))
        pod = agent_pod(cluster)["metadata"]["name"]
        registered = log_time(logged(cluster, pod, REGISTERED))
        FIGURES["helm install -> the DaemonSet's pod registered (scheduled, image started, agent up)"] = (
            f"{registered - installed:.2f} s"
        )
        wait_allocatable(cluster, "8")
        yield tree
    finally:
        keep_agent_logs(cluster, "agent-pod")
        helm.uninstall(cluster)  # a failed install leaves a release to end too


def container_started(cluster: Cluster, container: str) -> float:
    """When containerd's StartContainer of ``container`` returned (its log's time, in seconds)."""
    log = (cluster.work / "logs" / "containerd.log").read_text(errors="replace")
    line = next(
        line
        for line in log.splitlines()
        if "StartContainer for" in line and container in line and "returns" in line
    )
    stamp = line.split('time="', 1)[1].split('"', 1)[0].rstrip("Z")
    whole, _, fraction = stamp.partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{fraction or 0}")


def hex_numbers(name: str) -> str:
    """A stand-in's numbers as `stat -c %t:%T` prints them inside a container."""
    major, minor = numbers(name)
    return f"{major:x}:{minor:x}"


def workload(cluster: Cluster, name: str, chips: int) -> float:
    """A pod of ``chips`` chips created and Running: seconds from its create to Running."""
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(one_pod_spec(name, name, chips)))
    wait_running(cluster, name)
    return time.monotonic() - started


def test_the_daemonsets_pod_runs_the_agent_from_its_image(cluster: Cluster, node: DriverTree) -> None:
    pod = agent_pod(cluster)
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] and status["restartCount"] == 0, status
    assert status["image"] in (IMAGE, IMAGE.removeprefix("docker.io/library/")), status["image"]
    lines = agent_log(cluster, pod["metadata"]["name"])
    registered = logged(cluster, pod["metadata"]["name"], REGISTERED)
    started = container_started(
        cluster, container_id(cluster, pod["metadata"]["name"], "ascend-agent", NAMESPACE)
    )
    FIGURES["agent pod: its container started (containerd) -> registered"] = (
        f"{log_time(registered) - started:.2f} s"
    )
    assert any("8 chips" in line.get("msg", "") or "Ascend910-7" in json.dumps(line) for line in lines), lines
    capacity = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)["status"][
        "capacity"
    ]
    assert capacity[RESOURCE] == "8"
    # The chips as the node's npu-smi named them (the device files alone say nothing of the model).
    assert any("910B4" in json.dumps(line) for line in lines), lines


def test_a_workload_sees_exactly_its_two_chips_and_the_management_devices(
    cluster: Cluster, node: DriverTree
) -> None:
    took = workload(cluster, "two-chips", 2)
    FIGURES["pod create -> Running with 2 chips on containerd"] = f"{took:.2f} s"
    try:
        devices, envs = shown(cluster, "two-chips")
        chips = {path for path in devices if path.startswith("/dev/davinci") and path[12:].isdigit()}
        assert len(chips) == 2, devices
        for path in chips:
            assert devices[path] == hex_numbers(path.removeprefix("/dev/")), (path, devices)
        for name in MANAGEMENT:
            assert devices.get(f"/dev/{name}") == hex_numbers(name), devices
        ours = {path for path, value in devices.items() if value.split(":")[0] in ("f0", "f1", "f2")}
        assert ours == chips | {f"/dev/{name}" for name in MANAGEMENT}, devices
        visible = sorted(int(path.removeprefix("/dev/davinci")) for path in chips)
        # The variable and nothing more of the Ascend runtime's (no VIRTUAL: whole chips).
        assert envs == {"ASCEND_VISIBLE_DEVICES": ",".join(map(str, visible)), "ASCEND_RUNTIME_OPTIONS": ""}
        # What containerd made: the same two device nodes, the variable in the process's environment.
        spec = runtime_spec(cluster, "two-chips", "two-chips")
        assert chip_devices(spec) == chips
        assert spec_envs(spec)["ASCEND_VISIBLE_DEVICES"] == envs["ASCEND_VISIBLE_DEVICES"]
        listed = cluster.kubectl("exec", "two-chips", "--", "ls", "/dev").stdout.split()
        assert sorted(name for name in listed if name.startswith("davinci") and name[7:].isdigit()) == sorted(
            path.removeprefix("/dev/") for path in chips
        ), listed
        # kubectl ascend, from the API alone: the summary the agent's pod published names the pod's chips.
        view = until(
            lambda: run_kubectl_ascend(cluster, "-o", "json"),
            lambda shown: shown.returncode == 0 and json.loads(shown.stdout)["totals"]["inUse"] == 2,
            "kubectl ascend showing the two chips in use",
        )
        (summary,) = json.loads(view.stdout)["nodes"]
        assert summary["node"] == NODE_NAME and summary["agent"]["ready"] is True and not summary["stale"]
        used = {chip["id"] for chip in summary["chips"] if chip["usedBy"] == ["default/two-chips"]}
        assert {f"Ascend910-{n}" for n in visible} == used, summary
        table = run_kubectl_ascend(cluster)
        assert "8 chips on 1 node: 8 healthy, 2 in use, 6 free" in table.stdout, table
    finally:
        delete_pods(cluster, "two-chips")


@pytest.mark.kubernetes("1.29", "CDI devices in Allocate's answer (DevicePluginCDIDevices), on from 1.29")
def test_through_cdi_containerd_applies_the_agents_spec(cluster: Cluster, node: DriverTree) -> None:
    """Upgraded to write its CDI spec where containerd reads it: Allocate names the chips as CDI devices and
    containerd resolves them from the spec (it refuses a container whose CDI device no spec defines). In
    ``ascend-runtime`` mode, Allocate hands over no device node and the spec gives each chip a variable: only
    containerd's reading of the spec can have put it there."""
    upgraded(cluster, chart_values(cluster, node))
    spec_file = cluster.cdi_dir / "huawei.com-npu.yaml"
    until(spec_file.exists, bool, f"the agent's CDI spec {spec_file}")
    workload(cluster, "by-cdi", 1)
    try:
        devices, envs = shown(cluster, "by-cdi")
        chips = [path for path in devices if path.startswith("/dev/davinci") and path[12:].isdigit()]
        assert len(chips) == 1, devices
        assert envs["ASCEND_VISIBLE_DEVICES"] == chips[0].removeprefix("/dev/davinci"), envs
    finally:
        delete_pods(cluster, "by-cdi")

    upgraded(cluster, chart_values(cluster, node, mode="ascend-runtime"))
    workload(cluster, "runtime-mode", 1)
    try:
        devices, envs = shown(cluster, "runtime-mode")
        assert not [path for path in devices if path.startswith("/dev/davinci")], devices
        visible = envs["ASCEND_VISIBLE_DEVICES"]
        assert envs == {
            "ASCEND_VISIBLE_DEVICES": visible,
            "ASCEND_RUNTIME_OPTIONS": "",
            f"ASCEND_CLAIMED_NPU_{visible}": visible,
        }, envs
    finally:
        delete_pods(cluster, "runtime-mode")
        upgraded(cluster, chart_values(cluster, node))


def test_a_rolling_update_to_a_new_tag_keeps_the_running_workload(cluster: Cluster, node: DriverTree) -> None:
    cluster.runtime.ctr("-n", "k8s.io", "images", "tag", "--force", IMAGE, f"{IMAGE}-second")
    workload(cluster, "keeps-running", 2)
    try:
        before = container_id(cluster, "keeps-running", "keeps-running")
        devices, _ = shown(cluster, "keeps-running")
        old = agent_pod(cluster)["metadata"]["name"]
        gaps = len(cluster.device_plugin_gaps())
        values = chart_values(cluster, node)
        values["image"] = {"tag": f"{IMAGE.rsplit(':', 1)[1]}-second"}
        released(helm.upgrade(cluster, values))
        new = agent_pod(cluster)
        assert new["metadata"]["name"] != old
        # (Its status names the image by the first of its tags: both name one image.)
        assert new["spec"]["containers"][0]["image"].endswith("-second"), new["spec"]
        logged(cluster, new["metadata"]["name"], REGISTERED)
        wait_allocatable(cluster, "8")
        gap = until(
            cluster.device_plugin_gaps, lambda found: len(found) > gaps, "the kubelet's re-registration"
        )
        FIGURES["rolling update: old ListAndWatch ended -> new registration (kubelet's log)"] = (
            f"{gap[-1]:.2f} s"
        )
        # The workload was never restarted and still has its devices.
        assert container_id(cluster, "keeps-running", "keeps-running") == before
        status = json.loads(cluster.kubectl("get", "pod", "keeps-running", "-o", "json").stdout)["status"]
        assert status["containerStatuses"][0]["restartCount"] == 0
        listed = cluster.kubectl("exec", "keeps-running", "--", "ls", "/dev").stdout.split()
        assert {path.removeprefix("/dev/") for path in devices if "davinci" in path} <= set(listed), listed
    finally:
        delete_pods(cluster, "keeps-running")
        upgraded(cluster, chart_values(cluster, node))


def test_the_agents_container_killed_is_restarted_and_registers_again(
    cluster: Cluster, node: DriverTree
) -> None:
    pod = agent_pod(cluster)
    name = pod["metadata"]["name"]
    registrations = cluster.kubelet_log().count("Got registration request from device plugin")
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    # As the kernel's OOM killer would: SIGKILL to the container's process, nothing else told.
    agent = container_id(cluster, name, "ascend-agent", NAMESPACE)
    cluster.runtime.ctr("-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", agent)
    restarted = until(
        lambda: agent_pod(cluster),
        lambda found: found["status"]["containerStatuses"][0]["restartCount"] > restarts,
        "the kubelet's restart of the agent's container",
    )
    assert restarted["metadata"]["name"] == name
    until(
        lambda: cluster.kubelet_log().count("Got registration request from device plugin"),
        lambda count: count > registrations,
        "the restarted agent's registration",
    )
    wait_allocatable(cluster, "8")


def test_a_workload_asking_for_more_chips_than_the_node_has_stays_pending(
    cluster: Cluster, node: DriverTree
) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(one_pod_spec("too-many", "too-many", 9)))
    try:
        wait_unschedulable(cluster, "too-many")
        described = cluster.kubectl("describe", "pod", "too-many").stdout
        assert f"Insufficient {RESOURCE}" in described, described
    finally:
        delete_pods(cluster, "too-many")


def test_an_image_not_on_the_node_is_err_image_never_pull(cluster: Cluster, node: DriverTree) -> None:
    values = chart_values(cluster, node)
    missing = ":not-on-this-node"
    values["image"] = {"tag": missing[1:], "pullPolicy": "Never"}
    released(helm.upgrade(cluster, values))
    try:

        def waiting(pods: list[dict[str, Any]]) -> str:
            for pod in pods:
                for status in pod["status"].get("containerStatuses", []):
                    reason = status.get("state", {}).get("waiting", {}).get("reason", "")
                    if reason:
                        return str(reason)
            return ""

        until(
            lambda: waiting(
                [p for p in agent_pods(cluster) if p["spec"]["containers"][0]["image"].endswith(missing)]
            ),
            lambda reason: reason == "ErrImageNeverPull",
            "the new pod waiting for an image it may not pull",
        )
    finally:
        upgraded(cluster, chart_values(cluster, node))


def test_a_host_path_the_node_lacks_is_named_in_the_pods_event(cluster: Cluster, node: DriverTree) -> None:
    values = chart_values(cluster, node)
    missing = str(cluster.work / "no-such-driver")
    values["host"]["driverDir"] = missing
    released(helm.upgrade(cluster, values))
    try:

        def events() -> str:
            return cluster.kubectl(
                "get", "events", "-n", NAMESPACE, "--field-selector", "reason=FailedMount", "-o",
                "jsonpath={.items[*].message}",
            ).stdout  # fmt: skip

        message = until(events, lambda text: missing in text, f"a FailedMount event naming {missing}")
        assert "hostPath type check failed" in message, message
        # The doctor on the node names the volume, the path and the chart's value.
        answer = run_doctor(cluster, "--json", "--kubeconfig", str(cluster.admin_kubeconfig), "--node-name",
                            NODE_NAME)  # fmt: skip
        checks = json.loads(answer.stdout)
        (pod_check,) = [check for check in checks if check["check"] == "pod on this node"]
        assert answer.returncode == 1 and pod_check["ok"] is False, checks
        assert f"volume ascend-driver: {missing} is not on this node" in pod_check["detail"], pod_check
        assert "host.driverDir" in pod_check["hint"], pod_check
    finally:
        upgraded(cluster, chart_values(cluster, node))


def test_the_agents_pod_may_write_only_its_own_nodes_config_maps(cluster: Cluster, node: DriverTree) -> None:
    """The Role grants configmaps writes in all of kube-system; the chart's policy leaves the agent's pod (its
    token bound to the pod, as the kubelet mounts it) only its own node's maps."""
    pod = agent_pod(cluster)
    token = cluster.kubectl(
        "create", "token", pod["spec"]["serviceAccountName"], "-n", NAMESPACE, "--duration=10m",
        "--bound-object-kind=Pod", f"--bound-object-name={pod['metadata']['name']}",
        f"--bound-object-uid={pod['metadata']['uid']}",
    ).stdout.strip()  # fmt: skip
    kubeconfig = cluster.work / "agent-pod.kubeconfig"
    cluster.write_kubeconfig(kubeconfig, token)

    def as_the_agent(*args: str) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl(f"--kubeconfig={kubeconfig}", "-n", "kube-system", *args, check=False)

    refused = as_the_agent("create", "configmap", "coredns-lookalike", "--from-literal=a=b")
    assert refused.returncode != 0, refused
    assert f"ascend-agent on node {NODE_NAME} may write only the ConfigMaps of that node" in refused.stderr
    own = as_the_agent(
        "patch",
        "configmap",
        f"ascend-agent-node-{NODE_NAME}",
        "--type=merge",
        "-p",
        '{"metadata":{"annotations":{"e2e":"own"}}}',
    )
    assert own.returncode == 0, own.stderr


def test_the_daemonset_is_the_charts(cluster: Cluster, node: DriverTree) -> None:
    daemonset = json.loads(
        cluster.kubectl("get", "daemonset", DAEMONSET, "-n", NAMESPACE, "-o", "json").stdout
    )
    assert daemonset["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert daemonset["status"]["numberReady"] == 1
