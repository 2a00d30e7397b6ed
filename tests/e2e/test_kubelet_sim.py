"""``ascend-agent kubelet-sim`` as a process: it needs an explicit directory, never takes over a live or stale
kubelet.sock, deletes no socket it did not create, and still drives the agent through registration."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agent_process import AgentProcess, fake_agent


def _sim(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ascend_agent", "kubelet-sim", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def _listening(path: Path) -> socket.socket:
    """A unix socket at ``path`` that accepts connections, as a running kubelet's or plugin's does."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    return server


def _assert_one_line_exit_2(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("ascend-agent: ")


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for server in held:
        server.close()


def test_the_directory_must_be_given_on_the_command_line(short_dir: Path) -> None:
    # The agent's own variable must not aim the simulator at a node's directory either.
    result = _sim(env={"ASCEND_AGENT_KUBELET_DIR": str(short_dir)})
    _assert_one_line_exit_2(result, "kubelet-sim needs --kubelet-dir DIR")
    assert list(short_dir.iterdir()) == []


def test_a_live_kubelet_is_refused_and_left_alone(short_dir: Path, sockets: list[socket.socket]) -> None:
    kubelet_sock = short_dir / "kubelet.sock"
    plugin_sock = short_dir / "Ascend910.sock"
    sockets += [_listening(kubelet_sock), _listening(plugin_sock)]
    before = {path.name: path.stat().st_ino for path in (kubelet_sock, plugin_sock)}
    result = _sim("--kubelet-dir", str(short_dir))
    _assert_one_line_exit_2(result, "accepts connections: a kubelet is running there")
    assert {path.name: path.stat().st_ino for path in short_dir.iterdir()} == before


def test_a_stale_kubelet_socket_is_refused_not_removed(short_dir: Path) -> None:
    stale = short_dir / "kubelet.sock"
    _listening(stale).close()
    result = _sim("--kubelet-dir", str(short_dir))
    _assert_one_line_exit_2(result, "exists but nothing answers")
    assert stale.is_socket()


def test_a_file_in_the_way_is_refused(short_dir: Path) -> None:
    (short_dir / "kubelet.sock").write_text("not a socket")
    _assert_one_line_exit_2(_sim("--kubelet-dir", str(short_dir)), "exists and is not a socket")


def test_other_sockets_survive_start_and_stop(short_dir: Path, sockets: list[socket.socket]) -> None:
    plugin_sock = short_dir / "Ascend910.sock"
    sockets.append(_listening(plugin_sock))
    stale = short_dir / "old.sock"
    _listening(stale).close()
    sim = AgentProcess(["kubelet-sim", "--kubelet-dir", str(short_dir)])
    try:
        sim.wait_log("listening on .*kubelet.sock")
        assert plugin_sock.is_socket() and stale.is_socket()
        code, _ = sim.terminate(signal.SIGTERM)
    finally:
        sim.close()
    assert code == 0, sim.output
    assert sorted(path.name for path in short_dir.iterdir()) == ["Ascend910.sock", "old.sock"]


def test_a_kubelet_sock_that_replaced_ours_is_kept(short_dir: Path, sockets: list[socket.socket]) -> None:
    kubelet_sock = short_dir / "kubelet.sock"
    sim = AgentProcess(["kubelet-sim", "--kubelet-dir", str(short_dir)])
    try:
        sim.wait_log("listening on .*kubelet.sock")
        kubelet_sock.unlink()
        sockets.append(_listening(kubelet_sock))  # a real kubelet came up meanwhile
        inode = kubelet_sock.stat().st_ino
        code, _ = sim.terminate(signal.SIGTERM)
    finally:
        sim.close()
    assert code == 0, sim.output
    assert kubelet_sock.is_socket() and kubelet_sock.stat().st_ino == inode


def test_the_simulator_drives_the_agent(short_dir: Path) -> None:
    directory = short_dir / "k"
    directory.mkdir()
    sim = AgentProcess(["kubelet-sim", "--kubelet-dir", str(directory), "--allocate", "2"])
    agent: AgentProcess | None = None
    try:
        sim.wait_log("listening on")
        # The simulator makes no plugins directory beside its own: the agent's own directory is named.
        agent = fake_agent(directory, "--plugin-dir", str(short_dir / "agent"))
        sim.wait_log(r"Register huawei.com/Ascend910 at Ascend910.sock")
        sim.wait_log(r"Allocate Ascend910-\d, Ascend910-\d:")
        assert sim.terminate(signal.SIGTERM)[0] == 0
        assert not (directory / "kubelet.sock").exists()
    finally:
        if agent is not None:
            agent.close()
        sim.close()


def test_a_missing_directory_is_refused_not_made(short_dir: Path) -> None:
    missing = short_dir / "not-there"
    result = _sim("--kubelet-dir", str(missing))
    _assert_one_line_exit_2(result, f"--kubelet-dir {missing} does not exist")
    assert not missing.exists()


def test_a_file_given_as_the_directory_is_refused(short_dir: Path) -> None:
    (short_dir / "file").write_text("")
    _assert_one_line_exit_2(_sim("--kubelet-dir", str(short_dir / "file")), "is not a directory")


@contextlib.contextmanager
def _immutable(directory: Path) -> Iterator[None]:
    """Nothing in ``directory`` can be removed meanwhile, not even by root (``chattr +i``)."""
    try:
        subprocess.run(["chattr", "+i", str(directory)], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make {directory} immutable here: {exc}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True, capture_output=True, timeout=10)


def test_a_socket_it_cannot_remove_is_one_line_with_the_next_step(short_dir: Path) -> None:
    directory = short_dir / "k"
    directory.mkdir()
    sim = AgentProcess(["kubelet-sim", "--kubelet-dir", str(directory)])
    try:
        sim.wait_log("listening on .*kubelet.sock")
        with _immutable(directory):
            code, _ = sim.terminate(signal.SIGTERM)
    finally:
        sim.close()
    assert code == 1, sim.output
    assert "Traceback" not in sim.output
    (line,) = [line for line in sim.lines if "kubelet.sock" in line and "listening" not in line]
    assert line == (
        f"kubelet-sim: cannot remove {directory / 'kubelet.sock'}: Operation not permitted; remove it "
        "yourself before the next kubelet-sim there (it refuses a directory that holds a kubelet.sock)"
    )
