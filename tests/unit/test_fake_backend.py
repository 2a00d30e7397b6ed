"""The fake backend's state file on real files: missing, not UTF-8, naming chips that do not exist."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ascend_agent.backends.fake import FakeBackend
from ascend_agent.config import ConfigError, Settings
from ascend_agent.model import Health, Inventory

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
