"""``make run``'s walk-through (examples/run-local.sh): Ctrl-C ends it with exit 0 and no scratch directory
left behind."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import threading

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
