"""SIGTERM while the agent is still starting: it stops and exits 0, as documented, instead of dying by the
signal. The start is held at a known point by a config file that is a FIFO: the agent reads it, and blocks,
until the test writes the config into it."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.kubelet_standin import KubeletStandin


def _catches(pid: int, signum: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    return False


def _catches_sigterm(pid: int) -> bool:
    return _catches(pid, signal.SIGTERM)


def _script() -> str:
    """The installed ``ascend-agent`` command beside this interpreter."""
    path = Path(sys.executable).parent / "ascend-agent"
    return str(path) if path.exists() else shutil.which("ascend-agent") or "ascend-agent"


def _wait_reader(fifo: Path, process: subprocess.Popen[str]) -> int:
    """A descriptor writing to ``fifo`` once ``process`` has it open for reading."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        assert process.poll() is None, "the process ended before it was held"
        assert time.monotonic() < deadline, "the process never reached the held import"
        time.sleep(0.01)


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


def _release_expecting_0(agent: subprocess.Popen[str], start: int) -> None:
    """Let the held start go on: the agent, which has a stop signal waiting, exits 0 without a traceback."""
    os.write(start, b"")
    os.close(start)
    output, _ = agent.communicate(timeout=20)
    assert agent.returncode == 0, output
    assert "Traceback" not in output


def _kill(agent: subprocess.Popen[str]) -> None:
    if agent.poll() is None:
        agent.kill()
        agent.wait(5)


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
        # A comment: two writes that one read takes in together still make a valid file.
        threading.Thread(target=_feed, args=(config, b"# the config\n", agent), daemon=True).start()
        assert agent.proc.wait(10) == 0, agent.output
    finally:
        agent.close()


_HOLD = """\
import sys
with open({fifo!r}, "rb") as held:  # the test holds the start here, before the command line is imported
    held.read()
sys.path.remove({directory!r})
del sys.modules["click"]
import click  # the real one takes this module's place
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("command", ["python -m", "script"])
def test_a_signal_before_the_command_line_is_imported_exits_0(
    short_dir: Path, signum: signal.Signals, command: str
) -> None:
    """The first thing ``run`` does is catch SIGTERM and SIGINT: the start is held at the first import of the
    command line's libraries (click), before which nothing else is imported."""
    held = short_dir / "held"
    held.mkdir()
    fifo = short_dir / "start"
    os.mkfifo(fifo)
    (held / "click.py").write_text(_HOLD.format(fifo=str(fifo), directory=str(held)))
    entry = [sys.executable, "-m", "ascend_agent"] if command == "python -m" else [_script()]
    agent = subprocess.Popen(
        [
            *entry,
            "run",
            "--backend",
            "fake",
            "--kubelet-dir",
            str(short_dir / "kubelet"),
            "--metrics-address",
            "",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(held)},
    )
    try:
        start = _wait_reader(fifo, agent)
        assert _catches(agent.pid, signum), "the signal is not caught before the command line is imported"
        agent.send_signal(signum)
        _release_expecting_0(agent, start)
    finally:
        _kill(agent)


def test_signals_while_stopping_do_not_cut_the_stop_short(kubelet: KubeletStandin) -> None:
    """Ctrl-C in a terminal, then a script's clean-up sending SIGTERM: the agent still removes its socket and
    exits 0."""
    agent = fake_agent(kubelet.directory)
    try:
        kubelet.wait_registrations(1)
        signals = itertools.cycle([signal.SIGINT, signal.SIGTERM])
        while agent.proc.poll() is None:  # one signal a millisecond until the agent has exited
            agent.proc.send_signal(next(signals))
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.proc.wait(0.001)
        assert agent.proc.returncode == 0, agent.output
        assert not kubelet.plugin_socket().exists()
    finally:
        agent.close()


_HOLD_RUNNER = """\
import os
marker = {marker!r}
if os.path.exists(marker):  # the second interpreter: the runner the command line execs
    with open({fifo!r}, "rb") as held:
        held.read()
else:
    open(marker, "w").close()
"""


def _blocks(pid: int, signum: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_hand_over_to_the_runner_waits_for_it_and_exits_0(
    short_dir: Path, signum: signal.Signals
) -> None:
    """The command line execs the runner with SIGTERM and SIGINT blocked: one sent before the runner's own
    handler is in place (here while its interpreter starts, held in ``sitecustomize``) waits, and then stops
    the agent with status 0."""
    held = short_dir / "held"
    held.mkdir()
    fifo = short_dir / "start"
    os.mkfifo(fifo)
    hold = _HOLD_RUNNER.format(marker=str(short_dir / "command-line-started"), fifo=str(fifo))
    (held / "sitecustomize.py").write_text(hold)
    agent = subprocess.Popen(
        [sys.executable, "-m", "ascend_agent", "run", "--backend", "fake",
         "--kubelet-dir", str(short_dir / "kubelet"), "--metrics-address", ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(held)},
    )  # fmt: skip
    try:
        start = _wait_reader(fifo, agent)
        assert _blocks(agent.pid, signum), "the runner starts with the signal deliverable"
        agent.send_signal(signum)
        assert agent.poll() is None, "the signal killed the runner while it started"
        _release_expecting_0(agent, start)
    finally:
        _kill(agent)
