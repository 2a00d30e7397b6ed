"""The inotify watcher on real directories."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from prometheus_client import REGISTRY

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


def _configmap_version(directory: Path, serial: int, text: str) -> str:
    """A timestamped directory holding ``config.yaml``, as the kubelet writes one per ConfigMap version."""
    name = f"..2026_12_04_10_00_{serial:02d}.{serial:09d}"
    (directory / name).mkdir()
    (directory / name / "config.yaml").write_text(text)
    return name


async def test_a_configmap_update_is_seen_through_the_data_link(short_dir: Path) -> None:
    # The kubelet's layout of a mounted ConfigMap: the file links through ..data to a timestamped directory.
    first = _configmap_version(short_dir, 0, "fakeChips: 8\n")
    (short_dir / "..data").symlink_to(first)
    config = short_dir / "config.yaml"
    config.symlink_to("..data/config.yaml")
    watcher = Watcher()
    try:
        watcher.watch_file(config, "config")
        previous = first
        for serial in (1, 2):
            # An update: a new version, a ..data_tmp link to it renamed over ..data, the old version removed.
            version = _configmap_version(short_dir, serial, f"fakeChips: {serial}\n")
            (short_dir / "..data_tmp").symlink_to(version)
            os.rename(short_dir / "..data_tmp", short_dir / "..data")
            shutil.rmtree(short_dir / previous)
            seen = await _until(watcher, WatchEvent("config", "config.yaml", Change.MODIFIED))
            assert {event.name for event in seen} == {"config.yaml"}
            assert config.read_text() == f"fakeChips: {serial}\n"
            previous = version
    finally:
        watcher.close()


async def test_a_plain_file_is_not_taken_for_a_link(short_dir: Path) -> None:
    config = short_dir / "config.yaml"
    config.write_text("a: 1\n")
    watcher = Watcher()
    try:
        watcher.watch_file(config, "config")
        (short_dir / "..data").mkdir()
        config.write_text("a: 2\n")
        seen = await _until(watcher, WatchEvent("config", "config.yaml", Change.MODIFIED))
        assert {event.name for event in seen} == {"config.yaml"}
    finally:
        watcher.close()


async def test_the_dev_watch_sees_vnpu_nodes(short_dir: Path) -> None:
    from ascend_agent.backends.devfs import DevfsBackend
    from ascend_agent.config import Settings

    ((directory, accept),) = DevfsBackend(Settings(dev_root=short_dir)).watch_paths()
    watcher = Watcher()
    try:
        watcher.watch(directory, "dev", accept)
        (short_dir / "vdavinci116").write_text("")
        await _until(watcher, WatchEvent("dev", "vdavinci116", Change.CREATED))
        (short_dir / "vdavinci116").unlink()
        await _until(watcher, WatchEvent("dev", "vdavinci116", Change.DELETED))
    finally:
        watcher.close()


def _overflow(directory: Path) -> None:
    """More events than the kernel queues (``max_queued_events``) in ``directory``, while no one reads."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    for n in range(limit // 2 + 100):
        name = directory / f"churn{n}"
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o600))
        os.unlink(name)


async def test_an_overflowed_queue_makes_every_directory_looked_at_again(short_dir: Path) -> None:
    """A removal after the queue overflowed is never reported: every watched directory must be rescanned."""
    dev, kubelet = short_dir / "dev", short_dir / "kubelet"
    dev.mkdir()
    kubelet.mkdir()
    (dev / "davinci3").write_text("")
    before = REGISTRY.get_sample_value("ascend_agent_watch_rescans_total", {"reason": "overflow"}) or 0
    watcher = Watcher()
    try:
        watcher.watch(dev, "dev", lambda name: name.startswith("davinci"))
        watcher.watch(kubelet, "kubelet", lambda name: name.endswith(".sock"))
        _overflow(kubelet)  # the event loop does not run meanwhile: nothing is read
        (dev / "davinci3").unlink()
        seen = await _until(watcher, WatchEvent("dev", "", Change.APPEARED))
        assert WatchEvent("kubelet", "", Change.APPEARED) in seen
    finally:
        watcher.close()
    after = REGISTRY.get_sample_value("ascend_agent_watch_rescans_total", {"reason": "overflow"})
    assert after == before + 1
