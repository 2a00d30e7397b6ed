"""``ascend-agent`` run once as a real process, its output captured."""

from __future__ import annotations

import os
import subprocess
import sys


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """``python -m ascend_agent ARGS`` with ``env`` over this process's environment and no standard input."""
    return subprocess.run(
        [sys.executable, "-m", "ascend_agent", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )
