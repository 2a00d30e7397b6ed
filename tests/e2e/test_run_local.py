"""``make run``'s and ``make run-dra``'s walk-throughs (examples/run-local.sh, examples/dra/run-local.py):
Ctrl-C ends them with exit 0, nothing of theirs left running and no scratch directory left behind. Each
walk-through's scratch directory is the one its output names (tests of this file may run at once)."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.processes import end, outliving, owner_of_this_test, running

_SCRATCH = r"/tmp/ascend-agent-run\.\w+"
_DRA_SCRATCH = r"/tmp/ascend-agent-dra\.\w+"


def _scratch(output: str, pattern: str) -> Path:
    """The one scratch directory ``output`` names."""
    (named,) = set(re.findall(pattern, output))
    return Path(named)


def test_ctrl_c_exits_0_and_removes_the_scratch_directory() -> None:
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
        scratch = _scratch("".join(lines), _SCRATCH)
        assert scratch.is_dir(), "the walk-through works in a scratch directory"
        os.killpg(script.pid, signal.SIGINT)
        assert script.wait(15) == 0, "".join(lines)
        reader.join(5)
        assert not scratch.exists(), "the scratch directory is left behind"
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait(5)


def _run_in_terminal(argv: list[str], env: dict[str, str], ready: bytes) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal of its own; once it printed ``ready``, type Ctrl-C, which the
    terminal sends to its foreground process group as a real one does: (exit status, what it printed
    until it exited). Killed with its process group when it has not exited 30 s after Ctrl-C."""
    pid, terminal = pty.fork()
    if pid == 0:  # the child: exec at once
        os.chdir(ROOT)
        os.execvpe(argv[0], argv, env)
    exited = os.pidfd_open(pid)
    output = b""
    typed = False
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            readable, _, _ = select.select([terminal, exited], [], [], 1.0)
            chunk = _read(terminal) if terminal in readable else b""
            output += chunk
            if not typed and ready in output:
                os.write(terminal, b"\x03")
                typed = True
                deadline = time.monotonic() + 30
            if exited in readable or (terminal in readable and not chunk):
                while chunk := _read(terminal, wait=0.5):  # what it printed last, still in the terminal
                    output += chunk
                break
        assert typed, output.decode(errors="replace")
    finally:
        os.close(terminal)
        os.close(exited)
    return _wait_exit(pid, 15.0), output.decode(errors="replace")


def _read(terminal: int, wait: float = 0.0) -> bytes:
    """What the terminal has to read within ``wait`` s; b"" at its end (EIO: no process has it open)."""
    readable, _, _ = select.select([terminal], [], [], wait)
    if not readable:
        return b""
    try:
        return os.read(terminal, 65536)
    except OSError:
        return b""


def _wait_exit(pid: int, timeout: float) -> int:
    """The exit status of child ``pid``; its process group is killed when it has not exited in time."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        return _exit_status(pid, timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"make did not exit within {timeout} s of Ctrl-C")


def _exit_status(pid: int, timeout: float) -> int:
    """Wait for child ``pid`` (on its pidfd) and reap it: its exit status."""
    descriptor = os.pidfd_open(pid)
    try:
        readable, _, _ = select.select([descriptor], [], [], timeout)
    finally:
        os.close(descriptor)
    if not readable:
        raise subprocess.TimeoutExpired(str(pid), timeout)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _make(target: str) -> list[str]:
    """``make target`` with this interpreter's environment taken as installed: make installs nothing."""
    prefix = sys.prefix
    stamps = [f"-o{prefix}/.run-stamp", f"-o{prefix}/.installed-stamp"]
    return ["make", "--no-print-directory", *stamps, target, f"VENV={prefix}"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}


@pytest.mark.parametrize(
    ("target", "scratch", "ready"),
    [
        ("run", _SCRATCH, b"kubelet-sim:   Allocate"),
        ("run-dra", _DRA_SCRATCH, b">> NodeWatchResources"),
    ],
    ids=["run", "run-dra"],
)
def test_make_on_a_terminal_ends_with_ctrl_c_and_exit_0(target: str, scratch: str, ready: bytes) -> None:
    status, output = _run_in_terminal(_make(target), _env(), ready)
    assert status == 0, output
    assert "Interrupt" not in output
    assert "Traceback" not in output
    assert not _scratch(output, scratch).exists(), "the scratch directory is left behind"


@pytest.mark.parametrize("pipe", ["|", "2>&1 |"])
def test_make_run_into_tee_ends_with_ctrl_c_and_leaves_nothing_running(pipe: str, short_dir: Path) -> None:
    """``make run | tee log`` typed into a shell with job control (its own process group, the terminal's
    foreground). With stderr in the pipe too, Ctrl-C ended make, the script and tee, and the agent and
    kubelet-sim ran on under PID 1 beside the scratch directory."""
    log = short_dir / "log"
    line = " ".join([*_make("run"), pipe, "tee", str(log)])
    output = ""
    try:
        status, output = _run_in_terminal(["bash", "--norc", "--noprofile", "-c", f"set -m; {line}"], _env(),
                                          b"kubelet-sim:   Allocate")  # fmt: skip
        assert outliving(running(owner_of_this_test()), timeout=10) == [], output
        assert status == 0, output  # tee's: it was not interrupted
        assert "Stopped; sockets removed" in output, output  # the agent stopped, and said so to the end
        assert "Interrupt" not in output
        assert not _scratch(output, _SCRATCH).exists(), "the scratch directory is left behind"
        assert "kubelet-sim: Register" in log.read_text()
    finally:
        end(running(owner_of_this_test()))
        for named in set(re.findall(_SCRATCH, output)):
            shutil.rmtree(named, ignore_errors=True)


def test_the_dra_walk_through_shows_the_driver_s_answers_and_sigterm_ends_it() -> None:
    """It prepares claims of devices the driver published (a whole 310P3, a vir04 carved from the dynamic
    chip) and one of a device the node lacks, and prints each answer as the driver gave it, the error too
    (it printed "NodePrepareResources: []" for a claim the driver refused)."""
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
        scratch = _scratch(said, _DRA_SCRATCH)
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
        assert not scratch.exists(), "the scratch directory is left behind"
    finally:
        if walk.poll() is None:
            os.killpg(walk.pid, signal.SIGKILL)
            walk.wait(5)
