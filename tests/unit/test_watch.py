"""The inotify watcher on real directories."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from ascend_agent.watch import Change, Watcher, WatchEvent


async def _until(watcher: Watcher, wanted: WatchEvent, timeout: float = 5.0) -> list[WatchEvent]:
    seen: list[WatchEvent] = []
    async with asyncio.timeout(timeout):
        while wanted not in seen:
            seen.extend(await watcher.next_batch())
    return seen


async def test_created_modified_deleted_with_a_name_filter(short_dir: Path) -> None:
    watcher = Watcher()
    try:
        watcher.watch(short_dir, "dev", lambda name: name.startswith("davinci"))
        (short_dir / "other").write_text("x")
        (short_dir / "davinci0").write_text("x")
        seen = await _until(watcher, WatchEvent("dev", "davinci0", Change.CREATED))
        assert all(event.name.startswith("davinci") for event in seen)
        os.chmod(short_dir / "davinci0", 0o600)
        await _until(watcher, WatchEvent("dev", "davinci0", Change.MODIFIED))
        (short_dir / "davinci0").unlink()
        await _until(watcher, WatchEvent("dev", "davinci0", Change.DELETED))
    finally:
        watcher.close()


async def test_a_file_replaced_by_rename_keeps_being_seen(short_dir: Path) -> None:
    target = short_dir / "state.json"
    target.write_text("{}")
    watcher = Watcher()
    try:
        watcher.watch_file(target, "state")
        for round_ in range(3):
            temporary = short_dir / f".state.{round_}"
            temporary.write_text(f'{{"unhealthy": [{round_}]}}')
            temporary.rename(target)
            await _until(watcher, WatchEvent("state", "state.json", Change.CREATED))
        target.write_text("{}")
        await _until(watcher, WatchEvent("state", "state.json", Change.MODIFIED))
    finally:
        watcher.close()


async def test_a_missing_directory_is_waited_for(short_dir: Path) -> None:
    directory = short_dir / "a" / "b" / "device-plugins"
    watcher = Watcher()
    try:
        watcher.watch(directory, "kubelet")
        (short_dir / "a" / "b").mkdir(parents=True)
        directory.mkdir()
        await _until(watcher, WatchEvent("kubelet", "", Change.APPEARED))
        (directory / "kubelet.sock").write_text("")
        await _until(watcher, WatchEvent("kubelet", "kubelet.sock", Change.CREATED))
    finally:
        watcher.close()


async def test_a_removed_and_recreated_directory_is_followed(short_dir: Path) -> None:
    directory = short_dir / "dev"
    directory.mkdir()
    watcher = Watcher()
    try:
        watcher.watch(directory, "dev")
        directory.rmdir()
        directory.mkdir()
        await _until(watcher, WatchEvent("dev", "", Change.APPEARED))
        (directory / "davinci1").write_text("")
        await _until(watcher, WatchEvent("dev", "davinci1", Change.CREATED))
    finally:
        watcher.close()


async def test_close_releases_the_descriptor(short_dir: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        watcher = Watcher()
        watcher.watch(short_dir, "x")
        watcher.close()
    assert len(os.listdir("/proc/self/fd")) == before
