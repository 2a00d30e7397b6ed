"""The chips' training facts through a fake hccn_tool and npu-smi printing the shared real outputs: read at
start, again every minute (a few chips per query) and when a chip comes back; a timeout, garbage or another
chip's answer keeps the last good value with one log line per change; no tool, or a 310P node: none, quietly.
The clock is the test's: no waiting."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ascend_agent.backends.training import ChipFacts, TrainingProbe, TrainingTarget
from ascend_agent.config import Settings
from ascend_agent.model import Generation, SuperPod
from tests.support.clock import ManualClock
from tests.support.hccn_fake import FakeHccnTool
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.training_fixtures import per_chip

EIGHT = per_chip("hccn_tool-ip-g_fixture-8dev.txt")
A3_IPS = per_chip("hccn_tool-ip-g_A3-log-decoded.txt")
A3_SPOD = per_chip("npu-smi-info-t-spod-info_A3-log-decoded.txt")
VNIC = "vnic link status: UP\nvnic ipaddr: 192.168.2.{}\nvnic netmask: 255.255.255.0\n"


@pytest.fixture
def tool(short_dir: Path) -> FakeHccnTool:
    fake = FakeHccnTool(short_dir / "hccn")
    for chip, text in EIGHT.items():
        fake.set_output(f"-i {chip} -ip -g", text)
    return fake


@pytest.fixture
def npu_smi(short_dir: Path) -> FakeNpuSmi:
    return FakeNpuSmi(short_dir / "npu-smi")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _probe_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The probe's own lines: asyncio's child watcher may warn of a killed tool's pid under load."""
    return [record for record in caplog.records if record.name == "ascend_agent.backends.training"]


def _probe(
    tool: FakeHccnTool | Path, npu_smi: FakeNpuSmi, clock: ManualClock, timeout: float = 30.0
) -> TrainingProbe:
    """A probe of ``tool``; its tools given ``timeout`` s, short only where a test waits out hangs."""
    path = tool.path if isinstance(tool, FakeHccnTool) else tool
    settings = Settings(hccn_tool=str(path), npu_smi=str(npu_smi.path), npu_smi_timeout=timeout)
    return TrainingProbe(settings, clock=clock)


def _targets(ids: range | list[int], generation: Generation = Generation.ASCEND910B) -> list[TrainingTarget]:
    dies = 2 if generation is Generation.ASCEND910A3 else 1
    return [TrainingTarget(i, i // dies, i % dies, generation, answering=True) for i in ids]


def _ips(probe: TrainingProbe, ids: range | list[int]) -> list[str | None]:
    return [probe.facts(i).device_ip for i in ids]


async def test_eight_chips_at_start_then_spread_over_the_minute(
    tool: FakeHccnTool, npu_smi: FakeNpuSmi, clock: ManualClock
) -> None:
    probe = _probe(tool, npu_smi, clock)
    await probe.refresh(_targets(range(8)), interval=5.0)
    assert _ips(probe, range(8)) == [f"10.10.0.1{i}" for i in range(8)]
    assert tool.calls() == 8
    assert npu_smi.calls() == 0  # spod-info is for A3 dies only

    clock.now += 30
    await probe.refresh(_targets(range(8)), interval=5.0)
    assert tool.calls() == 8  # nothing due within the minute

    clock.now += 31
    tool.set_output("-i 0 -ip -g", "ipaddr:10.10.1.10\nnetmask:255.255.255.0\n")
    await probe.refresh(_targets(range(8)), interval=5.0)
    # 8 chips, a 5 s interval: one chip per query finishes a round within the minute.
    assert tool.calls() == 9
    assert probe.facts(0).device_ip == "10.10.1.10"


async def test_a_chip_that_comes_back_is_read_at_once(
    tool: FakeHccnTool, npu_smi: FakeNpuSmi, clock: ManualClock
) -> None:
    probe = _probe(tool, npu_smi, clock)
    await probe.refresh(_targets(range(2)), interval=5.0)
    gone = [TrainingTarget(0, 0, 0, Generation.ASCEND910B, answering=False), *_targets([1])]
    await probe.refresh(gone, interval=5.0)
    assert tool.count("-i 0 -ip -g") == 1
    tool.set_output("-i 0 -ip -g", "ipaddr:10.10.9.10\nnetmask:255.255.255.0\n")
    await probe.refresh(_targets(range(2)), interval=5.0)
    assert tool.count("-i 0 -ip -g") == 2
    assert probe.facts(0).device_ip == "10.10.9.10"
    assert tool.count("-i 1 -ip -g") == 1


async def test_no_ip_preset_is_none_and_ipv6_is_asked_then(
    tool: FakeHccnTool, npu_smi: FakeNpuSmi, clock: ManualClock
) -> None:
    tool.clear("-i 2 -ip -g")
    tool.set_output("-i 3 -ip -g", "ipaddr:0.0.0.0\nnetmask:0.0.0.0\n")
    tool.set_output("-i 3 -ip -inet6 -g", "ipv6_address:2001:db8::3\nprefix_length:64\n")
    tool.set_output("-i 2 -ip -inet6 -g", "ipv6_address:fe80::2\nprefix_length:64\n")
    probe = _probe(tool, npu_smi, clock)
    await probe.refresh(_targets(range(4)), interval=5.0)
    assert _ips(probe, range(4)) == ["10.10.0.10", "10.10.0.11", None, "2001:db8::3"]


@pytest.mark.parametrize("mode", ["hang", "garbage", "fail"])
async def test_a_bad_read_keeps_the_last_good_value_with_one_line_per_change(
    tool: FakeHccnTool, npu_smi: FakeNpuSmi, clock: ManualClock, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    probe = _probe(tool, npu_smi, clock, timeout=3.0)
    await probe.refresh(_targets(range(2)), interval=60.0)
    tool.set_mode(mode)
    caplog.set_level(logging.INFO, logger="ascend_agent.backends.training")
    for _ in range(3):
        clock.now += 61
        await probe.refresh(_targets(range(2)), interval=60.0)
    assert _ips(probe, range(2)) == ["10.10.0.10", "10.10.0.11"]
    warnings = [r.getMessage() for r in _probe_records(caplog) if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # one for both chips, not one per query
    assert "Cannot read the device IP of chips 0, 1" in warnings[0]
    tool.set_mode("ok")
    clock.now += 61
    await probe.refresh(_targets(range(2)), interval=60.0)
    assert [r.getMessage() for r in _probe_records(caplog) if "reads again" in r.getMessage()] == [
        "The device IP of chips 0, 1 reads again"
    ]


async def test_another_chips_answer_is_refused(
    tool: FakeHccnTool, npu_smi: FakeNpuSmi, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    probe = _probe(tool, npu_smi, clock)
    await probe.refresh(_targets(range(3)), interval=60.0)
    tool.set_output("-i 1 -ip -g", EIGHT[0])  # chip 1 prints chip 0's answer
    tool.clear("-i 2 -ip -g")
    tool.set_output("-i 2 -ip -g", EIGHT[0])
    caplog.set_level(logging.WARNING, logger="ascend_agent.backends.training")
    clock.now += 61
    await probe.refresh(_targets(range(3)), interval=60.0)
    assert _ips(probe, range(3)) == ["10.10.0.10", "10.10.0.11", "10.10.0.12"]
    assert [r.getMessage().count("which chip 0 has") for r in _probe_records(caplog)] == [1]
    assert "device IP of chips 1, 2" in _probe_records(caplog)[0].getMessage()


async def test_two_chips_with_one_address_at_start_get_none(
    tool: FakeHccnTool, npu_smi: FakeNpuSmi, clock: ManualClock
) -> None:
    tool.set_output("-i 1 -ip -g", EIGHT[0])
    probe = _probe(tool, npu_smi, clock)
    await probe.refresh(_targets(range(3)), interval=60.0)
    assert _ips(probe, range(3)) == [None, None, "10.10.0.12"]


async def test_a3_dies_get_vnic_and_super_pod(
    tool: FakeHccnTool, npu_smi: FakeNpuSmi, clock: ManualClock
) -> None:
    dies = [0, 1, 10, 11, 12]
    for die in dies:
        tool.set_output(f"-i {die} -ip -g", A3_IPS[die])
        tool.set_output(f"-i {die} -vnic -g", VNIC.format(100 + die))
        npu_smi.set_output(f"info -t spod-info -i {die // 2} -c {die % 2}", A3_SPOD[die])
    probe = _probe(tool, npu_smi, clock)
    await probe.refresh(_targets(dies, Generation.ASCEND910A3), interval=5.0)
    assert probe.facts(0) == ChipFacts(
        "10.0.245.11", "192.168.2.100", SuperPod(sdid=167772160, size=384, super_pod_id=0, server_index=40)
    )
    assert probe.facts(11).super_pod == SuperPod(169148427, 384, 0, 40)
    assert probe.facts(12).vnic_ip == "192.168.2.112"


async def test_no_hccn_tool_is_one_line_and_no_addresses(
    npu_smi: FakeNpuSmi, clock: ManualClock, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ascend_agent.backends.training")
    probe = _probe(short_dir / "no" / "hccn_tool", npu_smi, clock)
    await probe.refresh(_targets(range(8)), interval=5.0)
    assert _ips(probe, range(8)) == [None] * 8
    assert len(_probe_records(caplog)) == 1
    assert "install the driver's hccn_tool or pass --hccn-tool" in _probe_records(caplog)[0].getMessage()


async def test_a3_without_super_pod_support_is_none_quietly(
    tool: FakeHccnTool, npu_smi: FakeNpuSmi, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    npu_smi.set_error("info -t spod-info -i 0 -c 0", "This device does not support get spod info.\n")
    npu_smi.set_output("info -t spod-info -i 0 -c 1", "garbage\n")
    tool.set_output("-i 1 -vnic -g", VNIC.format(1))
    caplog.set_level(logging.WARNING, logger="ascend_agent.backends.training")
    probe = _probe(tool, npu_smi, clock)
    await probe.refresh(_targets(range(2), Generation.ASCEND910A3), interval=5.0)
    assert probe.facts(0) == ChipFacts("10.10.0.10", None, None)
    assert probe.facts(1) == ChipFacts("10.10.0.11", "192.168.2.1", None)
    assert [r.getMessage()[:35] for r in _probe_records(caplog)] == ["Cannot read the super pod of chip 1"]


async def test_310p_chips_run_nothing(tool: FakeHccnTool, npu_smi: FakeNpuSmi, clock: ManualClock) -> None:
    probe = _probe(tool, npu_smi, clock)
    await probe.refresh(_targets(range(4), Generation.ASCEND310P), interval=5.0)
    assert tool.calls() == 0
    assert probe.facts(0) == ChipFacts()
