"""What Allocate handed over for each of the kubelet's IDs: held from the Allocate until PodResources listed
the ID and then no longer does, or until no answer listed it within the grace; an answer asked before the
Allocate says nothing. PodResources is read through it (the pod under the kubelet's ID holds the chip handed
over for that ID), and it survives the agent: kept in a file of the agent's own directory, bounded."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from ascend_agent.cluster.volcano import VolcanoPods
from ascend_agent.cluster.volcano_marks import PodView
from ascend_agent.kubelet.handed_out import HandedOut
from ascend_agent.kubelet.holders import Holdings
from ascend_agent.kubelet.podresources import PodHolders
from ascend_agent.model import Chip, Holder, Holders, Inventory
from ascend_agent.watch import Watcher
from tests.support.clock import ManualClock

TWO = "huawei.com/Ascend310P-2c"
KEY = (TWO, "Ascend310P-2c-118-1")
T = "huawei.com/Ascend910"


def _same(*device_ids: str) -> list[tuple[str, str]]:
    return [(device_id, device_id) for device_id in device_ids]


def test_held_until_listed_and_then_no_longer() -> None:
    clock = ManualClock(100.0)
    handed = HandedOut(clock, grace=60)
    handed.observe(set(), 100.0)
    handed.record(TWO, _same("Ascend310P-2c-118-1"))
    handed.observe(set(), 99.5)  # asked before the Allocate
    handed.observe(set(), 100.2)  # the kubelet has not recorded the pod yet
    assert handed.device_ids() == {"Ascend310P-2c-118-1"}
    handed.observe({KEY}, 100.5)
    handed.observe({KEY}, 130.0)
    assert handed.device_ids() == {"Ascend310P-2c-118-1"}
    handed.observe(set(), 131.0)  # the pod is gone
    assert handed.device_ids() == frozenset()


def test_one_never_listed_is_let_go_after_the_grace() -> None:
    clock = ManualClock(100.0)
    handed = HandedOut(clock, grace=60)
    handed.record(TWO, _same("Ascend310P-2c-118-1", "Ascend310P-2c-117-1"))
    handed.observe({(TWO, "Ascend310P-2c-117-1")}, 159.0)
    assert handed.device_ids() == {"Ascend310P-2c-118-1", "Ascend310P-2c-117-1"}
    handed.observe({(TWO, "Ascend310P-2c-117-1")}, 161.0)
    assert handed.device_ids() == {"Ascend310P-2c-117-1"}


def test_handed_out_again_counts_from_the_new_allocate() -> None:
    clock = ManualClock(100.0)
    handed = HandedOut(clock, grace=60)
    handed.record(TWO, _same("Ascend310P-2c-118-1"))
    handed.observe({KEY}, 101.0)
    clock.now = 200.0
    handed.record(TWO, _same("Ascend310P-2c-118-1"))  # freed and handed to another pod meanwhile
    handed.observe(set(), 150.0)  # an answer from before the second Allocate
    handed.observe(set(), 200.1)
    assert handed.device_ids() == {"Ascend310P-2c-118-1"}


async def test_with_volcano_what_was_handed_over_is_seen_under_the_chip_really_mounted(
    short_dir: Path,
) -> None:
    """``--volcano``: the kubelet charged ``Ascend910-0`` and Allocate handed over chip 3, Volcano's choice.
    PodResources lists the pod under ``Ascend910-0``; that is chip 3 being seen, and the pod gone from
    PodResources frees chip 3 at once (not after the grace). The vNPU layout is told chip 3 is held, not
    ``Ascend910-0``."""
    pods = VolcanoPods()
    pods.observe(Inventory(tuple(Chip.make(n, "910B3") for n in range(8))))
    pods._store(PodView("team-a", "train", "uid-train", {T: "Ascend910-3", "predicate-time": "1"}, {T: 1}))
    holdings = Holdings(PodHolders(short_dir / "pod-resources.sock", 5.0), pods.follow_mounted)
    clock = ManualClock(100.0)
    holdings.handed_out = HandedOut(clock=clock)

    assert await pods.remap(T, [["Ascend910-0"]]) == [["Ascend910-3"]]
    holdings.allocated(T, [("Ascend910-0", "Ascend910-3")])  # what the plugin layer calls
    clock.now += 1
    listed = Holders({(T, "Ascend910-0"): (Holder("team-a", "train", "main"),)})
    holdings.pods.holders = listed
    holdings.pods.on_answer(listed, clock.now)
    assert holdings.held_devices() == {"Ascend910-3"}

    clock.now += 1
    holdings.pods.holders = Holders()
    holdings.pods.on_answer(Holders(), clock.now)
    assert holdings.handed_out.device_ids() == frozenset(), "PodResources showed chip 3 freed"


def test_the_pod_under_the_kubelets_ids_holds_the_chips_handed_over_for_them(short_dir: Path) -> None:
    """The Allocate for the kubelet's ``Ascend910-2,3`` handed over chips 6 and 7 (Volcano's choice, whichever
    pod its marks were written on): PodResources lists ``legit`` under 2 and 3, so ``legit`` holds 6 and 7.
    The pods' marks name another pod for them, and cannot move that."""
    marks = [("team-b", "thief", ("Ascend910-2", "Ascend910-3"), ("Ascend910-6", "Ascend910-7"))]

    def by_marks(holders: Holders) -> Holders:  # what --volcano's pod marks say, as VolcanoPods does
        from ascend_agent.cluster.volcano_marks import Mounted, follow_mounted

        return follow_mounted(holders, [Mounted(ns, pod, T, ids, real) for ns, pod, ids, real in marks])

    holdings = Holdings(PodHolders(short_dir / "pod-resources.sock", 5.0), by_marks)
    holdings.allocated(T, [("Ascend910-2", "Ascend910-6"), ("Ascend910-3", "Ascend910-7")])
    legit, plain = Holder("team-a", "legit", "main"), Holder("team-c", "plain", "main")
    holdings.pods.holders = Holders(
        {(T, "Ascend910-2"): (legit,), (T, "Ascend910-3"): (legit,), (T, "Ascend910-0"): (plain,)}
    )
    assert dict(holdings.by_chip().by_device) == {
        (T, "Ascend910-6"): (legit,),
        (T, "Ascend910-7"): (legit,),
        (T, "Ascend910-0"): (plain,),
    }
    assert holdings.held_devices() == {"Ascend910-0", "Ascend910-6", "Ascend910-7"}


async def _kept(handed: HandedOut, path: Path, change: Callable[[], None]) -> None:
    """``handed`` kept in ``path`` while ``change`` runs, until the file holds the change: looked at each
    time inotify says the file was replaced."""
    watcher = Watcher()
    watcher.watch(path.parent, "state", lambda name: name == path.name)
    try:
        async with anyio.create_task_group() as tasks:
            await tasks.start(handed.keep, path)
            change()
            with anyio.fail_after(10):
                while not _written(path):
                    await watcher.next_batch()
            tasks.cancel_scope.cancel()
    finally:
        watcher.close()


def _written(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_bytes())["handed"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


async def test_the_map_survives_the_agent(short_dir: Path) -> None:
    """What an agent handed out is written to its own directory, and the next agent reads PodResources
    through it: ``legit`` still holds chips 6 and 7."""
    path = short_dir / "agent" / "handed-out.json"
    path.parent.mkdir(mode=0o750)
    first = HandedOut()
    await _kept(
        first, path, lambda: first.record(T, [("Ascend910-2", "Ascend910-6"), ("Ascend910-3", "Ascend910-7")])
    )

    again = HandedOut()
    async with anyio.create_task_group() as tasks:
        await tasks.start(again.keep, path)
        tasks.cancel_scope.cancel()
    legit = Holder("team-a", "legit", "main")
    on_chips, others = again.through(Holders({(T, "Ascend910-2"): (legit,), (T, "Ascend910-3"): (legit,)}))
    assert list(on_chips.by_device) == [(T, "Ascend910-6"), (T, "Ascend910-7")]
    assert others.by_device == {}
    assert again.device_ids() == {"Ascend910-6", "Ascend910-7"}
    again.observe(set(), time.monotonic() + 61)  # never listed since: gone after the grace
    assert again.device_ids() == frozenset()


async def test_the_last_change_is_written_as_the_agent_stops(short_dir: Path) -> None:
    path = short_dir / "handed-out.json"
    handed = HandedOut()
    async with anyio.create_task_group() as tasks:
        await tasks.start(handed.keep, path)
        handed.record(T, [("Ascend910-0", "Ascend910-5")])
        tasks.cancel_scope.cancel()  # before the writer ran
    assert json.loads(path.read_text())["handed"] == [
        {"resource": T, "kubeletId": "Ascend910-0", "device": "Ascend910-5", "seen": False}
    ]


async def test_a_hung_filesystem_holds_the_stop_for_the_final_write_timeout_only(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync stops answering (a hung disk or network filesystem) while the map is written: the agent's stop
    waits ``FINAL_WRITE_TIMEOUT`` for the last write, not for the filesystem, and the write's thread is a
    daemon, so the process exits without it."""
    monkeypatch.setattr("ascend_agent.kubelet.handed_out.FINAL_WRITE_TIMEOUT", 0.2)
    hung, release, answered = threading.Event(), threading.Event(), threading.Event()
    fsync = os.fsync

    def hung_fsync(descriptor: int) -> None:
        hung.set()
        release.wait(10)  # the filesystem answers at last: the test's bound, far past the agent's
        answered.set()
        fsync(descriptor)

    path = short_dir / "handed-out.json"
    handed = HandedOut()
    try:
        async with anyio.create_task_group() as tasks:
            await tasks.start(handed.keep, path)
            monkeypatch.setattr(os, "fsync", hung_fsync)
            handed.record(T, [("Ascend910-0", "Ascend910-5")])
            await anyio.to_thread.run_sync(hung.wait, 30)
            handed.record(T, [("Ascend910-1", "Ascend910-6")])
            tasks.cancel_scope.cancel()
        assert not answered.is_set(), "the stop waited for the filesystem"
        writers = [t for t in threading.enumerate() if t.name == "ascend-agent state file"]
        assert writers and all(t.daemon for t in writers)
    finally:
        release.set()
        for writer in threading.enumerate():
            if writer.name == "ascend-agent state file":
                writer.join(30)
    assert [entry["kubeletId"] for entry in json.loads(path.read_text())["handed"]] == [
        "Ascend910-0",
        "Ascend910-1",
    ], "the last write lands after the one it waited behind"


async def test_a_hung_read_is_given_up_and_the_agent_starts_without_it(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("ascend_agent.kubelet.handed_out.LOAD_TIMEOUT", 0.2)
    release, answered = threading.Event(), threading.Event()

    def hung_read(*args: object) -> bytes | None:
        release.wait(10)
        answered.set()
        return None

    monkeypatch.setattr("ascend_agent.state_file.read_regular", hung_read)
    handed = HandedOut()
    try:
        async with anyio.create_task_group() as tasks:
            await tasks.start(handed.keep, short_dir / "handed-out.json")
            assert not answered.is_set(), "the start waited for the filesystem"
            tasks.cancel_scope.cancel()
    finally:
        release.set()
    assert any("Cannot read" in r.getMessage() and "within 0.2 s" in r.getMessage() for r in caplog.records)


def test_the_map_is_bounded_oldest_first_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    handed = HandedOut(limit=3)
    for n in range(5):
        handed.record(T, [(f"Ascend910-{n}", f"Ascend910-{n + 8}")])
    assert [kubelet_id for kubelet_id, _ in handed.pairs(T)] == ["Ascend910-4", "Ascend910-3", "Ascend910-2"]
    lines = [r.getMessage() for r in caplog.records if "the oldest are forgotten" in r.getMessage()]
    assert len(lines) == 1, lines
    handed.record(T, [("x" * 200, "Ascend910-1")])  # no ID the agent advertised: not kept
    assert len(handed.pairs(T)) == 3 and "x" * 200 not in dict(handed.pairs(T))


@pytest.mark.parametrize(
    "written",
    [b"{", b'{"version": 1, "handed": [{"resource": 1}]}', b"[]", b'{"version": 9, "handed": []}', b"\xff"],
    ids=["not JSON", "a bad entry", "no object", "another version", "not UTF-8"],
)
async def test_a_file_that_is_no_map_is_one_warning_and_replaced(
    short_dir: Path, caplog: pytest.LogCaptureFixture, written: bytes
) -> None:
    path = short_dir / "handed-out.json"
    path.write_bytes(written)
    handed = HandedOut()
    await _kept(handed, path, lambda: handed.record(T, [("Ascend910-0", "Ascend910-5")]))
    lines = [
        r.getMessage() for r in caplog.records if "is not a record of handed-out devices" in r.getMessage()
    ]
    assert len(lines) == 1 and len(lines[0]) < 400, lines
    assert json.loads(path.read_text())["version"] == 1


async def test_a_link_in_place_of_the_file_is_not_followed(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = short_dir / "elsewhere.json"
    entry = {"resource": T, "kubeletId": "Ascend910-0", "device": "Ascend910-5", "seen": True}
    target.write_text(json.dumps({"version": 1, "handed": [entry]}))
    path = short_dir / "handed-out.json"
    path.symlink_to(target)
    handed = HandedOut()
    async with anyio.create_task_group() as tasks:
        await tasks.start(handed.keep, path)
        tasks.cancel_scope.cancel()
    assert handed.device_ids() == frozenset()
    assert any("handed-out.json is a symbolic link, not a record" in r.getMessage() for r in caplog.records)
