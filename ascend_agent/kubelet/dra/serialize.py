"""One NodePrepareResources or NodeUnprepareResources at a time. Within the process an anyio lock; while two
instances of the driver run side by side (a DaemonSet's rolling update: the new pod serves before the old one
stops) also an flock on a file both instances see, ``<kubelet plugins dir>/<driver>/serialize.lock``, so that
each call reads the checkpoint the other instance may have written and writes it before the next call::

    calls = CallLock(plugin_dir / "serialize.lock")    # CallLock(None): this process alone
    async with calls.held():                           # CallLockError after `timeout` seconds
        ...
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from ascend_agent.files import open_no_follow

LOCK_FILE = "serialize.lock"
# Under the kubelet's 45 s for a DRA call, so that the claim's own error reaches it.
DEFAULT_TIMEOUT = 30.0
_FIRST_WAIT = 0.005
_LONGEST_WAIT = 0.1


class CallLockError(Exception):
    """The lock file cannot be opened, or the other instance held it too long; the message names it."""


class CallLock:
    def __init__(self, path: Path | None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.path = path
        self.timeout = timeout
        self._local = anyio.Lock()

    @property
    def shared(self) -> bool:
        """Whether another instance of the driver may act between two calls of this one."""
        return self.path is not None

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        async with self._local:
            if self.path is None:
                yield
                return
            descriptor = await self._take(self.path)
            try:
                yield
            finally:
                os.close(descriptor)  # releases the flock

    async def _take(self, path: Path) -> int:
        try:
            descriptor = await anyio.to_thread.run_sync(
                open_no_follow, path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o600
            )
        except OSError as exc:
            raise CallLockError(
                f"cannot open {path}, the lock shared with the driver's other instance: {exc.strerror or exc}"
            ) from None
        wait = _FIRST_WAIT
        try:
            with anyio.fail_after(self.timeout):
                while True:
                    try:
                        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        return descriptor
                    except OSError as exc:
                        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                            raise CallLockError(f"cannot lock {path}: {exc.strerror or exc}") from None
                    await anyio.sleep(wait)
                    wait = min(wait * 2, _LONGEST_WAIT)
        except TimeoutError:
            os.close(descriptor)
            raise CallLockError(
                f"another instance of the driver has held {path} for over {self.timeout:g} s; "
                "the kubelet retries"
            ) from None
        except BaseException:
            os.close(descriptor)
            raise
