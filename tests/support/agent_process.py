"""The agent as a real process (``python -m ascend_agent``), with its log lines collected as they arrive."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support import PATIENCE


class AgentProcess:
    def __init__(
        self, args: Sequence[str], env: dict[str, str] | None = None, wrapper: Sequence[str] = ()
    ) -> None:
        """``wrapper`` goes before the command, e.g. nsenter to run the agent in a network namespace."""
        self.args = [*wrapper, sys.executable, "-m", "ascend_agent", *args]
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_log(self, pattern: str, timeout: float = PATIENCE, count: int = 1) -> list[str]:
        """Wait until ``count`` lines match ``pattern`` (a regex); fail with the log so far."""
        regex = re.compile(pattern)
        found: list[str] = []

        def check() -> bool:
            found[:] = [line for line in self.lines if regex.search(line)]
            return len(found) >= count or self.proc.poll() is not None

        with self._cond:
            self._cond.wait_for(check, timeout)
        if len(found) < count:
            raise AssertionError(
                f"no {count} log line(s) matching {pattern!r}; log:\n" + "\n".join(self.lines)
            )
        return found

    def matching(self, pattern: str) -> list[str]:
        regex = re.compile(pattern)
        with self._cond:
            return [line for line in self.lines if regex.search(line)]

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 5.0) -> tuple[int, float]:
        """Send ``sig`` and wait: (exit status, seconds until it exited)."""
        start = time.monotonic()
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        return code, time.monotonic() - start

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(5)

    def rss_kib(self) -> int:
        """The process's resident memory now, in KiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError(f"no VmRSS for process {self.proc.pid}")

    def open_fds(self) -> int:
        """How many file descriptors the process has open now."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)


def fake_agent(kubelet_dir: Path, *extra: str, env: dict[str, str] | None = None) -> AgentProcess:
    return AgentProcess(
        ["run", "--backend", "fake", "--kubelet-dir", str(kubelet_dir), "--metrics-address", "", *extra],
        env=env,
    )
