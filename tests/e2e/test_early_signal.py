"""SIGTERM while the agent is still starting: it stops and exits 0, as documented, instead of dying by the
signal. The start is held at a known point by a config file that is a FIFO: the agent reads it, and blocks,
until the test writes the config into it."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from pathlib import Path

from tests.support.agent_process import AgentProcess


def _catches_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def _feed(fifo: Path, text: bytes, agent: AgentProcess) -> None:
    """Give ``text`` to every read of ``fifo`` until the agent exits."""
    while agent.proc.poll() is None:
        try:
            descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            time.sleep(0.01)
            continue
        try:
            os.write(descriptor, text)
        except BrokenPipeError:  # the reader closed between the open and the write: give it the next one
            pass
        finally:
            os.close(descriptor)


def test_sigterm_while_starting_exits_0(short_dir: Path) -> None:
    config = short_dir / "config.yaml"
    os.mkfifo(config)
    agent = AgentProcess(
        ["run", "--config", str(config), "--backend", "fake", "--kubelet-dir", str(short_dir / "kubelet"),
         "--metrics-address", ""]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not _catches_sigterm(agent.proc.pid):  # the agent is blocked reading the FIFO meanwhile
            assert time.monotonic() < deadline, "SIGTERM is not caught while the agent starts"
            time.sleep(0.01)
        agent.proc.send_signal(signal.SIGTERM)
        threading.Thread(target=_feed, args=(config, b"fakeChips: 2\n", agent), daemon=True).start()
        assert agent.proc.wait(10) == 0, agent.output
    finally:
        agent.close()
