"""``make run``'s walk-through (examples/run-local.sh): Ctrl-C ends it with exit 0 and no scratch directory
left behind."""

from __future__ import annotations

import contextlib
import glob
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time

from tests.support import ROOT

_SCRATCH = "/tmp/ascend-agent-run.*"


def test_ctrl_c_exits_0_and_removes_the_scratch_directory() -> None:
    before = set(glob.glob(_SCRATCH))
    bin_dir = os.path.dirname(sys.executable)
    # A new session stands in for the terminal's process group, which Ctrl-C signals as a whole.
    script = subprocess.Popen(
        [str(ROOT / "examples/run-local.sh")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    registered = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert script.stdout is not None
        for line in script.stdout:
            lines.append(line)
            if "Registered resource" in line:
                registered.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert registered.wait(30), "".join(lines)
        assert set(glob.glob(_SCRATCH)) - before, "the walk-through works in a scratch directory"
        os.killpg(script.pid, signal.SIGINT)
        assert script.wait(15) == 0, "".join(lines)
        reader.join(5)
        assert set(glob.glob(_SCRATCH)) - before == set(), "the scratch directory is left behind"
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait(5)


def _run_in_terminal(argv: list[str], env: dict[str, str], ready: bytes) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal of its own; once it printed ``ready``, type Ctrl-C, which the
    terminal sends to its foreground process group as a real one does: (exit status, what it printed)."""
    pid, terminal = pty.fork()
    if pid == 0:  # the child: exec at once
        os.chdir(ROOT)
        os.execvpe(argv[0], argv, env)
    output = b""
    typed = False
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            readable, _, _ = select.select([terminal], [], [], 1.0)
            if not readable:
                continue
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # EIO: every process on the terminal has closed it
                break
            if not chunk:
                break
            output += chunk
            if not typed and ready in output:
                os.write(terminal, b"\x03")
                typed = True
        assert typed, output.decode(errors="replace")
    finally:
        os.close(terminal)
    return _wait_exit(pid, 15.0), output.decode(errors="replace")


def _wait_exit(pid: int, timeout: float) -> int:
    """The exit status of child ``pid``; its process group is killed when it has not exited in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"make run did not exit within {timeout} s of Ctrl-C")


def test_make_run_on_a_terminal_ends_with_ctrl_c_and_exit_0() -> None:
    before = set(glob.glob(_SCRATCH))
    prefix = sys.prefix
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    # This interpreter's environment, taken as installed: make installs nothing.
    argv = ["make", "--no-print-directory", "-o", f"{prefix}/.run-stamp", "run", f"VENV={prefix}"]
    status, output = _run_in_terminal(argv, env, b"kubelet-sim:   Allocate")
    assert status == 0, output
    assert "Interrupt" not in output
    assert "Stopped; sockets removed" in output
    assert set(glob.glob(_SCRATCH)) - before == set(), "the scratch directory is left behind"
