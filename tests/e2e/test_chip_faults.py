"""Fault codes, the fault policy, the flap hold and per-chip telemetry, through the stream the kubelet sees,
the agent's log, ``/metrics`` and ``list --json``; the devfs backend over a fake npu-smi."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import CONSTRUCTED, FIXTURES
from tests.support.agent_process import AgentProcess
from tests.support.host_tree import HostTree
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi, with_health

A3_OK = (FIXTURES / "Ascend910-A3x16-24.1.rc3.7-info.txt").read_text()
A3_ALARM = (CONSTRUCTED / "Ascend910-A3x16-24.1.rc3.7-info-alarm.txt").read_text()
A3_HEALTH = (CONSTRUCTED / "Ascend910-A3-24.1.rc3.7-info-t-health-i-1-c-1-alarm.txt").read_text()
HEALTH_ARGS = "info -t health -i 1 -c 1"
FAULT_TEXT = "node type=CPU, sensor type=Heartbeat, event state=heartbeat lost"
B4_OK = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()
BOARD_0 = (FIXTURES / "910B-D802-IT21HMDC-25.5.1-info-t-board-i0.txt").read_text()


@pytest.fixture
def npu_smi(short_dir: Path) -> FakeNpuSmi:
    fake = FakeNpuSmi(short_dir / "npu-smi")
    fake.set_output(HEALTH_ARGS, A3_HEALTH)
    return fake


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
        return text


def _sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the series ``name`` with ``labels`` (it may carry more: the chip holder's)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return float(sample.value)
    return None


def _agent(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, port: int, *extra: str
) -> AgentProcess:
    return AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", f"127.0.0.1:{port}",
         "--health-interval", "1", *extra]
    )  # fmt: skip


def _list(host: HostTree, npu_smi: FakeNpuSmi, *extra: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "list", "--backend", "devfs", "--host-root", str(host.root),
         "--npu-smi", str(npu_smi.path), "--json", *extra],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def test_error_codes_reach_the_kubelet_the_log_and_the_metrics(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi
) -> None:
    host.add_chips(range(16))
    npu_smi.set_output("info", A3_ALARM)
    port = _free_port()
    process = _agent(kubelet, host, npu_smi, port)
    try:
        sick = kubelet.wait_update(
            lambda u: len(u.devices) == 16 and u.health()["Ascend910-3"] == "Unhealthy"
        )
        assert sum(health == "Healthy" for health in sick.health().values()) == 15
        line = process.wait_log("Ascend910-3 is Unhealthy: ")[0]
        assert line.endswith(
            f"Ascend910-3 is Unhealthy: RestartNPU: Alarm, error code 80E3A203 ({FAULT_TEXT})"
        )
        metrics = _metrics(port)
        assert (
            _sample(
                metrics,
                "ascend_agent_chip_fault",
                device="Ascend910-3",
                code="80E3A203",
                fault_class="RestartNPU",
            )
            == 1
        )
        # Telemetry from the same table: die 0 of NPU 0 and the second die, whose Power is '-'.
        assert _sample(metrics, "ascend_agent_chip_temperature_celsius", device="Ascend910-0") == 36
        assert _sample(metrics, "ascend_agent_chip_power_watts", device="Ascend910-0") == 181.4
        assert _sample(metrics, "ascend_agent_chip_power_watts", device="Ascend910-1") is None
        assert _sample(metrics, "ascend_agent_chip_hbm_total_bytes", device="Ascend910-0") == 65536 * 2**20
        assert _sample(metrics, "ascend_agent_chip_hbm_used_bytes", device="Ascend910-15") == 3199 * 2**20
        assert _sample(metrics, "ascend_agent_chip_utilization_ratio", device="Ascend910-2") == 0
        # The health query ran for the change, then once every 3 queries while the Alarm stays (not once
        # per interval), and only for that chip.
        npu_smi.wait_count("info", npu_smi.count("info") + 2)
        asked, queries = npu_smi.count(HEALTH_ARGS), npu_smi.count("info")
        assert 1 <= asked <= 1 + queries // 3
        assert (
            sum("-t health" in line for line in (npu_smi.directory / "calls.log").read_text().splitlines())
            == asked
        )
        assert len(process.matching("Ascend910-3 is Unhealthy: ")) == 1, "logged once per change"

        npu_smi.set_output("info", A3_OK)
        kubelet.wait_update(
            lambda u: set(u.health().values()) == {"Healthy"}, after=kubelet.updates.index(sick) + 1
        )
        process.wait_log("Ascend910-3 reports no error code any more")
        assert (
            _sample(_metrics(port), "ascend_agent_chip_fault", device="Ascend910-3", code="80E3A203") is None
        )
    finally:
        process.close()


def test_codes_that_change_under_an_unchanged_alarm_are_seen(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi
) -> None:
    host.add_chips(range(16))
    npu_smi.set_output("info", A3_ALARM)
    process = _agent(kubelet, host, npu_smi, _free_port())
    try:
        process.wait_log("Ascend910-3 is Unhealthy: RestartNPU: Alarm, error code 80E3A203")
        npu_smi.set_output(HEALTH_ARGS, A3_HEALTH.replace("80E3A203", "80E18005"))
        npu_smi.wait_count(HEALTH_ARGS, 2, timeout=10)
        process.wait_log("Ascend910-3 is Unhealthy: RestartNPU: Alarm, error code 80E18005")
    finally:
        process.close()


def test_list_shows_the_faults_and_the_policy_decides(
    host: HostTree, npu_smi: FakeNpuSmi, short_dir: Path
) -> None:
    host.add_chips(range(16))
    npu_smi.set_output("info", A3_ALARM)
    row = _list(host, npu_smi)[3]
    assert (row["id"], row["health"]) == ("Ascend910-3", "Unhealthy")
    assert row["fault_class"] == "RestartNPU"
    assert row["faults"] == [{"code": "80E3A203", "text": FAULT_TEXT, "class": "RestartNPU"}]
    assert row["reason"] == f"RestartNPU: Alarm, error code 80E3A203 ({FAULT_TEXT})"
    config = short_dir / "policy.yaml"
    config.write_text('faultPolicy: {"80E3A203": healthy}\n')
    row = _list(host, npu_smi, "--config", str(config))[3]
    assert (row["health"], row["reason"], row["fault_class"]) == ("Healthy", "", "NotHandleFault")
    assert row["faults"] == [{"code": "80E3A203", "text": FAULT_TEXT, "class": "NotHandleFault"}], (
        "the codes stay visible"
    )


def test_a_flapping_chip_is_held_until_quiet(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi
) -> None:
    host.add_chips(range(8))
    npu_smi.set_output("info", B4_OK)
    port = _free_port()
    process = _agent(
        kubelet, host, npu_smi, port, "--flap-threshold", "2", "--flap-window", "60", "--flap-quiet", "3"
    )

    def chip_5(health: str, after: int) -> int:
        update = kubelet.wait_update(lambda u: u.health().get("Ascend910-5") == health, after=after)
        return kubelet.updates.index(update) + 1

    try:
        seen = chip_5("Healthy", 0)
        npu_smi.set_output("info", with_health(B4_OK, 5, "Critical"))
        seen = chip_5("Unhealthy", seen)
        npu_smi.set_output("info", B4_OK)
        seen = chip_5("Healthy", seen)  # recovered once: back at once
        assert not process.matching("held Unhealthy")
        npu_smi.set_output("info", with_health(B4_OK, 5, "Critical"))
        seen = chip_5("Unhealthy", seen)
        process.wait_log("Ascend910-5 is held Unhealthy: it turned Unhealthy 2 times within 60 s")
        npu_smi.set_output("info", B4_OK)
        npu_smi.wait_count("info", npu_smi.count("info") + 2)
        latest = kubelet.latest()
        assert latest is not None and latest.health()["Ascend910-5"] == "Unhealthy", process.output
        assert _sample(_metrics(port), "ascend_agent_chip_held", device="Ascend910-5") == 1
        chip_5("Healthy", seen)
        process.wait_log("Ascend910-5 is no longer held: Healthy for 3 s")
        assert _sample(_metrics(port), "ascend_agent_chip_held", device="Ascend910-5") == 0
    finally:
        process.close()


def test_chip_info_names_model_versions_and_serial_and_every_series_its_node(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi
) -> None:
    """Card 0's board record names its firmware and serial; card 1's read fails (left empty, asked once)."""
    host.add_chips(range(8))
    npu_smi.set_output("info", B4_OK)
    npu_smi.set_output("info -t board -i 0", BOARD_0)
    npu_smi.set_error("info -t board -i 1", "Error: get board info failed\n")
    port = _free_port()
    process = _agent(kubelet, host, npu_smi, port, "--node-name", "npu-node-7")
    try:
        npu_smi.wait_count("info -t board -i 1", 1)  # one card a query: cards 0 and 1 asked
        npu_smi.wait_count("info", npu_smi.count("info") + 2)  # a health query since: the facts are in
        metrics = _metrics(port)
        info = {"model": "910B4", "driver_version": "25.0.rc1.1", "node": "npu-node-7"}
        assert _sample(
            metrics, "ascend_agent_chip_info", device="Ascend910-0", bus_id="0000:C1:00.0",
            firmware_version="7.8.0.6.201", serial="1025C9048791", **info,
        ) == 1  # fmt: skip
        assert _sample(
            metrics, "ascend_agent_chip_info", device="Ascend910-1", firmware_version="", serial="", **info
        ) == 1  # fmt: skip
        assert npu_smi.count("info -t board -i 1") == 1
        assert process.matching("npu-smi info -t board -i 1 gave no board record")
        unlabelled = [
            sample.name
            for family in text_string_to_metric_families(metrics)
            for sample in family.samples
            if sample.labels.get("node") != "npu-node-7"
        ]
        assert not unlabelled
    finally:
        process.close()
