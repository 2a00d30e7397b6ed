"""A test that leaves a process running fails, and the process is ended: here a pytest session of its own
whose test starts ``sleep`` in the background of a shell that exits, so that PID 1 becomes its parent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT
from tests.support.processes import outliving, owner_of_this_test, running

_TESTS = """\
import subprocess


def test_leaves_a_sleep() -> None:
    subprocess.run(["sh", "-c", "sleep 600 >/dev/null 2>&1 &"], check=True)


def test_leaves_nothing() -> None:
    subprocess.run(["true"], check=True)
"""


# The sleep is certain to stay: no need to give it the seconds a process may take to go by itself.
_CONFTEST = """\
import tests.support.processes

tests.support.processes._SETTLE = 0.1
"""


def test_a_process_left_running_fails_its_test_and_is_ended(short_dir: Path) -> None:
    (short_dir / "test_leaving.py").write_text(_TESTS)
    (short_dir / "conftest.py").write_text(_CONFTEST)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.processes", "-p", "no:cacheprovider",
         "-o", "addopts=", "test_leaving.py"],
        cwd=short_dir, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 passed, 1 error" in result.stdout, result.stdout
    # The report's own line; the short summary repeats it in full when pytest sees CI set in the environment.
    (error,) = [line for line in result.stdout.splitlines() if line.startswith("the test left")]
    assert error.startswith("the test left 1 process(es) running, killed now: "), error
    assert "sleep 600" in error, error
    assert outliving(running(owner_of_this_test()), timeout=10) == [], "the sleep outlived its session"
