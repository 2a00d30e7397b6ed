"""The processes a test started, found and ended after it, whoever their parent is by then.

Each test runs with ``ASCEND_TESTS_OWNER=<session>/<test>`` in its environment (the fixtures below, loaded by
tests/conftest.py). Whatever it starts inherits it, and so does whatever those start: a fake npu-smi the agent
runs in a session of its own, a walk-through's jobs, a child handed to PID 1 when its parent was killed.
After each test, what still runs with its mark 5 s later is ended and the test fails naming it; at the end
of a session the same for the session's mark (its fixtures and anything a test missed)::

    left = running(owner_of_this_test())
    assert outliving(left, timeout=10) == []    # each waited for on a pidfd
    end(left)                                    # SIGKILL, and wait until each has exited

A scan reads ``/proc/*/environ``: about 2 ms for a few hundred processes."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

OWNER = "ASCEND_TESTS_OWNER"
# How long a finished test's process may take to exit on its own before it counts as left behind: the tool
# runs of an agent killed at the end of a test (a fake tool the kernel kills with it, one that was answering)
# are still exiting when the test's last fixture returns.
_SETTLE = 5.0


@dataclass(frozen=True)
class Running:
    pid: int
    started: int  # clock ticks after boot (/proc/PID/stat): a recycled pid is another process
    command: str

    def __str__(self) -> str:
        return f"{self.pid} {self.command}"


def owner_of_this_test() -> str:
    """The mark of the test running now."""
    return os.environ[OWNER]


def running(owner: str) -> list[Running]:
    """The processes alive now (zombies are not) whose environment has ``owner``'s mark or one below it
    (``owner/...``); never this one."""
    entry = f"{OWNER}={owner}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            if entry not in environ or not _marked(environ, entry):
                continue
            stat = _stat(int(name))
            command = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if stat[0] not in ("Z", "X"):
            found.append(Running(int(name), int(stat[19]), command.strip()))
    return found


def _marked(environ: bytes, entry: bytes) -> bool:
    return any(v == entry or v.startswith(entry + b"/") for v in environ.split(b"\0"))


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command's name: [0] is the state, [19] the start time."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def outliving(processes: Iterable[Running], timeout: float) -> list[Running]:
    """Those of ``processes`` that have not exited ``timeout`` s from now (one deadline for all)."""
    deadline = time.monotonic() + timeout
    left = []
    for process in processes:
        with _pidfd(process) as descriptor:
            if descriptor is not None and not _exits(descriptor, deadline - time.monotonic()):
                left.append(process)
    return left


def end(processes: Iterable[Running], timeout: float = 10.0) -> None:
    """SIGKILL each of ``processes`` and wait until it has exited; one that is a child of this process is
    reaped (PID 1 reaps the others)."""
    for process in processes:
        with _pidfd(process) as descriptor:
            if descriptor is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(descriptor, signal.SIGKILL)
            _exits(descriptor, timeout)
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PIDFD, descriptor, os.WEXITED | os.WNOHANG)


@contextlib.contextmanager
def _pidfd(process: Running) -> Iterator[int | None]:
    """A pidfd of ``process``; None when it is gone (or its pid now another's)."""
    try:
        descriptor = os.pidfd_open(process.pid)
    except ProcessLookupError:
        yield None
        return
    try:
        try:
            same = int(_stat(process.pid)[19]) == process.started
        except OSError:
            same = False
        yield descriptor if same else None
    finally:
        os.close(descriptor)


def _exits(descriptor: int, timeout: float) -> bool:
    readable, _, _ = select.select([descriptor], [], [], max(timeout, 0))
    return bool(readable)


def _fail_for_what_is_left(owner: str, what: str) -> None:
    left = outliving(running(owner), _SETTLE)
    if left:
        end(left)
        pytest.fail(
            f"{what} left {len(left)} process(es) running, killed now: " + "; ".join(map(str, left)),
            pytrace=False,
        )


@pytest.fixture(scope="session", autouse=True)
def _processes_of_the_session() -> Iterator[str]:
    # A session started by a test (or by anything marked) is below that test's mark: the test owns it too.
    session = "/".join(filter(None, [os.environ.get(OWNER), uuid.uuid4().hex]))
    os.environ[OWNER] = session
    yield session
    _fail_for_what_is_left(session, "the session")


@pytest.fixture(autouse=True)
def _processes_of_the_test(_processes_of_the_session: str) -> Iterator[None]:
    owner = f"{_processes_of_the_session}/{uuid.uuid4().hex[:16]}"
    os.environ[OWNER] = owner
    try:
        yield
    finally:
        os.environ[OWNER] = _processes_of_the_session
    _fail_for_what_is_left(owner, "the test")
