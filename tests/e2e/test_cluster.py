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

from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.apiserver import ApiServer
from tests.support.cli import run_cli
from tests.support.http_probe import free_port, wait_answer
from tests.support.kubelet_standin import KubeletStandin
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
        self.process = AgentProcess(
            [
                "run",
                "--backend",
                "fake",
                "--kubelet-dir",
                str(kubelet.directory),
                "--metrics-address",
                "",
                "--config",
                str(self.config),
                "--kubeconfig",
                str(apiserver.kubeconfig),
                "--node-name",
                NODE,
            ]
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
    labels = apiserver.wait_for(lambda: _labels(apiserver), lambda got: "accelerator" in got, timeout=2)
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
    assert labels["accelerator"] == "huawei-Ascend310P"
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
        kubelet.wait_for(lambda: podresources.calls >= calls + 2, what="two more List calls")
        assert len(process.matching("Cannot tell which pod")) == 1
    finally:
        process.close()
