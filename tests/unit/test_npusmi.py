"""npu-smi parsers over every fixture, hypothesis on mutated fixtures, and the runner with a fake npu-smi."""

from __future__ import annotations

import os
import re
import select
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ascend_agent.backends.npusmi import (
    ChipRow,
    InfoTable,
    NpuSmiError,
    NpuSmiParseError,
    Shape,
    a3_dies,
    board_model,
    parse_health,
    parse_info,
    parse_info_map,
    parse_key_values,
    physical_ids,
)
from ascend_agent.backends.tool import diagnose, query_info, run_npu_smi
from ascend_agent.model import A3_SOCS, Fault, chip_name
from tests.support import CONSTRUCTED, FIXTURES
from tests.support.npusmi_fake import FakeNpuSmi

DIAG = (FIXTURES / "910A-diag-collection-ok.txt").read_text()


def _info(name: str, folder: Path = FIXTURES) -> InfoTable:
    return parse_info((folder / name).read_text())


def _summary(table: InfoTable) -> list[tuple[int, int, int, str, str, str | None]]:
    ids = physical_ids(table.chips)
    return [(c.npu_id, c.chip, p, c.name, c.health, c.bus_id) for c, p in zip(table.chips, ids, strict=True)]


def test_910b4x8() -> None:
    table = _info("910B4x8-25.0.rc1.1-info.txt")
    assert table.version == "25.0.rc1.1"
    buses = ["C1", "C2", "81", "82", "01", "02", "41", "42"]
    assert _summary(table) == [(i, 0, i, "910B4", "OK", f"0000:{b}:00.0") for i, b in enumerate(buses)]
    assert table.chips[0].power_w == 87.2 and table.chips[0].temp_c == 33
    assert (table.chips[0].hbm_used_mb, table.chips[0].hbm_total_mb) == (2654, 32768)
    assert (table.chips[7].hbm_used_mb, table.chips[0].memory_total_mb) == (2653, 0)
    assert table.shape is Shape.STANDARD and a3_dies(table) == frozenset()


def test_910b1_elided_rows() -> None:
    table = _info("910B1-23.0.rc2-info-elided.txt")
    assert table.version == "23.0.rc2"
    assert _summary(table) == [
        (0, 0, 0, "910B1", "OK", "0000:C1:00.0"),
        (1, 0, 1, "910B1", "OK", "0000:01:00.0"),
        (7, 0, 7, "910B1", "OK", "0000:42:00.0"),
    ]
    assert table.chips[2].hbm_used_mb == 4174


def test_910a_redacted_with_warnings_and_processes() -> None:
    table = _info("910A-24.1.RC2-info-warning.txt")
    assert [c.name for c in table.chips] == ["xxx"] * 8
    assert [c.health for c in table.chips] == ["OK"] * 3 + ["Warning"] + ["OK"] * 3 + ["Warning"]
    assert table.chips[3].bus_id == "0000:01:00.0" and table.chips[3].power_w == 206.9
    assert physical_ids(table.chips) == tuple(range(8))


def test_310p3_single_device_column_and_na_power() -> None:
    table = _info("310P3-23.0.0-info.txt")
    assert _summary(table) == [(24, 0, 0, "310P3", "OK", "0000:04:00.0")]
    chip = table.chips[0]
    assert chip.device == 0 and chip.power_w is None and chip.temp_c == 29
    assert (chip.memory_used_mb, chip.memory_total_mb, chip.hbm_total_mb) == (1832, 21527, None)


def test_info_map() -> None:
    rows = parse_info_map((FIXTURES / "910B4x8-25.0.rc1.1-info-m.txt").read_text())
    assert len(rows) == 16
    chips = [r for r in rows if r.logic_id is not None]
    assert [(r.npu_id, r.chip_id, r.logic_id, r.name) for r in chips] == [
        (i, 0, i, "Ascend 910B4") for i in range(8)
    ]
    assert {r.name for r in rows if r.logic_id is None} == {"Mcu"}


def test_diag_collection_blocks() -> None:
    block = DIAG.split("/usr/local/bin/npu-smi info -m\n", 1)[1].split("\n\n", 1)[0]
    rows = parse_info_map(block)
    assert [(r.npu_id, r.logic_id, r.name) for r in rows] == [(i, i, "Ascend 910A") for i in range(8)]
    board = DIAG.split("/usr/local/bin/npu-smi info -i 0 -c 0 -t board\n", 1)[1].split("\n\n", 1)[0]
    values = parse_key_values(board)
    assert values["Chip Name"] == "910A" and values["PCIe Bus Info"] == "0000:61:00.0"
    health = DIAG.split("/usr/local/bin/npu-smi info -i 0 -c 0 -t health\n", 1)[1]
    detail = parse_health(health)
    assert (detail.status, detail.faults) == ("OK", ())
    assert board_model(values) is None, "a 910A board names no A3 SoC"


def test_key_values_fixtures() -> None:
    usages = parse_key_values((FIXTURES / "910B1-23.0.rc2-info-t-usages-i-0.txt").read_text())
    assert usages["HBM Capacity(MB)"] == "65536" and usages["NPU ID"] == "0"
    common = parse_key_values((FIXTURES / "910B1-23.0.rc2-info-t-common-i-1.txt").read_text())
    assert common["Aicore Count"] == "24"
    assert common["Temperature(C)"] == "46", "the first occurrence wins over the MCU's"


def test_health_with_an_error() -> None:
    text = "\tHealth Status                  : Critical\n\tError Code                     : 80E18005\n" \
           "\tError Information              : ascend_monitor adda heart beat lost error\n"  # fmt: skip
    detail = parse_health(text)
    assert detail == type(detail)(
        "Critical", (Fault("80E18005", "ascend_monitor adda heart beat lost error"),)
    )


def test_health_with_two_codes() -> None:
    detail = parse_health((CONSTRUCTED / "910B3-26.0.0-info-t-health-i-2-c-0-two-codes.txt").read_text())
    assert detail.status == "Critical"
    assert detail.faults == (
        Fault("80E18005", "ascend_monitor adda heart beat lost error"),
        Fault("80CB8009", "hbm multi-bit ecc error"),
    )


def test_a3_sample_sixteen_dies_on_eight_npu_ids() -> None:
    table = _info("Ascend910-A3x16-24.1.rc3.7-info.txt")
    assert table.version == "24.1.rc3.7" and table.shape is Shape.PHY_ID
    assert [(c.npu_id, c.chip, c.device) for c in table.chips] == [(i // 2, i % 2, i) for i in range(16)]
    assert physical_ids(table.chips) == tuple(range(16))
    assert {c.name for c in table.chips} == {"Ascend910"}
    assert a3_dies(table) == frozenset(range(16))
    assert [c.power_w for c in table.chips[:2]] == [181.4, None], "the second die's Power is '-'"
    assert (table.chips[15].bus_id, table.chips[15].hbm_used_mb, table.chips[15].hbm_total_mb) == (
        "0000:83:00.0", 3199, 65536,
    )  # fmt: skip


def test_a3_named_910c1_and_the_board_soc() -> None:
    table = _info("910C1-A3x4-24.1.rc3.7-info.txt", CONSTRUCTED)
    assert a3_dies(table) == frozenset(range(4))
    board = parse_key_values((CONSTRUCTED / "Ascend910-A3-24.1.rc3.7-info-t-board-i-0-c-0.txt").read_text())
    assert board_model(board) == "910_9392"
    assert board_model({"NPU Name": "9999", "Chip Name": "Ascend910"}) is None
    assert board_model({"NPU Name": "9392", "Chip Name": "910B3"}) is None


def test_every_a3_soc_a_model_may_name_is_one_the_board_names() -> None:
    """One list of A3 SoCs: a 9362 board was a plain 910_93 while model: 910_9362 was accepted."""
    for soc in A3_SOCS:
        assert board_model({"NPU Name": soc, "Chip Name": "Ascend910"}) == chip_name(f"910_{soc}")


def test_a_phy_id_header_with_910b3_names_is_not_a3() -> None:
    text = (FIXTURES / "Ascend910-A3x16-24.1.rc3.7-info.txt").read_text().replace("Ascend910 ", "910B3     ")
    table = parse_info(text)
    assert len(table.chips) == 16 and table.shape is Shape.PHY_ID
    assert a3_dies(table) == frozenset()


def test_a3_health_with_the_alarm_code() -> None:
    text = (CONSTRUCTED / "Ascend910-A3-24.1.rc3.7-info-t-health-i-1-c-1-alarm.txt").read_text()
    assert parse_health(text) == type(parse_health(text))(
        "Alarm", (Fault("80E3A203", "node type=CPU, sensor type=Heartbeat, event state=heartbeat lost"),)
    )


def test_950_excerpt_without_closing_border() -> None:
    table = _info("Ascend950PRx1-25.7.rc1.6-info-excerpt.txt")
    assert table.shape is Shape.NPU_ID and table.version == "25.7.rc1.6"
    chip = table.chips[0]
    assert (chip.npu_id, chip.chip, chip.device, chip.name, chip.health, chip.bus_id) == (
        0, 0, None, "Ascend950PR", "OK", "0000:61:00.0",
    )  # fmt: skip
    assert (chip.power_w, chip.temp_c, chip.utilization_pct) == (195.6, 56, 0)
    assert (chip.hbm_used_mb, chip.hbm_total_mb) == (5239, 131072)
    assert physical_ids(table.chips) == (0,)


def test_950_eight_chips_and_info_m_with_phy_ids() -> None:
    table = _info("Ascend950PRx8-25.7.rc1.6-info.txt", CONSTRUCTED)
    assert [c.npu_id for c in table.chips] == list(range(8))
    rows = parse_info_map((CONSTRUCTED / "Ascend950PRx8-25.7.rc1.6-info-m.txt").read_text())
    assert [(r.npu_id, r.chip_id, r.logic_id, r.phys_id, r.name) for r in rows][:2] == [
        (0, 0, 0, 0, "Ascend950PR"), (1, 0, 1, 1, "Ascend950PR"),
    ]  # fmt: skip
    shifted = [replace(row, phys_id=row.npu_id + 8) for row in rows]
    assert physical_ids(table.chips, shifted) == tuple(range(8, 16)), "-m's Chip Phy-ID wins over the NPU id"


def test_950dt_health() -> None:
    table = _info("Ascend950DTx2-25.7.rc1.6-info.txt", CONSTRUCTED)
    assert [(c.name, c.health) for c in table.chips] == [("Ascend950DT", "OK"), ("Ascend950DT", "Critical")]


def test_26x_table_with_process_id_in_container() -> None:
    table = _info("910B3x8-26.1.0-info-with-process.txt")
    assert table.version == "26.1.0" and len(table.chips) == 8
    assert [c.bus_id for c in table.chips][:2] == ["0000:C1:00.0", "0000:C2:00.0"]
    assert table.chips[0].hbm_used_mb == 8676


def test_26x_inside_a_container_after_log_lines() -> None:
    table = _info("910B3x2-26.1.0-info-in-container.txt", CONSTRUCTED)
    assert [(c.npu_id, c.name, c.health) for c in table.chips] == [
        (32768, "910B3", "OK"),
        (96, "910B3", "OK"),
    ]
    assert (table.chips[1].power_w, table.chips[1].temp_c, table.chips[1].hbm_used_mb) == (None, None, 3403)
    assert table.version == "26.1.0"


@pytest.mark.parametrize(
    ("name", "reason", "words"),
    [
        ("error-unknownchip-unknownver-info-dcmi-8005-container.txt", "driver", "mount the host's driver"),
        ("error-info-dcmi-8020-busy.txt", "busy", "wait"),
        ("error-info-permission-denied.txt", "permission", "run the agent as root"),
    ],
)
def test_error_outputs_are_diagnosed(name: str, reason: str, words: str) -> None:
    folder = FIXTURES if (FIXTURES / name).exists() else CONSTRUCTED
    error = diagnose((folder / name).read_text())
    assert error is not None
    assert error.reason == reason and words in error.next_step
    assert "\n" not in str(error)
    assert diagnose((FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()) is None


def test_constructed_310_four_chips_per_npu() -> None:
    table = _info("310x4-21.0.2-info.txt", CONSTRUCTED)
    assert [(c.npu_id, c.chip) for c in table.chips] == [(n, c) for n in (0, 1) for c in range(4)]
    assert physical_ids(table.chips) == tuple(range(8))
    assert {c.name for c in table.chips} == {"310"}
    assert table.chips[5].bus_id == "0000:0C:00.0" and table.chips[5].power_w == 12.1


def test_constructed_310_without_hugepages() -> None:
    table = _info("310-nohugepages-22.0.0-info.txt", CONSTRUCTED)
    assert physical_ids(table.chips) == (0, 1, 2, 3)
    assert [c.health for c in table.chips] == ["OK", "Warning", "OK", "Alarm"]
    assert table.chips[1].memory_used_mb == 2617


def test_constructed_310p3_duo() -> None:
    table = _info("310P3-duo-23.0.0-info.txt", CONSTRUCTED)
    assert _summary(table) == [
        (1, 0, 0, "310P3", "OK", "0000:01:00.0"),
        (1, 1, 1, "310P3", "OK", "0000:01:00.0"),
        (3, 0, 2, "310P3", "OK", "0000:81:00.0"),
        (3, 1, 3, "310P3", "Critical", "0000:81:00.0"),
    ]


def test_constructed_health_and_na_cells() -> None:
    table = _info("910B3-health-26.0.0-info.txt", CONSTRUCTED)
    assert [c.health for c in table.chips] == ["OK", "Alarm", "Critical", "UNKNOWN"]
    sick = table.chips[2]
    assert (sick.bus_id, sick.power_w, sick.temp_c, sick.hbm_used_mb, sick.utilization_pct) == (None,) * 5
    assert table.chips[3].bus_id == "0000:82:00.0"


@pytest.mark.parametrize("text", ["", "hello", "+----+\n|  |\n+====+\n", "| NPU Name | Health |\n"])
def test_not_a_table_raises_the_typed_error(text: str) -> None:
    for parse in (parse_info, parse_info_map, parse_key_values, parse_health):
        with pytest.raises(NpuSmiParseError):
            parse(text)


# hypothesis: mutated fixtures never raise anything but NpuSmiParseError ------------------------------------

_SAMPLES = [p.read_text() for folder in (FIXTURES, CONSTRUCTED) for p in sorted(folder.glob("*.txt"))]
_PARSERS = (parse_info, parse_info_map, parse_key_values, parse_health)


@st.composite
def _mutated(draw: st.DrawFn) -> str:
    lines = draw(st.sampled_from(_SAMPLES)).splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 6))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["delete", "duplicate", "swap", "truncate", "insert", "cell"]))
        if action == "delete":
            del lines[i]
        elif action == "duplicate":
            lines.insert(i, lines[i])
        elif action == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif action == "truncate":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif action == "insert":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(st.text(max_size=8)) + lines[i][at:]
        else:
            cells = lines[i].split("|")
            k = draw(st.integers(0, len(cells) - 1))
            cells[k] = draw(
                st.sampled_from([" NA ", "", " - ", " x/y ", " 99999999999999999999 ", " 1 2 3 "])
            )
            lines[i] = "|".join(cells)
    return "".join(lines)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_mutated() | st.text(max_size=300))
def test_parsers_raise_only_their_own_error(text: str) -> None:
    for parse in _PARSERS:
        try:
            result = parse(text)
        except NpuSmiParseError:
            continue
        assert result is not None
    try:
        table = parse_info(text)
    except NpuSmiParseError:
        return
    assert all(isinstance(chip, ChipRow) for chip in table.chips)
    assert len(physical_ids(table.chips)) == len(table.chips)


# hypothesis: a valid table re-spaced, its columns padded differently, parses the same --------------------


def _parses(text: str) -> bool:
    try:
        parse_info(text)
    except NpuSmiParseError:
        return False
    return True


_VALID_TABLES = [
    text
    for folder in (FIXTURES, CONSTRUCTED)
    for p in sorted(folder.glob("*.txt"))
    if _parses(text := p.read_text())
]


@st.composite
def _respaced(draw: st.DrawFn) -> tuple[str, str]:
    """A valid table and the same table with every cell's words re-spaced and every column padded anew."""
    text = draw(st.sampled_from(_VALID_TABLES))
    gaps = st.text(alphabet=" ", min_size=1, max_size=4)
    lines = []
    for line in text.splitlines():
        if not line.lstrip().startswith("|"):
            lines.append(line + draw(st.text(alphabet=" ", max_size=3)))
            continue
        cells = line.strip().strip("|").split("|")
        new_cells = []
        for cell in cells:
            words = re.split(r"(\s*/\s*|\s+)", cell.strip())
            rebuilt = "".join(
                (" / " if "/" in part else draw(gaps)) if i % 2 else part for i, part in enumerate(words)
            )
            new_cells.append(draw(gaps) + rebuilt + draw(st.text(alphabet=" ", max_size=6)))
        closing = "|" if draw(st.booleans()) or line.rstrip().endswith("|") else ""
        lines.append(draw(st.text(alphabet=" ", max_size=2)) + "|" + "|".join(new_cells) + closing)
    return text, "\n".join(lines) + "\n"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=_respaced())
def test_respaced_tables_parse_the_same(pair: tuple[str, str]) -> None:
    original, respaced = pair
    assert parse_info(respaced) == parse_info(original)


# running it ------------------------------------------------------------------------------------------------


@pytest.fixture
def fake(short_dir: Path) -> FakeNpuSmi:
    npu_smi = FakeNpuSmi(short_dir)
    npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
    return npu_smi


async def test_query_info_ok(fake: FakeNpuSmi) -> None:
    table = await query_info(str(fake.path), timeout=5)
    assert len(table.chips) == 8
    assert fake.calls() == 1


async def test_a_dcmi_failure_names_the_cause_and_the_next_step(fake: FakeNpuSmi) -> None:
    fake.set_mode("fail")
    with pytest.raises(NpuSmiError) as caught:
        await run_npu_smi(str(fake.path), ["info"], timeout=5)
    assert caught.value.reason == "driver"
    assert "dcmi module initialize failed, ret -8005" in caught.value.cause
    assert "mount the host's driver" in caught.value.next_step


async def test_exit_status_is_reported(fake: FakeNpuSmi) -> None:
    with pytest.raises(NpuSmiError) as caught:
        await run_npu_smi(str(fake.path), ["info", "-t", "topo"], timeout=5)
    assert caught.value.reason == "exit"
    assert "exited with status 2: Usage: npu-smi info" in str(caught.value)


async def test_an_error_printed_with_status_0_is_diagnosed(fake: FakeNpuSmi) -> None:
    fake.set_output("info", (CONSTRUCTED / "error-info-dcmi-8020-busy.txt").read_text())
    with pytest.raises(NpuSmiError) as caught:
        await query_info(str(fake.path), timeout=5)
    assert caught.value.reason == "busy"


async def test_missing_executable(short_dir: Path) -> None:
    with pytest.raises(NpuSmiError) as caught:
        await run_npu_smi(str(short_dir / "nope"), ["info"], timeout=5)
    assert caught.value.reason == "missing"
    assert "nope" in str(caught.value)


async def test_garbage_is_an_output_error(fake: FakeNpuSmi) -> None:
    fake.set_mode("garbage")
    with pytest.raises(NpuSmiError) as caught:
        await query_info(str(fake.path), timeout=5)
    assert caught.value.reason == "output"


async def test_a_hang_is_killed_and_reaped(fake: FakeNpuSmi) -> None:
    fake.set_mode("hang")
    before = set(os.listdir("/proc"))
    with pytest.raises(NpuSmiError) as caught:
        await run_npu_smi(str(fake.path), ["info"], timeout=0.3)
    assert caught.value.reason == "timeout"
    assert "killed" in str(caught.value)
    children = [pid for pid in set(os.listdir("/proc")) - before if pid.isdigit()]
    for pid in children:
        status = Path(f"/proc/{pid}/status")
        if status.exists() and f"PPid:\t{os.getpid()}\n" in status.read_text():
            pytest.fail(f"child {pid} of the runner is still there (a zombie or alive)")


async def test_an_endless_output_is_cut_short_and_counts_as_a_failed_query(fake: FakeNpuSmi) -> None:
    """``head -c 8G /dev/zero`` as npu-smi: read without a cap until the timeout, then a wait that never
    returned."""
    fake.set_mode("flood")
    with anyio.fail_after(20), pytest.raises(NpuSmiError) as caught:
        await run_npu_smi(str(fake.path), ["info"], timeout=15)
    assert caught.value.reason == "output"
    assert "printed more than 4 MiB" in caught.value.cause


def _exits_within(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` has exited, or does within ``timeout`` s (its pidfd becomes readable)."""
    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([descriptor], [], [], timeout)
        return bool(readable)
    finally:
        os.close(descriptor)


async def test_a_wrapper_whose_child_hangs_is_killed_with_its_child(fake: FakeNpuSmi) -> None:
    """The child of a killed wrapper held the pipes: the wait for them never returned."""
    fake.set_mode("orphan")
    with anyio.fail_after(5), pytest.raises(NpuSmiError) as caught:
        await run_npu_smi(str(fake.path), ["info"], timeout=1)
    assert caught.value.reason == "timeout"
    child = int((fake.directory / "orphan.pid").read_text())
    # SIGKILL went to the whole group; the child's exit completes a moment after its pipes closed.
    assert _exits_within(child, 5), "the wrapper's child outlived the query"


async def test_an_executable_being_written_is_not_called_a_lack_of_descriptors(fake: FakeNpuSmi) -> None:
    with open(fake.path, "ab"), pytest.raises(NpuSmiError) as caught:
        await run_npu_smi(str(fake.path), ["info"], timeout=5)
    assert caught.value.reason == "missing"
    assert "Text file busy" in caught.value.cause
