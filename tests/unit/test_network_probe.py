"""Each chip's RoCE network through a fake hccn_tool printing the shared outputs: a link DOWN past the
debounce makes the chip network-unhealthy, UP clears it; a hung, failing or garbage-printing tool, one that is
missing, or an answer meant for another chip changes nothing and is one log line per change. The clock is the
test's: the 20 s debounce passes without waiting."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from ascend_agent.backends.devfs import DevfsBackend
from ascend_agent.backends.network import CONCURRENT_CALLS, Change, LinkOutage, NetworkProbe, NetworkTarget
from ascend_agent.config import Settings
from tests.support import FIXTURES
from tests.support.clock import ManualClock
from tests.support.hccn_fake import FakeHccnTool
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.training_fixtures import per_chip, per_command, read

DOC = per_command("hccn_tool-multi_doc-example_collecting-logs.txt")
LINK_STAT = per_chip("hccn_tool-link_stat-g_fixture.txt")
FAULT, SUCCESS = (
    f"{line}\n"
    for line in read("hccn_tool-net_health-g_doc-fault-and-success.txt").splitlines()
    if line.startswith("net health status")
)
DOWN = "link status: DOWN\n"
INTERVAL = 5.0


@pytest.fixture
def tool(short_dir: Path) -> FakeHccnTool:
    fake = FakeHccnTool(short_dir / "hccn")
    for chip in range(16):
        fake.set_output(f"-i {chip} -link -g", DOC["-i 0 -link -g"])
        fake.set_output(f"-i {chip} -net_health -g", DOC["-i 0 -net_health -g"])
    return fake


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _probe(
    tool: FakeHccnTool | Path, clock: ManualClock, debounce: float = 20.0, timeout: float = 30.0
) -> NetworkProbe:
    """A probe of ``tool``: a round as long as :data:`INTERVAL` (or ``timeout``, short only where a test
    waits out hangs)."""
    path = tool.path if isinstance(tool, FakeHccnTool) else tool
    settings = Settings(hccn_tool=str(path), npu_smi_timeout=timeout, link_down_debounce=debounce)
    return NetworkProbe(settings, clock=clock)


def _targets(ids: range | list[int]) -> list[NetworkTarget]:
    return [NetworkTarget(i, f"Ascend910-{i}") for i in ids]


def _faults(probe: NetworkProbe, ids: range | list[int]) -> list[int]:
    return [i for i in ids if probe.fault(i)]


def _lines(caplog: pytest.LogCaptureFixture, level: int | None = None) -> list[str]:
    """The probe's own lines: asyncio's child watcher may warn of a killed tool's pid under load."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ascend_agent.backends.network" and (level is None or r.levelno == level)
    ]


def _metric(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


@given(
    st.floats(0, 60),
    st.lists(st.tuples(st.booleans(), st.floats(0, 30, allow_nan=False)), max_size=40),
)
def test_network_unhealthy_exactly_when_the_reads_since_the_last_up_span_the_debounce(
    debounce: float, reads: list[tuple[bool, float]]
) -> None:
    outage, now, down_from = LinkOutage(debounce), 0.0, None
    was = False
    for up, gap in reads:
        now += gap
        change = outage.read(up, now)
        down_from = None if up else (now if down_from is None else down_from)
        expected = down_from is not None and now - down_from >= debounce
        assert outage.unhealthy is expected
        assert (change is Change.UNHEALTHY) is (expected and not was)
        assert (change is Change.RECOVERED) is (was and up)
        was = expected


async def test_a_link_down_past_the_debounce_is_network_unhealthy_and_up_clears_it(
    tool: FakeHccnTool, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ascend_agent.backends.network")
    probe = _probe(tool, clock)
    await probe.refresh(_targets(range(8)), INTERVAL)
    assert _faults(probe, range(8)) == []
    assert tool.calls() == 16  # -link -g and -net_health -g of each chip
    assert _metric("ascend_agent_chip_link_up", device="Ascend910-3") == 1
    assert _metric("ascend_agent_chip_net_health_info", device="Ascend910-3", status="Init") == 1

    tool.set_output("-i 3 -link -g", DOWN)
    tool.set_output("-i 3 -net_health -g", FAULT)  # what Huawei's doc shows after a link is set down
    for _ in range(4):  # 0, 5, 10, 15 s: within the debounce
        await probe.refresh(_targets(range(8)), INTERVAL)
        clock.now += INTERVAL
    assert _faults(probe, range(8)) == []
    assert _metric("ascend_agent_chip_link_up", device="Ascend910-3") == 0
    assert _metric("ascend_agent_chip_network_unhealthy", device="Ascend910-3") == 0
    await probe.refresh(_targets(range(8)), INTERVAL)  # 20 s
    assert _faults(probe, range(8)) == [3]
    assert probe.fault(3) == "RoCE link DOWN for 20 s or more (hccn_tool -link -g)"
    assert _metric("ascend_agent_chip_network_unhealthy", device="Ascend910-3") == 1
    assert _metric("ascend_agent_chip_net_health_info", device="Ascend910-3", status="Fault") == 1
    assert _metric("ascend_agent_chip_net_health_info", device="Ascend910-3", status="Init") is None
    clock.now += INTERVAL
    await probe.refresh(_targets(range(8)), INTERVAL)
    assert _faults(probe, range(8)) == [3]

    tool.set_output("-i 3 -link -g", DOC["-i 0 -link -g"])
    tool.set_output("-i 3 -net_health -g", SUCCESS)
    await probe.refresh(_targets(range(8)), INTERVAL)
    assert _faults(probe, range(8)) == []
    assert _metric("ascend_agent_chip_network_unhealthy", device="Ascend910-3") == 0
    assert _lines(caplog) == [
        "RoCE link of chip 3 DOWN; network-unhealthy if it stays DOWN for 20 s",
        "Net health (hccn_tool -net_health -g): chip 3 Fault (was Init)",
        "Chip 3 network-unhealthy: RoCE link DOWN for 20 s or more; listed as NetworkUnhealthy (Volcano "
        "leaves them out of distributed jobs; single-chip pods may still use them)",
        "Chip 3 network-healthy again: RoCE link UP",
        "Net health (hccn_tool -net_health -g): chip 3 Success (was Fault)",
    ]


async def test_a_link_up_again_within_the_debounce_is_never_network_unhealthy(
    tool: FakeHccnTool, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ascend_agent.backends.network")
    probe = _probe(tool, clock)
    await probe.refresh(_targets(range(2)), INTERVAL)
    for state in (DOWN, DOC["-i 0 -link -g"]) * 3:  # flapping every 5 s: each outage shorter than 20 s
        tool.set_output("-i 1 -link -g", state)
        clock.now += INTERVAL
        await probe.refresh(_targets(range(2)), INTERVAL)
        assert _faults(probe, range(2)) == []
    assert _lines(caplog)[:2] == [
        "RoCE link of chip 1 DOWN; network-unhealthy if it stays DOWN for 20 s",
        "RoCE link of chip 1 UP again within 20 s",
    ]


async def test_debounce_zero_is_at_once(tool: FakeHccnTool, clock: ManualClock) -> None:
    tool.set_output("-i 0 -link -g", DOWN)
    probe = _probe(tool, clock, debounce=0)
    await probe.refresh(_targets(range(2)), INTERVAL)
    assert probe.fault(0) == "RoCE link DOWN for 0 s or more (hccn_tool -link -g)"
    assert probe.fault(1) == ""


@pytest.mark.parametrize("mode", ["hang", "garbage", "fail"])
async def test_a_bad_tool_changes_nothing_with_one_line_per_change(
    tool: FakeHccnTool, clock: ManualClock, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    tool.set_output("-i 1 -link -g", DOWN)
    probe = _probe(tool, clock, debounce=0, timeout=3.0)
    await probe.refresh(_targets(range(3)), INTERVAL)
    assert _faults(probe, range(3)) == [1]
    view = probe.view()
    tool.set_mode(mode)
    caplog.set_level(logging.INFO, logger="ascend_agent.backends.network")
    caplog.clear()
    for _ in range(3):
        clock.now += INTERVAL
        await probe.refresh(_targets(range(3)), INTERVAL)
    # Neither the network-unhealthy chip recovers nor do the others fail: nothing was read.
    assert probe.view() == view
    warnings = _lines(caplog, logging.WARNING)
    assert len(warnings) == 2, warnings  # one per command for all three chips, not one per query
    assert warnings[0].startswith("Cannot read the link state of chips 0, 1, 2 (chip 0: ")
    assert warnings[1].startswith("Cannot read the net health of chips 0, 1, 2 (chip 0: ")
    assert "Traceback" not in caplog.text
    tool.set_mode("ok")
    tool.set_output("-i 1 -link -g", DOC["-i 0 -link -g"])
    await probe.refresh(_targets(range(3)), INTERVAL)
    assert _faults(probe, range(3)) == []
    assert "The link state of chips 0, 1, 2 reads again" in _lines(caplog, logging.INFO)


async def test_another_chips_answer_is_refused_naming_it(
    tool: FakeHccnTool, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    tool.set_output("-i 2 -link -g", DOWN)
    probe = _probe(tool, clock, debounce=0)
    await probe.refresh(_targets(range(3)), INTERVAL)
    assert _faults(probe, range(3)) == [2]
    # Chip 2 prints chip 0's -link_stat answer (whose records end LINK UP): refused, chip 2 stays down.
    tool.set_output("-i 2 -link -g", LINK_STAT[0])
    caplog.set_level(logging.INFO, logger="ascend_agent.backends.network")
    caplog.clear()
    for _ in range(2):
        clock.now += INTERVAL
        await probe.refresh(_targets(range(3)), INTERVAL)
    assert _faults(probe, range(3)) == [2]
    assert _lines(caplog) == [
        "Cannot read the link state of chip 2 (chip 2: hccn_tool -i 2 -link -g printed something unexpected: "
        "-link -g: the answer names chip 0: an answer meant for another chip); keeping the last one read"
    ]


async def test_no_hccn_tool_is_one_line_for_the_node(
    clock: ManualClock, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ascend_agent.backends.network")
    probe = _probe(short_dir / "no" / "hccn_tool", clock, debounce=0)
    for _ in range(3):
        await probe.refresh(_targets(range(8)), INTERVAL)
    assert _faults(probe, range(8)) == []
    lines = _lines(caplog)
    assert len(lines) == 1, lines
    assert "the chips' network health is unknown" in lines[0]
    assert "install the driver's hccn_tool or pass --hccn-tool" in lines[0]


async def test_calls_are_bounded_and_the_round_by_its_deadline(
    tool: FakeHccnTool, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    tool.set_mode("hang")
    caplog.set_level(logging.WARNING, logger="ascend_agent.backends.network")
    probe = _probe(tool, clock, timeout=1.0)
    await probe.refresh(_targets(range(16)), INTERVAL)
    # 32 calls due, at most CONCURRENT_CALLS started; the rest never ran within the 1 s round.
    assert tool.calls() <= CONCURRENT_CALLS
    assert "(chip 0: no answer within 1 s)" in caplog.text
    assert all(link is None for _, link, _, _ in probe.view())


async def test_chips_no_longer_read_are_forgotten_with_their_series(
    tool: FakeHccnTool, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    tool.set_output("-i 5 -link -g", DOWN)
    probe = _probe(tool, clock, debounce=0)
    await probe.refresh(_targets([4, 5]), INTERVAL)
    assert probe.fault(5)
    caplog.set_level(logging.INFO, logger="ascend_agent.backends.network")
    caplog.clear()
    await probe.refresh(_targets([4]), INTERVAL)  # chip 5 lost its address, or turned Unhealthy
    assert probe.fault(5) == ""
    assert [p for p, *_ in probe.view()] == [4]
    assert _metric("ascend_agent_chip_network_unhealthy", device="Ascend910-5") is None
    assert _metric("ascend_agent_chip_link_up", device="Ascend910-5") is None
    assert _lines(caplog) == [
        "Chip 5 no longer network-unhealthy: a chip's network is not read while it has no device IP or is "
        "not healthy"
    ]


@pytest.mark.parametrize("network_health", [True, False])
async def test_the_devfs_backend_reads_the_network_of_chips_with_an_address_unless_off(
    tool: FakeHccnTool, short_dir: Path, network_health: bool
) -> None:
    host = HostTree(short_dir / "host").add_driver().add_management().add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
    for chip, text in per_chip("hccn_tool-ip-g_fixture-8dev.txt").items():
        if chip != 5:  # chip 5 has no address: its network is never read
            tool.set_output(f"-i {chip} -ip -g", text)
    tool.set_output("-i 3 -link -g", DOWN)
    settings = Settings(
        backend="devfs", host_root=host.root, npu_smi=str(npu_smi.path), hccn_tool=str(tool.path),
        link_down_debounce=0, network_health=network_health,
    )  # fmt: skip
    backend = DevfsBackend(settings)
    await backend.query()
    chips = (await backend.discover()).chips
    read = sorted(p for p in range(8) if tool.count(f"-i {p} -link -g"))
    assert read == ([0, 1, 2, 3, 4, 6, 7] if network_health else [])
    assert [c.phys_id for c in chips if c.network_fault] == ([3] if network_health else [])
    assert all(c.healthy for c in chips)


async def test_a_reloads_new_backend_goes_on_from_each_links_outage(
    tool: FakeHccnTool, short_dir: Path
) -> None:
    """A reload that starts a new backend keeps each link's outage: a chip network-unhealthy stays so, and a
    link DOWN for part of the debounce counts the rest against the new debounce."""
    host = HostTree(short_dir / "host").add_driver().add_management().add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
    for chip, text in per_chip("hccn_tool-ip-g_fixture-8dev.txt").items():
        tool.set_output(f"-i {chip} -ip -g", text)
    tool.set_output("-i 3 -link -g", DOWN)
    tool.set_output("-i 4 -link -g", DOWN)
    settings = Settings(
        backend="devfs", host_root=host.root, npu_smi=str(npu_smi.path), hccn_tool=str(tool.path),
        link_down_debounce=0,
    )  # fmt: skip
    old = DevfsBackend(settings)
    await old.query()
    assert [c.phys_id for c in (await old.discover()).chips if c.network_fault] == [3, 4]

    new = DevfsBackend(replace(settings, link_down_debounce=3600, npu_smi_timeout=3))
    new.take_over(old)
    await old.close()
    tool.set_output("-i 4 -link -g", DOC["-i 0 -link -g"])
    await new.query()
    faults = {c.phys_id: c.network_fault for c in (await new.discover()).chips if c.network_fault}
    assert faults == {3: "RoCE link DOWN for 3600 s or more (hccn_tool -link -g)"}, "3 stays, 4 is up again"
    await new.close()
