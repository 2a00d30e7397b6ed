"""The agent's cluster side end to end: the agent as a process, the kubelet stand-in, and the Kubernetes API
emulator reached through a kubeconfig."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import CONSTRUCTED, FIXTURES
from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.apiserver import ApiServer
from tests.support.cli import run_cli
from tests.support.host_tree import HostTree
from tests.support.http_probe import free_port, wait_answer
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.podresources import PodResourcesStandin

NODE = "node-1"


def _labels(apiserver: ApiServer) -> dict[str, str]:
    node = apiserver.get("nodes", NODE)
    assert node is not None
    return dict(node["metadata"].get("labels") or {})


class _Agent:
    """The agent on the fake backend with its chips from a config file, and the cluster side on."""

    def __init__(
        self, kubelet: KubeletStandin, apiserver: ApiServer, directory: Path, **settings: Any
    ) -> None:
        self.config = directory / "config.yaml"
        self.settings = {"fakeChips": 8, "fakeModel": "910B3", **settings}
        self._write()
        self.process = fake_agent(
            kubelet.directory,
            *("--config", str(self.config), "--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE),
        )

    def _write(self) -> None:
        temporary = self.config.with_name(".config.tmp")
        temporary.write_text(yaml.safe_dump(self.settings))
        os.replace(temporary, self.config)

    def change(self, **settings: Any) -> None:
        self.settings.update(settings)
        self._write()
        self.process.proc.send_signal(signal.SIGHUP)


@pytest.fixture
def started(kubelet: KubeletStandin, apiserver: ApiServer, short_dir: Path) -> Iterator[list[_Agent]]:
    agents: list[_Agent] = []
    yield agents
    for agent in agents:
        agent.process.close()


def test_labels_set_on_start_and_follow_the_chip_set(
    kubelet: KubeletStandin, apiserver: ApiServer, short_dir: Path, started: list[_Agent]
) -> None:
    apiserver.put(
        "nodes",
        {"metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, "huawei.com/npu.stale": "x"}}},
    )
    agent = _Agent(kubelet, apiserver, short_dir)
    started.append(agent)
    labels = apiserver.wait_for(lambda: _labels(apiserver), lambda got: "accelerator" in got, timeout=10)
    assert labels == {
        "kubernetes.io/hostname": NODE,
        "accelerator": "huawei-Ascend910",
        "node.kubernetes.io/npu.chip.name": "910B3",
        "mind-cluster/npu-chip-memory": "64G",
        "huawei.com/npu.count": "8",
        "huawei.com/npu.product": "Ascend910B3",
        "huawei.com/npu.family": "910B",
        "huawei.com/npu.memory": "65536",
        "huawei.com/npu.replicas": "1",
        "huawei.com/npu.numa-nodes": "2",
        "huawei.com/npu.topology": "full-mesh",
    }

    agent.change(fakeChips=2, fakeModel="310P3")
    labels = apiserver.wait_for(
        lambda: _labels(apiserver), lambda got: got.get("huawei.com/npu.count") == "2", timeout=5
    )
    assert labels["accelerator"] == "huawei-Ascend910", "the DaemonSet's nodeSelector is never changed"
    assert labels["node.kubernetes.io/npu.chip.name"] == "310P3"
    assert "mind-cluster/npu-chip-memory" not in labels and "huawei.com/npu.memory" not in labels
    assert labels["kubernetes.io/hostname"] == NODE
    patches = [
        s
        for s in apiserver.seen()
        if s.verb == "patch" and s.resource == "nodes" and "labels" in s.data["metadata"]
    ]
    assert len(patches) == 2, "one patch per chip set"
    assert all(set(p.data["metadata"]) == {"labels"} for p in patches)

    agent.change(replicas=4)  # a config reload: the label follows the running setting
    apiserver.wait_for(
        lambda: _labels(apiserver), lambda got: got.get("huawei.com/npu.replicas") == "4", timeout=5
    )


def _series(device: str, namespace: str, pod: str, container: str) -> str:
    """The device_health series of ``device`` with its holder's labels (exposed in sorted order)."""
    labels = f'container="{container}",device="{device}",namespace="{namespace}",pod="{pod}"'
    return re.escape(f'ascend_agent_device_health{{{labels},resource="huawei.com/Ascend910"}} 1.0')


def test_metrics_and_list_name_the_pod_holding_each_chip(
    kubelet: KubeletStandin, podresources: PodResourcesStandin, short_dir: Path
) -> None:
    port = free_port()
    # A long health interval: only the refresh after Allocate can show the holder in time.
    process = fake_agent(
        kubelet.directory,
        "--metrics-address",
        f"127.0.0.1:{port}",
        "--pod-resources-socket",
        str(podresources.path),
        "--health-interval",
        "600",
        "--no-cluster",
    )
    try:
        kubelet.wait_registrations(1)
        free = _series("Ascend910-3", "", "", "")
        wait_answer(port, "/metrics", lambda status, body: re.search(free, body) is not None)
        podresources.hold("huawei.com/Ascend910", ["Ascend910-3"], "team-a", "train-0", "main")
        channel, stub = kubelet.plugin_stub()
        with channel:
            stub.Allocate(  # type: ignore[attr-defined]
                kubelet.pb.AllocateRequest(
                    container_requests=[kubelet.pb.ContainerAllocateRequest(devices_ids=["Ascend910-3"])]
                ),
                timeout=5,
            )
        held = _series("Ascend910-3", "team-a", "train-0", "main")
        _, body = wait_answer(port, "/metrics", lambda status, body: re.search(held, body) is not None)
        assert re.search(_series("Ascend910-2", "", "", ""), body)
        assert not process.matching("Cannot tell which pod")
    finally:
        process.close()

    listed = run_cli("list", "--backend", "fake", "--pod-resources-socket", str(podresources.path), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row["holders"] for row in json.loads(listed.stdout)}
    assert rows["Ascend910-3"] == [{"namespace": "team-a", "pod": "train-0", "container": "main"}]
    assert rows["Ascend910-0"] == []
    table = run_cli("list", "--backend", "fake", "--pod-resources-socket", str(podresources.path))
    line = next(line for line in table.stdout.splitlines() if line.startswith("Ascend910-3 "))
    assert "team-a/train-0/main" in line.split()


def test_a_refusing_pod_resources_socket_costs_one_warning(
    kubelet: KubeletStandin, podresources: PodResourcesStandin
) -> None:
    podresources.refuse = True
    process = fake_agent(
        kubelet.directory,
        "--pod-resources-socket",
        str(podresources.path),
        "--health-interval",
        "1",
        "--no-cluster",
    )
    try:
        kubelet.wait_registrations(1)
        process.wait_log("Cannot tell which pod holds which chip: .* refused List")
        calls = podresources.calls
        podresources.wait_calls(calls + 2)
        assert len(process.matching("Cannot tell which pod")) == 1
    finally:
        process.close()


def test_doctor_names_pods_on_unhealthy_chips_and_the_api_state(
    kubelet: KubeletStandin, apiserver: ApiServer, podresources: PodResourcesStandin, short_dir: Path
) -> None:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    apiserver.fail(403, verb="patch", resource="nodes")
    state = short_dir / "state.json"
    state.write_text(json.dumps({"unhealthy": [3]}))
    podresources.hold("huawei.com/Ascend910", ["Ascend910-3"], "team-a", "train-0", "main")
    podresources.hold("huawei.com/Ascend910", ["Ascend910-4"], "team-b", "other", "main")
    port = free_port()
    process = fake_agent(
        kubelet.directory,
        "--fake-state",
        str(state),
        "--metrics-address",
        f"127.0.0.1:{port}",
        "--kubeconfig",
        str(apiserver.kubeconfig),
        "--node-name",
        NODE,
    )
    try:
        kubelet.wait_registrations(1)
        process.wait_log("patch nodes failed: 403")
        result = run_cli(
            "doctor", "--json", "--host-root", str(short_dir), "--npu-smi", str(short_dir / "absent"),
            "--kubelet-dir", str(kubelet.directory), "--metrics-address", f"127.0.0.1:{port}",
            "--pod-resources-socket", str(podresources.path), timeout=60,
        )  # fmt: skip
    finally:
        process.close()
    assert "Traceback" not in result.stderr, result.stderr
    checks = {c["check"]: c for c in json.loads(result.stdout)}
    held = checks["pods on Unhealthy chips"]
    assert held["ok"] is False
    assert held["detail"] == "Ascend910-3 held by team-a/train-0/main"
    api = checks["kubernetes api (agent)"]
    assert api["ok"] is False
    assert "patch nodes: 403 Forbidden: the agent may not patch nodes" in api["detail"]
    assert apiserver.url in api["detail"]


def test_events_for_a_chip_turning_unhealthy_and_back(
    kubelet: KubeletStandin, apiserver: ApiServer, short_dir: Path, started: list[_Agent]
) -> None:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    state = short_dir / "state.json"
    state.write_text("{}")
    agent = _Agent(kubelet, apiserver, short_dir, fakeState=str(state))
    started.append(agent)
    apiserver.wait_for(lambda: _labels(apiserver), lambda got: "accelerator" in got)
    assert apiserver.list("events") == [], "a Healthy chip at start is no transition"

    def reasons() -> list[tuple[str, str, int]]:
        return sorted((e["reason"], e["message"], e["count"]) for e in apiserver.list("events", "default"))

    state.write_text(json.dumps({"unhealthy": [3]}))
    apiserver.wait_for(reasons, lambda got: len(got) == 1)
    state.write_text("{}")
    assert apiserver.wait_for(reasons, lambda got: len(got) == 2) == [
        ("NPUHealthy", "Ascend910-3 is Healthy again", 1),
        ("NPUUnhealthy", "Ascend910-3 is Unhealthy: fault scripted in the state file", 1),
    ]


@pytest.mark.parametrize("fault", ["hang", 403, 500])
def test_the_kubelet_path_does_not_wait_for_the_api_server(
    kubelet: KubeletStandin, apiserver: ApiServer, fault: int | str, short_dir: Path, started: list[_Agent]
) -> None:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    apiserver.fail(fault)  # type: ignore[arg-type]
    state = short_dir / "state.json"
    state.write_text(json.dumps({"unhealthy": [5]}))  # an Event to write from the start
    # The labels' and the Events' channels only (the device-info ConfigMap has its own test).
    agent = _Agent(kubelet, apiserver, short_dir, fakeState=str(state), deviceInfo=False, nodeSummary=False)
    started.append(agent)
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda update: len(update.devices) == 8, what="the device list")
    channel, stub = kubelet.plugin_stub()
    with channel:
        response = stub.Allocate(  # type: ignore[attr-defined]
            kubelet.pb.AllocateRequest(
                container_requests=[kubelet.pb.ContainerAllocateRequest(devices_ids=["Ascend910-0"])]
            ),
            timeout=5,
        )
    assert response.container_responses[0].envs["ASCEND_VISIBLE_DEVICES"] == "0"
    if fault == "hang":
        # Both features' first requests are in flight and hang; the kubelet was served meanwhile.
        apiserver.wait_for(apiserver.seen, lambda seen: {s.resource for s in seen} >= {"nodes", "events"})
        return
    # Each channel retries with back-off; a failure kind is logged once however often it repeats.
    apiserver.wait_for(apiserver.seen, lambda seen: sum(s.resource == "nodes" for s in seen) >= 3, timeout=15)
    failures = agent.process.matching(r"Kubernetes API .* failed: ")
    assert len(failures) == 2, failures
    assert any(f"get nodes failed: {fault}" in line for line in failures), failures
    assert any(f"create events failed: {fault}" in line for line in failures), failures
    if fault == 403:
        assert any("the agent may not create events (check its RBAC)" in line for line in failures)
    apiserver.behave()
    agent.process.wait_log("Kubernetes API: get nodes works again", timeout=35)
    apiserver.wait_for(lambda: _labels(apiserver), lambda got: "accelerator" in got, timeout=35)


def test_labels_on_the_devfs_backend_carry_the_driver_and_hbm(
    kubelet: KubeletStandin, apiserver: ApiServer, host: HostTree, short_dir: Path
) -> None:
    host.add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    process = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", "",
         "--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE],
    )  # fmt: skip
    try:
        labels = apiserver.wait_for(lambda: _labels(apiserver), lambda got: "accelerator" in got, timeout=5)
    finally:
        process.close()
    assert labels["huawei.com/driver.version"] == "25.0.rc1.1"
    assert labels["node.kubernetes.io/npu.chip.name"] == "910B4"
    assert labels["mind-cluster/npu-chip-memory"] == "32G"
    assert labels["huawei.com/npu.memory"] == "32768"
    assert labels["huawei.com/npu.count"] == "8"


@pytest.mark.parametrize("outage", ["npu-smi -8020", "no device files yet"])
def test_labels_stay_while_the_chips_are_unknown(
    kubelet: KubeletStandin, apiserver: ApiServer, host: HostTree, short_dir: Path, outage: str
) -> None:
    """The node's labels from before (``accelerator`` places the DaemonSet's pod there) are neither removed
    nor rewritten while the agent sees no chips; chips it sees again set them."""
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    if outage == "npu-smi -8020":
        host.add_chips(range(8))
        npu_smi.set_output("info", (CONSTRUCTED / "error-info-dcmi-8020-busy.txt").read_text())
    else:
        npu_smi.set_mode("fail")
    before = {
        "kubernetes.io/hostname": NODE,
        "accelerator": "huawei-Ascend910",
        "node.kubernetes.io/npu.chip.name": "910B4",
        "huawei.com/npu.count": "8",
    }
    apiserver.put("nodes", {"metadata": {"name": NODE, "labels": before}})
    process = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", "", "--health-interval", "1",
         "--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE],
    )  # fmt: skip
    try:
        process.wait_log("Node labels kept as they are: the agent sees no chips", timeout=10)
        queries = npu_smi.count("info")
        npu_smi.wait_count("info", queries + 2)  # reconciles with the cluster side on
        assert _labels(apiserver) == before
        host.add_chips(range(8))
        npu_smi.set_mode("ok")
        npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
        labels = apiserver.wait_for(
            lambda: _labels(apiserver), lambda got: "huawei.com/driver.version" in got, timeout=10
        )
    finally:
        process.close()
    assert labels["accelerator"] == "huawei-Ascend910"
    assert labels["huawei.com/npu.count"] == "8"
    removals = [
        s.data
        for s in apiserver.seen()
        if s.verb == "patch"
        and s.resource == "nodes"
        and None in s.data["metadata"].get("labels", {}).values()
    ]
    assert removals == [], "no label was removed"
