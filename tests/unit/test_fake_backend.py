"""The fake backend's state file on real files: missing, not UTF-8, naming chips that do not exist; its
dynamic 310P chips, against npu-smi's samples."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ascend_agent.backends import VnpuCarver
from ascend_agent.backends.dcmi_pairs import parse_pairs
from ascend_agent.backends.fake import FakeBackend
from ascend_agent.backends.npusmi_vnpu import parse_info_vnpu, parse_template_info
from ascend_agent.backends.vnpu_keeper import VnpuLayoutKeeper
from ascend_agent.config import ConfigError, Settings
from ascend_agent.model import Carvable, CarveFailed, Health, Inventory
from ascend_agent.vnpu_layout import parse_layout
from tests.support.vnpu_node import TEMPLATE_INFO, VNPU_SAMPLES

GBK = "# 故障\n".encode("gbk")


def _backend(state: Path) -> FakeBackend:
    return FakeBackend(Settings(backend="fake", fake_state=state))


def _unhealthy(inventory: Inventory) -> list[int]:
    return [chip.phys_id for chip in inventory.chips if chip.health is Health.UNHEALTHY]


async def test_a_missing_state_file_is_refused_at_start(short_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"fake state file .*/nope.json does not exist"):
        await _backend(short_dir / "nope.json").start()


async def test_a_state_file_removed_later_keeps_the_state(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = short_dir / "state.json"
    state.write_text('{"unhealthy": [3]}')
    backend = _backend(state)
    await backend.start()
    state.unlink()
    with caplog.at_level(logging.WARNING):
        assert _unhealthy(await backend.discover()) == [3]
        assert _unhealthy(await backend.discover()) == [3]
    (record,) = caplog.records
    assert record.getMessage().endswith("does not exist (an empty one is {}); keeping the previous state")
    assert record.path == str(state)  # type: ignore[attr-defined]


async def test_a_state_file_that_is_not_utf8(short_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = short_dir / "state.json"
    state.write_bytes(GBK + b"{}")
    with pytest.raises(ConfigError) as caught:
        await _backend(state).start()
    assert str(caught.value) == (
        f"fake state file {state} is not UTF-8: byte 0xb9 at offset 2 (line 1); save it as UTF-8"
    )
    state.write_text('{"absent": [5]}')
    backend = _backend(state)
    await backend.start()
    state.write_bytes(GBK + b'{"absent": []}')
    with caplog.at_level(logging.WARNING):
        assert _unhealthy(await backend.discover()) == [5]
    assert [r.getMessage() for r in caplog.records] == [
        f"fake state file {state} is not UTF-8: byte 0xb9 at offset 2 (line 1); save it as UTF-8; "
        "keeping the previous state"
    ]


async def test_ids_beyond_the_chips_are_named_once(short_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = short_dir / "state.json"
    state.write_text(json.dumps({"unhealthy": [2, 12], "absent": [99]}))
    backend = _backend(state)
    with caplog.at_level(logging.WARNING):
        await backend.start()
        inventory = await backend.discover()
        await backend.discover()
    assert _unhealthy(inventory) == [2]
    (record,) = caplog.records
    assert record.getMessage() == (
        f"fake state file {state} names chips that do not exist: 12, 99 (8 chips, ids 0-7); ignored"
    )
    assert record.ids == [12, 99]  # type: ignore[attr-defined]
    caplog.clear()
    state.write_text(json.dumps({"absent": [8]}))
    with caplog.at_level(logging.WARNING):
        await backend.discover()
    assert ["names chips that do not exist: 8 " in r.getMessage() for r in caplog.records] == [True]


async def test_a_dynamic_310p_offers_what_npu_smi_gives_and_carves_as_it_does() -> None:
    """With ``vnpu: {dynamic: true}`` a fake 310P3 is carvable with the templates and totals devfs reads from
    npu-smi (the shared samples), and its vNPUs are made and destroyed as npu-smi makes them."""
    layout = parse_layout({"1": {"dynamic": True}})
    backend = FakeBackend(Settings(backend="fake", fake_model="310P3", fake_chips=2, vnpu=layout))
    await backend.start()
    (carvable,) = (await backend.discover()).carvable
    sample = parse_info_vnpu((VNPU_SAMPLES / "310P3-info-vnpu-i2-c0-none.txt").read_text())
    totals = tuple((label, total) for label, (_, total) in sample.resources.items() if total is not None)
    assert carvable == Carvable(1, parse_template_info(TEMPLATE_INFO), totals)
    assert isinstance(backend, VnpuCarver)

    await backend.create_vnpu(1, "vir04", 116)
    await backend.create_vnpu(1, "vir02", 117)
    with pytest.raises(CarveFailed, match="Not enough resources"):
        await backend.create_vnpu(1, "vir04", 118)  # 4 + 2 + 4 AI cores of 8
    with pytest.raises(CarveFailed, match="exists already"):
        await backend.create_vnpu(1, "vir01", 117)
    with pytest.raises(CarveFailed, match="not a dynamic 310P chip"):
        await backend.create_vnpu(0, "vir01", 100)
    assert [(v.vnpu_id, v.template) for v in await backend.vnpus_now(1)] == [(116, "vir04"), (117, "vir02")]
    await backend.destroy_vnpu(1, 116)
    with pytest.raises(CarveFailed, match="has no vNPU 116"):
        await backend.destroy_vnpu(1, 116)
    assert [v.vnpu_id for v in await backend.vnpus_now(1)] == [117]


async def test_the_layout_s_dynamic_chips_are_not_said_to_be_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The fake backend follows the dynamic entries itself (it carves for the DRA driver); only what it does
    not do, split chips by a static layout, is said to be ignored."""
    keeper = VnpuLayoutKeeper()
    dynamic = Settings(backend="fake", fake_model="310P3", vnpu=parse_layout({"dynamic": True}))
    with caplog.at_level(logging.WARNING):
        assert await keeper.apply(FakeBackend(dynamic), dynamic) == ()
    assert caplog.records == []
    mixed = Settings(backend="fake", fake_model="310P3", vnpu=parse_layout({"dynamic": True, "0": ["vir02"]}))
    with caplog.at_level(logging.WARNING):
        await keeper.apply(FakeBackend(mixed), mixed)
    (said,) = caplog.records
    assert "the vnpu: layout but for its dynamic chips is ignored" in said.getMessage()


async def test_the_fake_a3_pairing_is_one_the_driver_could_give() -> None:
    """Past 8 cards the pairing went one way: card 8 with 4 while card 4 was with 0, which the agent refuses
    from a real driver (parse_pairs)."""
    for chips in range(2, 41, 2):
        backend = FakeBackend(Settings(backend="fake", fake_chips=chips, fake_model="910_9392"))
        chips_found = (await backend.discover()).chips
        pairs = {chip.npu_id: chip.paired_card for chip in chips_found}
        assert all(chip.paired_card == pairs[chip.npu_id] for chip in chips_found), "a card's dies agree"
        cards = sorted(pairs)
        answer = "".join(f"{card} {pairs[card]}\n" for card in cards)
        assert parse_pairs(answer, cards) == pairs, f"{chips} dies"
        if chips >= 10:
            assert pairs[0] == 4 and pairs[4] == 0


async def test_a_state_file_nested_too_deep_is_one_line(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """JSON nested 100,000 deep raised RecursionError, which only ValueError was caught for: a traceback."""
    deep = "[" * 100_000 + "]" * 100_000
    state = short_dir / "state.json"
    state.write_text(deep)
    with pytest.raises(ConfigError) as caught:
        await _backend(state).start()
    assert str(caught.value) == f"fake state file {state} is nested too deep to be a state file"
    state.write_text('{"unhealthy": [1]}')
    backend = _backend(state)
    await backend.start()
    state.write_text('{"faults": ' + deep + "}")
    with caplog.at_level(logging.WARNING):
        assert _unhealthy(await backend.discover()) == [1]
    assert [r.getMessage() for r in caplog.records] == [
        f"fake state file {state} is nested too deep to be a state file; keeping the previous state"
    ]
