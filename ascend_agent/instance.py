"""One agent per node: an exclusive lock in the agent's own directory, held for as long as it runs.

A second instance (a DaemonSet rolling update with ``maxSurge``, or a second ``ascend-agent run`` by hand)
logs who holds the lock and waits until that one stops, so two agents never fight over the same sockets::

    async with exclusive(Path("/var/lib/kubelet/plugins/ascend-agent"), on_wait=note_standby):
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from stat import S_ISREG

from ascend_agent.config import ConfigError
from ascend_agent.files import make_dirs, open_no_follow

log = logging.getLogger(__name__)

LOCK_FILE = "agent.lock"


@contextlib.asynccontextmanager
async def exclusive(
    directory: Path, on_wait: Callable[[str], None] | None = None, make_parents: bool = True
) -> AsyncIterator[None]:
    """Hold ``directory/agent.lock`` exclusively, waiting for its holder to stop first (``on_wait`` hears the
    holder's pid); the file carries our pid while we hold it. ``directory`` is made if missing, and its
    parents with ``make_parents`` (never when the parent is the kubelet's own)."""
    path = directory / LOCK_FILE
    try:
        make_dirs(directory, 0o750, parents=make_parents)
        descriptor = open_no_follow(path, os.O_RDWR | os.O_CREAT | os.O_NOCTTY | os.O_NONBLOCK, 0o644)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(
            f"cannot create the instance lock {path}: {directory} (or a directory above it) is a file, "
            "not a directory; give --plugin-dir a directory"
        ) from None
    except PermissionError as exc:
        raise ConfigError(
            f"cannot create the instance lock {path}: {exc.strerror or exc}; run the agent as root, or give "
            "--plugin-dir a directory this user can write"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(
                f"the instance lock {path} is a symbolic link; remove it (the agent writes its pid there)"
            ) from None
        raise ConfigError(f"cannot create the instance lock {path}: {exc.strerror or exc}") from None
    try:
        _check_lock_file(path, descriptor)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip() or "unknown"
            log.info("Another ascend-agent (pid %s) holds %s; waiting for it to stop", holder, path)
            if on_wait is not None:
                on_wait(holder)
            await _wait_for(descriptor)
            log.info("The ascend-agent with pid %s stopped; taking over", holder)
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)


def _check_lock_file(path: Path, descriptor: int) -> None:
    """The lock must be a regular file of the agent's own user (root): anything else was put there by
    someone else, and writing our pid into it would change what it is."""
    stat = os.fstat(descriptor)
    if not S_ISREG(stat.st_mode):
        raise ConfigError(f"the instance lock {path} is not a regular file; remove it")
    if stat.st_uid != os.geteuid():
        raise ConfigError(
            f"the instance lock {path} belongs to user {stat.st_uid}, not to the agent's user "
            f"{os.geteuid()}; remove it"
        )


async def _wait_for(descriptor: int) -> None:
    """The kernel says when the lock is free: a daemon thread blocks in flock, so that an agent stopped while
    it waits exits at once instead of waiting for that thread."""
    loop = asyncio.get_running_loop()
    free = asyncio.Event()

    def wait() -> None:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except OSError:  # the descriptor was closed: the agent is stopping
            return
        with contextlib.suppress(RuntimeError):  # the loop is gone: the agent is stopping
            loop.call_soon_threadsafe(free.set)

    threading.Thread(target=wait, name="instance lock", daemon=True).start()
    await free.wait()
