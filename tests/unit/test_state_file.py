"""The agent's records beside its lock: a missing directory of the agent's own is made as the lock makes it
(its parent never), a failing write is one warning until its reason changes and one line once it works
again, and a change under the lock keeps what another instance wrote."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from ascend_agent.state_file import StateFile


def _file(path: Path) -> StateFile:
    return StateFile(path, 1024, "a record of tests", "the test's record is lost")


def _entry(entry: Any) -> int:
    if not isinstance(entry, int):
        raise TypeError("not a number")
    return entry


async def test_the_agents_directory_is_made_its_parent_never(short_dir: Path) -> None:
    own = short_dir / "plugins" / "ascend-agent"
    kept = _file(own / "record.json")
    assert await kept.write("{}") is False, "the kubelet's plugins directory is not the agent's to make"
    own.parent.mkdir()
    assert await kept.write('{"version": 1, "n": [1, 2]}') is True
    assert oct(own.stat().st_mode & 0o777) == "0o750"
    assert await kept.read("n", (1,), _entry, "starting without it") == [1, 2]


async def test_a_failing_write_is_one_warning_until_it_works_again(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own = short_dir / "agent"
    own.write_text("a file where the agent's directory goes")
    kept = _file(own / "record.json")
    with caplog.at_level(logging.INFO, logger="ascend_agent"):
        for _ in range(3):
            assert await kept.write("{}") is False
        own.unlink()
        own.mkdir(mode=0o750)
        assert await kept.write("{}") is True
    lines = [r.getMessage() for r in caplog.records if str(own) in r.getMessage()]
    assert len(lines) == 2, lines
    assert (
        lines[0].startswith(f"Cannot write {own}/record.json: ") and "the test's record is lost" in lines[0]
    )
    assert lines[1] == f"{own}/record.json is written again"


async def test_a_change_under_the_lock_starts_from_what_the_file_holds(short_dir: Path) -> None:
    path = short_dir / "record.json"
    path.write_text('{"version": 1, "n": [1]}')
    one, other = _file(path), _file(path)
    entries, written = await one.update("n", (1,), _entry, lambda n: json.dumps({"version": 1, "n": [*n, 2]}))
    assert (entries, written) == ([1], True)
    entries, written = await other.update(
        "n", (1,), _entry, lambda n: json.dumps({"version": 1, "n": [*n, 3]})
    )
    assert (entries, written) == ([1, 2], True)
    assert json.loads(path.read_text())["n"] == [1, 2, 3]
    assert (short_dir / "record.json.lock").exists()
