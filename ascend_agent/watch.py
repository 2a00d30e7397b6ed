"""inotify turned into an async stream of typed events, on the event loop (no threads, no polling).

Directories are watched, never single files, so a file replaced by rename (as editors and ``kubectl cp``
do) keeps being seen, and so does a mounted ConfigMap's file, whose content changes by a swap of the
``..data`` link it points through. A directory that does not exist yet is waited for by watching its nearest
existing parent; when it appears the watch moves down and an ``APPEARED`` event says "look again"::

    watcher = Watcher()
    watcher.watch(Path("/var/lib/kubelet/device-plugins"), "kubelet", lambda name: name.endswith(".sock"))
    async for events in watcher:
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from inotify_simple import INotify
from inotify_simple import flags as _flags

from ascend_agent.observability import WATCH_RESCANS, log_fields

log = logging.getLogger(__name__)

NameFilter = Callable[[str], bool]


class Change(enum.StrEnum):
    CREATED = "created"
    DELETED = "deleted"
    MODIFIED = "modified"
    APPEARED = "appeared"  # the watched directory itself appeared (or was re-created): rescan it


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """Something happened to ``name`` in the directory watched under ``tag``."""

    tag: str
    name: str
    change: Change


_DIRECTORY_MASK = (
    _flags.CREATE
    | _flags.DELETE
    | _flags.MOVED_TO
    | _flags.MOVED_FROM
    | _flags.CLOSE_WRITE
    | _flags.ATTRIB
    | _flags.DELETE_SELF
    | _flags.MOVE_SELF
)


@dataclass(slots=True, eq=False)
class _Target:
    directory: Path
    tag: str
    accept: NameFilter
    # Entries reported under another name: a link the watched file points through, reported as the file.
    aliases: Mapping[str, str] = field(default_factory=dict)
    wd: int | None = None
    armed_on: Path | None = None  # the directory the watch sits on: the target, or an ancestor while waiting


class Watcher:
    """One inotify instance; ``watch()`` directories, then iterate over batches of events."""

    def __init__(self) -> None:
        self._inotify = INotify(nonblocking=True)
        self._targets: list[_Target] = []
        self._by_wd: dict[int, list[_Target]] = {}
        self._queue: asyncio.Queue[list[WatchEvent]] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._inotify.fileno(), self._readable)
        self._closed = False
        self._said: set[str] = set()  # the reasons for lost events already logged

    def watch(self, directory: Path, tag: str, accept: NameFilter | None = None) -> None:
        """Report changes to entries of ``directory`` whose names ``accept`` allows, tagged ``tag``."""
        self._add(_Target(directory.absolute(), tag, accept or (lambda name: True)))

    def watch_file(self, path: Path, tag: str) -> None:
        """Report writes, replacement and removal of one file, through its directory.

        When the file is a relative link through a sibling entry, as in a mounted ConfigMap
        (``config.yaml -> ..data/config.yaml``, and an update renames a new ``..data_tmp`` link over
        ``..data``), a change of that entry is reported as ``MODIFIED`` of the file itself.
        """
        name = path.name
        step = _link_step(path)
        aliases = {step: name} if step is not None else {}
        names = {name, *aliases}
        self._add(_Target(path.parent.absolute(), tag, lambda entry: entry in names, aliases))

    def _add(self, target: _Target) -> None:
        self._targets.append(target)
        self._arm(target)

    def _arm(self, target: _Target) -> None:
        if target.wd is not None:
            self._forget(target)
        place = target.directory
        while not place.is_dir() and place != place.parent:
            place = place.parent
        # One mask for every watch: inotify keeps one watch per inode, and add_watch replaces its mask.
        try:
            wd = self._inotify.add_watch(place, _DIRECTORY_MASK)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            log.warning("Cannot watch %s: %s", place, reason, extra=log_fields(path=place, reason=reason))
            return
        target.wd, target.armed_on = wd, place
        self._by_wd.setdefault(wd, []).append(target)
        if place != target.directory and self._next_step(target).is_dir():
            # Made between the look and the watch: its creation was in no event; go down now.
            self._arm(target)

    @staticmethod
    def _next_step(target: _Target) -> Path:
        assert target.armed_on is not None
        return target.armed_on / target.directory.relative_to(target.armed_on).parts[0]

    def _forget(self, target: _Target) -> None:
        assert target.wd is not None
        sharing = self._by_wd.get(target.wd, [])
        if target in sharing:
            sharing.remove(target)
        if not sharing:
            self._by_wd.pop(target.wd, None)
            with contextlib.suppress(OSError):  # already gone when the directory was removed
                self._inotify.rm_watch(target.wd)
        target.wd = target.armed_on = None

    def _readable(self) -> None:
        batch: list[WatchEvent] = []
        rearm: list[_Target] = []
        events = self._inotify.read(timeout=0)
        gone = {event.wd for event in events if event.mask & (_flags.DELETE_SELF | _flags.MOVE_SELF)}
        lost = ""
        for event in events:
            if event.mask & _flags.Q_OVERFLOW:
                lost = "overflow"
                continue
            if event.mask & _flags.IGNORED and event.wd in self._by_wd and event.wd not in gone:
                lost = lost or "watch_lost"
            for target in list(self._by_wd.get(event.wd, ())):
                if target.armed_on == target.directory:
                    batch.extend(self._translate(target, event.mask, event.name))
                    if event.mask & (_flags.DELETE_SELF | _flags.MOVE_SELF | _flags.IGNORED):
                        rearm.append(target)
                elif event.mask & (_flags.DELETE_SELF | _flags.MOVE_SELF | _flags.IGNORED) or self._leads_to(
                    target, event.name
                ):
                    rearm.append(target)
        if lost:
            self._events_lost(lost)
            rearm.extend(self._targets)
        for target in dict.fromkeys(rearm):
            self._arm(target)
            if target.armed_on == target.directory:  # a new directory: what is in it was never reported
                batch.append(WatchEvent(target.tag, "", Change.APPEARED))
        if batch:
            self._queue.put_nowait(batch)

    def _events_lost(self, reason: str) -> None:
        """Events were dropped (the queue overflowed while we were paused or busy) or a watch ended: every
        target is armed again and reported as APPEARED, so that everything the watches cover is looked at."""
        WATCH_RESCANS.labels(reason=reason).inc()
        if reason not in self._said:
            self._said.add(reason)
            why = "the inotify queue overflowed" if reason == "overflow" else "an inotify watch was lost"
            log.warning(
                "Events may have been missed (%s); looking at every watched directory again",
                why,
                extra=log_fields(reason=reason),
            )

    @staticmethod
    def _leads_to(target: _Target, name: str) -> bool:
        """True when ``name``, created in the ancestor we wait on, is the next step towards the target."""
        assert target.armed_on is not None
        try:
            step = target.directory.relative_to(target.armed_on).parts[0]
        except (ValueError, IndexError):
            return False
        return name == step

    @staticmethod
    def _translate(target: _Target, mask: int, name: str) -> list[WatchEvent]:
        if not name or not target.accept(name):
            return []
        if mask & (_flags.CREATE | _flags.MOVED_TO):
            change = Change.CREATED
        elif mask & (_flags.DELETE | _flags.MOVED_FROM):
            change = Change.DELETED
        elif mask & (_flags.CLOSE_WRITE | _flags.ATTRIB):
            change = Change.MODIFIED
        else:
            return []
        alias = target.aliases.get(name)
        if alias is not None:
            return [WatchEvent(target.tag, alias, Change.MODIFIED if change is Change.CREATED else change)]
        return [WatchEvent(target.tag, name, change)]

    async def next_batch(self) -> list[WatchEvent]:
        """The next batch of events, as one read of the inotify descriptor delivered them."""
        return await self._queue.get()

    async def __aiter__(self) -> AsyncIterator[list[WatchEvent]]:
        while not self._closed:
            yield await self.next_batch()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._inotify.fileno())
        with contextlib.suppress(OSError):
            self._inotify.close()


def _link_step(path: Path) -> str | None:
    """The sibling entry a relative link at ``path`` leads through: ``..data`` for ``..data/config.yaml``."""
    try:
        target = os.readlink(path)
    except OSError:  # not a link, or not there
        return None
    if os.path.isabs(target):
        return None
    step = Path(target).parts[0]
    return None if step in (".", "..", path.name) else step
