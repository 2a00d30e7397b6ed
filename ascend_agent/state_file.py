"""The agent's own records on the node (``handed-out.json``, ``hot-reset-budget.json``), in its directory
beside the instance lock, which the kubelet's start-up never wipes: read bounded and never through a link,
replaced atomically, each problem logged once until it changes or clears. Reads and writes run in a daemon
thread of their own: the agent's stop never waits for a hung filesystem past the caller's bound, nor does its
exit::

    kept = StateFile(directory / "handed-out.json", 4 * 1024 * 1024, "a record of handed-out devices",
                     lost="what Allocate handed out is kept in memory only (lost if the agent restarts)")
    entries = await kept.read("handed", (1,), entry_of, without="starting without it")   # [] on any problem
    await kept.write(text)               # False when it failed (one warning per reason)
    with anyio.move_on_after(2.0):       # bounded: the write goes on unwaited for
        await kept.write(text)

A file two instances write (the DRA driver's rolling update serves two pods side by side) is changed with
:meth:`StateFile.update`: read, merged and written under an flock of ``<name>.lock`` beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ascend_agent.files import (
    UnusableFile,
    make_dirs,
    open_no_follow,
    parse_records,
    read_regular,
    replace_file,
)
from ascend_agent.observability import ProblemLog

log = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T")

# The agent's own directory, when a write finds it missing, as the instance lock makes it.
DIRECTORY_MODE = 0o750


class StateFile:
    """One record of the agent's, ``path``, at most ``limit`` bytes, holding ``what`` (for messages:
    ``a record of handed-out devices``); ``lost`` says what a failed write costs."""

    def __init__(self, path: Path, limit: int, what: str, lost: str) -> None:
        self.path = path
        self.limit = limit
        self.what = what
        self.lost = lost
        # One read or write of the file at a time, in whichever thread: a write abandoned by its caller
        # lands before the next one, never after it.
        self._busy = threading.Lock()
        self._reading = ProblemLog()
        self._writing = ProblemLog()

    async def read(
        self,
        key: str,
        versions: tuple[int, ...],
        record: Callable[[Any], R],
        without: str,
    ) -> list[R]:
        """The entries of ``{"version": V, key: [...]}`` in the file; none when there is no file, and none
        with one warning (``<problem>; <without>``) when it cannot be read or is not ``what``."""
        return await in_daemon_thread(self.read_now, key, versions, record, without)

    def read_now(
        self,
        key: str,
        versions: tuple[int, ...],
        record: Callable[[Any], R],
        without: str | None = None,
    ) -> list[R]:
        """:meth:`read`, blocking; quiet without ``without`` (``list`` and the doctor read the running agent's
        file and say nothing of it)."""
        with self._busy:
            return self._read(key, versions, record, without)

    async def write(self, text: str) -> bool:
        """Replace the file with ``text``; False when that failed (one warning until the reason changes;
        one line when it works again). The agent's directory is made (0750) if it went, never its parent."""
        return await in_daemon_thread(self._write_now, text)

    async def update(
        self,
        key: str,
        versions: tuple[int, ...],
        record: Callable[[Any], R],
        merged: Callable[[list[R]], str],
    ) -> tuple[list[R], bool]:
        """Under an flock of ``<path>.lock``: the file's entries (none when it is not ``what``: replaced),
        and ``merged(entries)`` written in its place; the entries and whether the write succeeded. For a file
        two instances of the agent write: neither loses what the other wrote. ``merged`` runs in the worker
        thread: it must read nothing but its argument and what it was made with."""
        return await in_daemon_thread(self._update_now, key, versions, record, merged)

    def _update_now(
        self,
        key: str,
        versions: tuple[int, ...],
        record: Callable[[Any], R],
        merged: Callable[[list[R]], str],
    ) -> tuple[list[R], bool]:
        with self._busy:
            try:
                with self._locked():
                    entries = self._read(key, versions, record, "replacing it")
                    return entries, self._write(merged(entries))
            except OSError as exc:  # the lock file cannot be made or locked
                self._write_failed(f"{self.path.name}.lock: {exc.strerror or exc}")
                return [], False

    def _read(
        self, key: str, versions: tuple[int, ...], record: Callable[[Any], R], without: str | None
    ) -> list[R]:
        try:
            data = read_regular(self.path, self.limit, self.what)
            entries = [] if data is None else parse_records(self.path, data, key, versions, record, self.what)
        except (UnusableFile, OSError) as exc:
            problem = (
                str(exc)
                if isinstance(exc, UnusableFile)
                else f"cannot read {self.path}: {exc.strerror or exc}"
            )
            if without is not None and self._reading.changed(problem):
                log.warning("%s; %s", _capitalized(problem), without)
            return []
        self._reading.clear()
        return entries

    def _write_now(self, text: str) -> bool:
        with self._busy:
            return self._write(text)

    def _write(self, text: str) -> bool:
        try:
            make_dirs(self.path.parent, DIRECTORY_MODE, parents=False)
            replace_file(self.path, text)
        except OSError as exc:
            self._write_failed(exc.strerror or str(exc))
            return False
        if self._writing.clear():
            log.info("%s is written again", self.path)
        return True

    def _write_failed(self, problem: str) -> None:
        if self._writing.changed(problem):
            log.warning("Cannot write %s: %s; %s", self.path, problem, self.lost)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        make_dirs(self.path.parent, DIRECTORY_MODE, parents=False)
        lock = self.path.with_name(f"{self.path.name}.lock")
        descriptor = open_no_follow(lock, os.O_RDWR | os.O_CREAT | os.O_NOCTTY | os.O_NONBLOCK, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # releases the flock


async def in_daemon_thread(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in a daemon thread of its own. Cancelling the wait abandons the thread, and the
    process exits without waiting for it (a worker thread of the event loop's would hold the exit until a
    hung filesystem answers)."""
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            value = function(*args)
        except Exception as exc:  # handed to the caller, as a worker thread would
            deliver = functools.partial(_set_exception, finished, exc)
        else:
            deliver = functools.partial(_set_result, finished, value)
        with contextlib.suppress(RuntimeError):  # the loop is gone: the agent stopped
            loop.call_soon_threadsafe(deliver)

    threading.Thread(target=run, name="ascend-agent state file", daemon=True).start()
    return await finished


def _set_result(finished: asyncio.Future[T], value: T) -> None:
    if not finished.done():  # else the caller stopped waiting
        finished.set_result(value)


def _set_exception(finished: asyncio.Future[T], error: Exception) -> None:
    if not finished.done():
        finished.set_exception(error)


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]
