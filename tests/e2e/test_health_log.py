"""Every health transition reaches the log once, per device, with its reason; every Allocate answered too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.support import FIXTURES
from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.files import replace_text
from tests.support.host_tree import HostTree
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi

B4_INFO = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()


def test_fake_fault_and_recovery_are_logged_once(kubelet: KubeletStandin, short_dir: Path) -> None:
    state = short_dir / "state.json"
    state.write_text("{}")
    agent = fake_agent(kubelet.directory, "--fake-state", str(state))
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 8)
        replace_text(state, json.dumps({"unhealthy": [3]}))
        agent.wait_log(r"Ascend910-3 is Unhealthy: fault scripted in the state file$")
        replace_text(state, "{}")
        agent.wait_log(r"Ascend910-3 is Healthy again$")
        replace_text(state, json.dumps({"absent": [5]}))
        agent.wait_log(r"Ascend910-5 is Unhealthy: absent")
        assert len(agent.matching("Ascend910-3 is Unhealthy")) == 1
        assert agent.matching(r"Ascend910-[0-24-7] is Healthy again") == [], "only transitions are logged"
    finally:
        agent.close()


def test_allocate_is_logged_with_the_ids(kubelet: KubeletStandin, short_dir: Path) -> None:
    agent = fake_agent(kubelet.directory)
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 8)
        channel, stub = kubelet.plugin_stub()
        request = kubelet.pb.AllocateRequest(
            container_requests=[
                kubelet.pb.ContainerAllocateRequest(devices_ids=["Ascend910-1", "Ascend910-6"])
            ]
        )
        stub.Allocate(request, timeout=5)
        stub.Allocate(request, timeout=5)  # answered from memory, logged all the same
        channel.close()
        agent.wait_log(r"INFO +Allocated Ascend910-1,Ascend910-6$", count=2)
    finally:
        agent.close()


@pytest.fixture
def devfs_agent(
    kubelet: KubeletStandin, short_dir: Path
) -> Iterator[tuple[AgentProcess, HostTree, FakeNpuSmi]]:
    host = HostTree(short_dir / "host").add_driver().add_management().add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", B4_INFO)
    agent = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", "", "--health-interval", "1"]
    )  # fmt: skip
    kubelet.wait_update(lambda u: len(u.devices) == 8)
    yield agent, host, npu_smi
    agent.close()


def test_devfs_missing_device_node_and_alarm_are_logged(
    devfs_agent: tuple[AgentProcess, HostTree, FakeNpuSmi],
) -> None:
    agent, host, npu_smi = devfs_agent
    (host.dev / "davinci3").unlink()
    agent.wait_log(r"Ascend910-3 is Unhealthy: device node /dev/davinci3 is missing$")
    (host.dev / "davinci3").write_text("")
    agent.wait_log(r"Ascend910-3 is Healthy again$")
    lines = B4_INFO.splitlines(keepends=True)
    row = next(i for i, line in enumerate(lines) if line.startswith("| 2 ") and "910B4" in line)
    lines[row] = lines[row].replace("OK     ", "Alarm  ", 1)
    assert "Alarm" in lines[row]
    npu_smi.set_output("info", "".join(lines))
    agent.wait_log(r"Ascend910-2 is Unhealthy: .*Alarm")


def test_a_refusal_repeated_a_thousand_times_is_logged_once_and_counted(
    kubelet: KubeletStandin, short_dir: Path
) -> None:
    state = short_dir / "state.json"
    state.write_text('{"unhealthy": [3]}')
    agent = fake_agent(kubelet.directory, "--fake-state", str(state))
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 8)
        channel, stub = kubelet.plugin_stub()

        def refuse(device: str) -> None:
            request = kubelet.pb.AllocateRequest(
                container_requests=[kubelet.pb.ContainerAllocateRequest(devices_ids=[device])]
            )
            with pytest.raises(grpc.RpcError):
                stub.Allocate(request, timeout=5)

        for n in range(1000):
            refuse(f"Ascend910-{100 + n}")  # a thousand different unknown IDs: one kind of refusal
        # A refusal of another kind (an Unhealthy chip) is logged at once.
        refuse("Ascend910-3")
        channel.close()
        agent.wait_log(r"Allocate refused for huawei.com/Ascend910: device 'Ascend910-3' is Unhealthy")
        assert len(agent.matching("Allocate refused.*unknown device")) == 1
    finally:
        agent.close()


def test_the_effective_configuration_is_logged_at_start(kubelet: KubeletStandin, short_dir: Path) -> None:
    config = short_dir / "config.yaml"
    config.write_text("fakeChips: 8\n")
    agent = fake_agent(kubelet.directory, "--config", str(config), env={"ASCEND_AGENT_REPLICAS": "1"})
    try:
        (line,) = agent.wait_log(r"Configuration: ")
        assert "backend=fake (flag)" in line
        assert "fakeChips=8 (file)" in line
        assert "replicas=1 (env)" in line
        assert "healthInterval=5.0 (default)" in line
    finally:
        agent.close()
