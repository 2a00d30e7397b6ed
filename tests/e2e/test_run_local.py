"""``make run``'s and ``make run-dra``'s walk-throughs (examples/run-local.sh, examples/dra/run-local.py):
Ctrl-C ends them with exit 0 and no scratch directory left behind."""

from __future__ import annotations

import contextlib
import glob
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.support import ROOT

_SCRATCH = "/tmp/ascend-agent-run.*"
_DRA_SCRATCH = "/tmp/ascend-agent-dra.*"


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


@pytest.mark.parametrize(
    ("target", "scratch", "ready"),
    [
        ("run", _SCRATCH, b"kubelet-sim:   Allocate"),
        ("run-dra", _DRA_SCRATCH, b">> NodeWatchResources"),
    ],
)
def test_make_on_a_terminal_ends_with_ctrl_c_and_exit_0(target: str, scratch: str, ready: bytes) -> None:
    before = set(glob.glob(scratch))
    prefix = sys.prefix
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    # This interpreter's environment, taken as installed: make installs nothing.
    stamps = [f"-o{prefix}/.run-stamp", f"-o{prefix}/.installed-stamp"]
    argv = ["make", "--no-print-directory", *stamps, target, f"VENV={prefix}"]
    status, output = _run_in_terminal(argv, env, ready)
    assert status == 0, output
    assert "Interrupt" not in output
    assert "Traceback" not in output
    assert set(glob.glob(scratch)) - before == set(), "the scratch directory is left behind"


def test_the_dra_walk_through_shows_the_driver_s_answers_and_sigterm_ends_it() -> None:
    """It prepares claims of devices the driver published (a whole 310P3, a vir04 carved from the dynamic
    chip) and one of a device the node lacks, and prints each answer as the driver gave it, the error too
    (it printed "NodePrepareResources: []" for a claim the driver refused)."""
    before = set(glob.glob(_DRA_SCRATCH))
    walk = subprocess.Popen(
        [sys.executable, str(ROOT / "examples/dra/run-local.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    watching = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert walk.stdout is not None
        for line in walk.stdout:
            lines.append(line)
            if line.startswith(">> NodeWatchResources"):
                watching.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert watching.wait(60), "".join(lines)
        said = "".join(lines)
        uid = "[0-9a-f-]{36}"
        assert re.search(rf">> NodePrepareResources train: \['npu\.huawei\.com/claim={uid}-npu-0'\]", said), (
            said
        )
        carved = rf">> NodePrepareResources infer: \['npu\.huawei\.com/claim={uid}-npu-1-vir04-0'\]"
        assert re.search(carved, said), said
        refused = "device npu-7 of ResourceClaim default/elsewhere is not on this node"
        assert f">> NodePrepareResources elsewhere: error: {refused}" in said
        assert ">> counter set npu-1 (a dynamic chip): ai-cores 8, memory 24Gi, ai-cpus 7" in said
        assert "ASCEND_RUNTIME_OPTIONS=VIRTUAL" in said  # the carved vNPU's CDI spec
        os.killpg(walk.pid, signal.SIGTERM)
        assert walk.wait(30) == 0, "".join(lines)
        reader.join(5)
        assert set(glob.glob(_DRA_SCRATCH)) - before == set(), "the scratch directory is left behind"
    finally:
        if walk.poll() is None:
            os.killpg(walk.pid, signal.SIGKILL)
            walk.wait(5)
