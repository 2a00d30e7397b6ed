"""What a client of the HTTP endpoint (/metrics, /healthz, /readyz) can make the agent hold: a request head of
at most 8 KiB, at most 64 connections (a new one ends the oldest), and, when descriptors run out anyway, one
log line instead of a traceback per connection refused."""

from __future__ import annotations

import resource
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.support.agent_process import AgentProcess
from tests.support.http_probe import free_port, wait_answer

_PROBLEMS = ("Traceback", "Logging error", "out of system resource")


@contextmanager
def _descriptor_limit(most: int) -> Iterator[None]:
    """Processes started inside may open at most ``most`` files; this one gets its own limit back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (most, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextmanager
def _agent(short_dir: Path, port: int, descriptors: int | None = None) -> Iterator[AgentProcess]:
    directory = short_dir / "k"
    directory.mkdir(exist_ok=True)
    args = [
        "run",
        "--backend",
        "fake",
        "--kubelet-dir",
        str(directory),
        "--metrics-address",
        f"127.0.0.1:{port}",
    ]
    with ExitStack() as limits:
        if descriptors is not None:
            limits.enter_context(_descriptor_limit(descriptors))
        process = AgentProcess(args)
    try:
        process.wait_log("Serving /metrics")
        yield process
    finally:
        process.close()


def _idle_connections(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]


def _read_all(connection: socket.socket) -> bytes:
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


def test_a_request_head_over_8_kib_is_refused(short_dir: Path) -> None:
    port = free_port()
    with _agent(short_dir, port), socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        headers = b"X-Padding: " + b"a" * 100 + b"\r\n"
        connection.sendall(b"GET /healthz HTTP/1.0\r\n" + headers * 110 + b"\r\n")  # 12 KiB
        answer = _read_all(connection)
    assert answer.startswith(b"HTTP/1.0 431 Request Header Fields Too Large\r\n")
    assert answer.endswith(b"\r\n\r\nrequest head over 8192 bytes\n")


def test_idle_connections_beyond_64_end_the_oldest(short_dir: Path) -> None:
    port = free_port()
    with _agent(short_dir, port, descriptors=256) as process:
        opened = _idle_connections(port, 300)
        try:
            oldest = opened[0]
            assert oldest.recv(100) == b"", "the oldest idle connection is ended without an answer"
            assert wait_answer(port, "/healthz", lambda status, _: status is not None) == (200, "ok\n")
        finally:
            for connection in opened:
                connection.close()
        assert [line for line in process.lines if any(problem in line for problem in _PROBLEMS)] == []


def test_descriptors_running_out_is_one_line(short_dir: Path) -> None:
    port = free_port()
    with _agent(short_dir, port, descriptors=32) as process:
        opened = _idle_connections(port, 100)  # those the agent cannot accept wait in the listen queue
        try:
            process.wait_log(f"Cannot accept connections on 127.0.0.1:{port}: Too many open files")
        finally:
            for connection in opened:
                connection.close()
        assert wait_answer(port, "/healthz", lambda status, _: status == 200) == (200, "ok\n")
        assert len(process.matching("Cannot accept connections")) == 1
        assert [line for line in process.lines if any(problem in line for problem in _PROBLEMS)] == []
