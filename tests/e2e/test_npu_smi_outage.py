"""npu-smi down is the tool's outage, not a fault of every chip: the kubelet sees the chips Unhealthy while it
lasts, /readyz, the metrics, /chips and one log line say npu-smi is down, and the flap hold counts nothing, so
the chips come back as soon as npu-smi answers however often it went down."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import CONSTRUCTED, FIXTURES
from tests.support.agent_process import AgentProcess
from tests.support.host_tree import HostTree
from tests.support.http_probe import free_port, get, wait_answer
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi

B4_INFO = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()
BUSY = (CONSTRUCTED / "error-info-dcmi-8020-busy.txt").read_text()
DOWN = "npu-smi failed 2 times in a row"


@pytest.fixture
def npu_smi(short_dir: Path) -> FakeNpuSmi:
    fake = FakeNpuSmi(short_dir / "npu-smi")
    fake.set_output("info", B4_INFO)
    return fake


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def agent(kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, port: int) -> Iterator[AgentProcess]:
    host.add_chips(range(8))
    process = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", f"127.0.0.1:{port}",
         "--health-interval", "1", "--health-failure-threshold", "2", "--flap-threshold", "3",
         "--flap-window", "600", "--flap-quiet", "600"]
    )  # fmt: skip
    try:
        kubelet.wait_registrations(1)
        kubelet.wait_update(lambda u: len(u.devices) == 8 and set(u.health().values()) == {"Healthy"})
        yield process
    finally:
        process.close()


def _chips(port: int) -> Any:
    answer = get(port, "/chips")
    assert answer is not None and answer[0] == 200, answer
    return json.loads(answer[1])


def test_three_npu_smi_outages_hold_no_chip(
    kubelet: KubeletStandin, agent: AgentProcess, npu_smi: FakeNpuSmi, port: int
) -> None:
    seen = len(kubelet.updates)
    for burst in range(1, 4):
        npu_smi.set_output("info", BUSY)
        agent.wait_log(DOWN, count=burst, timeout=15)
        down = kubelet.wait_update(lambda u: set(u.health().values()) == {"Unhealthy"}, after=seen)
        if burst == 1:
            _, body = wait_answer(port, "/readyz", lambda status, body: status == 503 and DOWN in body)
            assert "ret -8020" in body
            metrics = get(port, "/metrics")
            assert metrics is not None and "ascend_agent_npu_smi_down 1.0" in metrics[1]
            chips = _chips(port)
            assert chips["npu_smi"]["down"] is True and DOWN in chips["npu_smi"]["reason"]
            assert {row["health_unknown"] for row in chips["chips"]} == {True}
            assert {row["held"] for row in chips["chips"]} == {False}
        npu_smi.set_output("info", B4_INFO)
        agent.wait_log("npu-smi answers again", count=burst, timeout=15)
        # Back at once, the third time too: an outage is no turn of the flap hold (threshold 3).
        up = kubelet.wait_update(
            lambda u: set(u.health().values()) == {"Healthy"}, after=kubelet.updates.index(down) + 1
        )
        seen = kubelet.updates.index(up) + 1
    wait_answer(port, "/readyz", lambda status, body: status == 200)
    chips = _chips(port)
    assert chips["npu_smi"] == {"down": False, "reason": ""}
    assert {row["held"] for row in chips["chips"]} == {False}
    metrics = get(port, "/metrics")
    assert metrics is not None and "ascend_agent_npu_smi_down 0.0" in metrics[1]
    assert 'ascend_agent_chip_held{device="Ascend910-0"} 1.0' not in metrics[1]
    assert agent.matching("is held Unhealthy") == []
    assert agent.matching(r"Ascend910-\d is Unhealthy") == [], "the outage's one line, not one per chip"
    assert len(agent.matching(DOWN)) == 3


def _unconfirmed_agent(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, port: int, config: Path
) -> AgentProcess:
    host.add_chips(range(8))
    return AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", f"127.0.0.1:{port}",
         "--health-interval", "1", "--config", str(config)]
    )  # fmt: skip


def test_chips_whose_health_nothing_confirmed_are_unhealthy_until_npu_smi_answers(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, port: int, short_dir: Path
) -> None:
    """npu-smi failing from the start (``dcmi module initialize failed. ret is -8005``) with ``model:`` set:
    the chips come from their device files alone and nothing watches them. They were all Healthy, /readyz
    200 and ascend_agent_npu_smi_down 0."""
    npu_smi.set_mode("fail")
    config = short_dir / "c.yaml"
    config.write_text("model: 910B4\n")
    agent = _unconfirmed_agent(kubelet, host, npu_smi, port, config)
    try:
        kubelet.wait_registrations(1)
        down = kubelet.wait_update(lambda u: len(u.devices) == 8)
        assert set(down.health().values()) == {"Unhealthy"}, down.health()
        _, body = wait_answer(port, "/readyz", lambda status, body: status == 503 and "npu-smi" in body)
        assert "npu-smi has not answered yet" in body and "ret -8005" in body
        metrics = get(port, "/metrics")
        assert metrics is not None and "ascend_agent_npu_smi_down 1.0" in metrics[1]
        chips = _chips(port)
        assert chips["npu_smi"]["down"] is True
        assert {row["health_unknown"] for row in chips["chips"]} == {True}
        agent.wait_log("npu-smi has not answered yet: every chip is Unhealthy .*healthyWithoutNpuSmi: true")
        npu_smi.set_mode("ok")
        kubelet.wait_update(
            lambda u: set(u.health().values()) == {"Healthy"}, after=kubelet.updates.index(down) + 1
        )
        wait_answer(port, "/readyz", lambda status, body: status == 200)
        metrics = get(port, "/metrics")
        assert metrics is not None and "ascend_agent_npu_smi_down 0.0" in metrics[1]
    finally:
        agent.close()


def test_healthy_without_npu_smi_runs_the_node_on_its_device_files(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, port: int, short_dir: Path
) -> None:
    npu_smi.set_mode("fail")
    config = short_dir / "c.yaml"
    config.write_text("model: 910B4\nhealthyWithoutNpuSmi: true\n")
    agent = _unconfirmed_agent(kubelet, host, npu_smi, port, config)
    try:
        agent.wait_log("healthyWithoutNpuSmi is on: .*Healthy from its device file alone")
        kubelet.wait_registrations(1)
        up = kubelet.wait_update(lambda u: len(u.devices) == 8)
        assert set(up.health().values()) == {"Healthy"}
        wait_answer(port, "/readyz", lambda status, body: status == 200)
        metrics = get(port, "/metrics")
        # The chips and /readyz follow the setting; the gauge is npu-smi's state, the one alert left.
        assert metrics is not None and "ascend_agent_npu_smi_down 1.0" in metrics[1]
        assert 'ascend_agent_npu_smi_failures_total{reason="driver"}' in metrics[1]
        agent.wait_log(r"npu-smi has not answered yet \(.*ret -8005.*\): the chips are Healthy")
    finally:
        agent.close()
