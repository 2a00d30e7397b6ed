"""One agent per node: an exclusive lock in the agent's own directory, held for as long as it runs.

A second instance (a DaemonSet rolling update with ``maxSurge``, or a second ``ascend-agent run`` by hand)
logs who holds the lock and waits until that one stops, so two agents never fight over the same sockets::

    async with exclusive(Path("/var/lib/kubelet/plugins/ascend-agent")):
        ...
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio.to_thread

from ascend_agent.config import ConfigError

log = logging.getLogger(__name__)

LOCK_FILE = "agent.lock"


@contextlib.asynccontextmanager
async def exclusive(directory: Path) -> AsyncIterator[None]:
    """Hold ``directory/agent.lock`` exclusively, waiting for its holder to stop first; it carries our pid."""
    path = directory / LOCK_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ConfigError(f"cannot create the instance lock {path}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode("ascii", "replace").strip() or "unknown"
            log.info("Another ascend-agent (pid %s) holds %s; waiting for it to stop", holder, path)
            # The kernel says when the lock is free: a thread waits for it, abandoned if we are stopped.
            await anyio.to_thread.run_sync(fcntl.flock, descriptor, fcntl.LOCK_EX, abandon_on_cancel=True)
            log.info("The ascend-agent with pid %s stopped; taking over", holder)
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)
