"""What a hostile client costs the agent: the agent process's resident memory before and after 100,000
HTTP/2 rapid resets (HEADERS then RST_STREAM at once) on its DevicePlugin socket, reconnecting whenever the
agent ends a connection; and the time until a 1 MiB GetInfo on the plugin-watcher registration socket is
answered, with the slowest /healthz answer meanwhile. ``--quick``: 10,000 resets.

On the HTTP endpoint (127.0.0.1 only): the agent's peak resident memory and CPU time while 200 connections
send endless header lines (reconnecting when ended), with the /healthz probes meanwhile; and the log lines it
wrote while 3,000 connections are opened and held idle against an agent allowed 1,024 descriptors.
``--http``: those rows only.

Run from another checkout's directory (this file copied into its bench/) to measure that checkout's agent.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import resource
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import h2.errors

from bench._common import AgentProcess, Row, quick, report
from tests.support.h2_client import RawGrpcClient, grpc_message, request_headers

ALLOCATE = "/v1beta1.DevicePlugin/Allocate"
GET_INFO = "/pluginregistration.Registration/GetInfo"
_BATCH = 100


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


_FLOOD_CONNECTIONS = 200
_IDLE_CONNECTIONS = 3000
_AGENT_DESCRIPTORS = 1024
_HEADER_LINES = b"X-Flood: " + b"a" * 119 + b"\r\n"


def _start(kubelet_dir: Path, registry: Path, port: int, descriptors: int | None = None) -> AgentProcess:
    """The agent; with ``descriptors``, allowed that many open files (this process keeps its own limit)."""
    if descriptors is None:
        return _spawn(kubelet_dir, registry, port)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, hard))
    try:
        return _spawn(kubelet_dir, registry, port)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _spawn(kubelet_dir: Path, registry: Path, port: int) -> AgentProcess:
    agent = AgentProcess(
        [
            "run",
            "--backend",
            "fake",
            "--kubelet-dir",
            str(kubelet_dir),
            "--registration",
            "plugin-watcher",
            "--plugins-registry-dir",
            str(registry),
            "--plugin-dir",
            str(kubelet_dir.parent / "plugin"),
            "--metrics-address",
            f"127.0.0.1:{port}",
        ]
    )
    agent.wait_log(r"Serving /metrics")
    return agent


async def _wait_socket(path: Path) -> None:
    deadline = time.monotonic() + 20
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} never appeared")
        await asyncio.sleep(0.05)


async def _allocate(path: Path) -> None:
    inner = b"\x0a\x0bAscend910-0"
    client = await RawGrpcClient.connect(str(path))
    try:
        stream_id = client.request(ALLOCATE)
        await client.send_bodies({stream_id: grpc_message(b"\x0a" + bytes([len(inner)]) + inner)})
        await asyncio.wait_for(client.wait_answers([stream_id]), 30)
    finally:
        client.close()


async def _resets(path: Path, total: int) -> tuple[int, float]:
    """Send ``total`` rapid resets; (connections used, seconds)."""
    sent, connections, start = 0, 0, time.monotonic()
    while sent < total:
        client = await RawGrpcClient.connect(str(path))
        connections += 1
        try:
            while sent < total and not client.closed:
                for _ in range(_BATCH):
                    stream_id = client._conn.get_next_available_stream_id()
                    client._conn.send_headers(stream_id, request_headers(ALLOCATE))
                    client._conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                sent += _BATCH
                client._flush()
                await client._writer.drain()
                while True:  # take in what the agent said (a GOAWAY), without waiting for more
                    try:
                        await asyncio.wait_for(client._receive(), 0.001)
                    except TimeoutError:
                        break
        except (ConnectionError, OSError):
            pass
        finally:
            client.close()
    return connections, time.monotonic() - start


def _healthz_worst(port: int, stop: threading.Event) -> tuple[list[float], threading.Thread]:
    """/healthz asked in a loop until ``stop``: each answer's time, and the thread (join it to have the
    answer that was pending when ``stop`` was set)."""
    worst: list[float] = []

    def probe() -> None:
        while not stop.is_set():
            start = time.monotonic()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                connection.request("GET", "/healthz")
                connection.getresponse().read()
            except OSError:  # the agent stopping at the end
                return
            finally:
                connection.close()
            worst.append(time.monotonic() - start)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    return worst, thread


async def _big_get_info(registry: Path) -> float:
    client = await RawGrpcClient.connect(str(registry / "huawei.com_Ascend910.sock"))
    try:
        stream_id = client.request(GET_INFO)
        start = time.monotonic()
        await asyncio.wait_for(client.send_bodies({stream_id: grpc_message(b"\x78\x01" * (512 * 1024))}), 120)
        await asyncio.wait_for(client.wait_answers([stream_id]), 120)
        return time.monotonic() - start
    except ConnectionError:
        return time.monotonic() - start
    finally:
        client.close()


def _cpu_seconds(agent: AgentProcess) -> float:
    """User and system CPU time the agent process has used."""
    fields = Path(f"/proc/{agent.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _probes(port: int, stop: threading.Event) -> tuple[list[float], list[int], threading.Thread]:
    """/healthz asked in a loop until ``stop``: each answer's time, the count of probes that got no answer,
    and the thread (join it to have the probe that was under way when ``stop`` was set)."""
    answered: list[float] = []
    failed = [0]

    def probe() -> None:
        while not stop.is_set():
            start = time.monotonic()
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                connection.request("GET", "/healthz")
                if connection.getresponse().status == 200:
                    answered.append(time.monotonic() - start)
                    continue
            except OSError:
                pass
            finally:
                connection.close()
            failed[0] += 1

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    return answered, failed, thread


async def _header_flood(port: int, seconds: float, agent: AgentProcess) -> tuple[int, float]:
    """``_FLOOD_CONNECTIONS`` connections send a request line, then header lines for ``seconds``, each
    reconnecting when the agent ends it: (connections made, the agent's peak RSS in MiB)."""
    deadline = time.monotonic() + seconds
    made = 0
    chunk = _HEADER_LINES * 512  # 64 KiB

    async def flood() -> None:
        nonlocal made
        while time.monotonic() < deadline:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1)
            except (OSError, TimeoutError):
                continue
            made += 1
            try:
                writer.write(b"GET /metrics HTTP/1.0\r\n")
                while time.monotonic() < deadline:
                    writer.write(chunk)
                    await asyncio.wait_for(writer.drain(), max(0.01, deadline - time.monotonic()))
            except (OSError, TimeoutError):
                pass
            finally:
                writer.transport.abort()

    async def sample() -> float:
        peak = 0.0
        while time.monotonic() < deadline:
            peak = max(peak, agent.rss_kib() / 1024)
            await asyncio.sleep(0.1)
        return peak

    sampler = asyncio.ensure_future(sample())
    await asyncio.gather(*(flood() for _ in range(_FLOOD_CONNECTIONS)))
    return made, await sampler


async def _idle_flood(port: int, hold: float) -> int:
    """Open ``_IDLE_CONNECTIONS`` connections and hold them ``hold`` seconds without a byte: how many were
    made."""
    writers: list[asyncio.StreamWriter] = []
    for _ in range(_IDLE_CONNECTIONS):
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 0.5)
        except (OSError, TimeoutError):
            continue
        writers.append(writer)
    await asyncio.sleep(hold)
    for writer in writers:
        writer.transport.abort()
    return len(writers)


async def _http_rows(root: Path) -> list[Row]:
    seconds = 5.0 if quick() else 20.0
    rows = []
    port = _free_port()
    agent = _start(root / "kubelet", root / "registry", port)
    try:
        agent.wait_log("Cannot tell which pod holds which chip")  # the last line of its start
        before, cpu = agent.rss_kib() / 1024, _cpu_seconds(agent)
        stop = threading.Event()
        answered, failed, probing = _probes(port, stop)
        made, peak = await _header_flood(port, seconds, agent)
        stop.set()
        probing.join(60)
        cpu = _cpu_seconds(agent) - cpu
        flood = f"{_FLOOD_CONNECTIONS} connections sending headers for {seconds:g} s"
        rows.append(Row("RSS before the header flood", before, None, "MB"))
        rows.append(Row(f"peak RSS, {flood}", peak, None, "MB"))
        rows.append(Row("connections the flood made", made, None, ""))
        rows.append(Row("agent CPU meanwhile", cpu, None, "s"))
        rows.append(Row("slowest /healthz meanwhile", max(answered, default=0.0) * 1000, None, "ms"))
        rows.append(Row(f"/healthz without an answer, of {len(answered) + failed[0]}", failed[0], None, ""))
    finally:
        agent.close()
    port = _free_port()
    agent = _start(root / "kubelet", root / "registry", port, descriptors=_AGENT_DESCRIPTORS)
    try:
        agent.wait_log("Cannot tell which pod holds which chip")
        lines = len(agent.lines)
        made = await _idle_flood(port, 8.0)
        written = len(agent.lines) - lines
        answer = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            answer.request("GET", "/healthz")
            healthz = answer.getresponse().status
        finally:
            answer.close()
        rows.append(
            Row(
                f"log lines, {made} idle connections held 8 s ({_AGENT_DESCRIPTORS} descriptors)",
                written,
                None,
                "lines",
                "< 5",
                written < 5,
            )
        )
        rows.append(Row("/healthz status after them", healthz, None, "", "200", healthz == 200))
    finally:
        agent.close()
    return rows


async def _main() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="bench-h-", dir="/tmp"))
    (root / "kubelet").mkdir()
    (root / "registry").mkdir()
    if "--http" in sys.argv:
        return await _http_rows(root)
    total = 10_000 if quick() else 100_000
    kubelet_dir, registry = root / "kubelet", root / "registry"
    port = _free_port()
    agent = _start(kubelet_dir, registry, port)
    rows = []
    try:
        plugin = root / "plugin" / "Ascend910.sock"
        await _wait_socket(plugin)
        await _wait_socket(registry / "huawei.com_Ascend910.sock")
        await _allocate(plugin)
        before = agent.rss_kib() / 1024
        connections, seconds = await _resets(plugin, total)
        await _allocate(plugin)
        after = agent.rss_kib() / 1024
        rows.append(Row(f"RSS before {total} rapid resets", before, None, "MB"))
        rows.append(
            Row(
                f"RSS after them ({connections} connections)",
                after,
                None,
                "MB",
                "before + 10",
                after - before <= 10,
            )
        )
        rows.append(Row("the reset flood took", seconds, None, "s"))
        stop = threading.Event()
        worst, probing = _healthz_worst(port, stop)
        refused = await _big_get_info(registry)
        stop.set()
        probing.join(60)
        rows.append(
            Row(
                "1 MiB GetInfo (registration socket) answered",
                refused * 1000,
                None,
                "ms",
                "< 50",
                refused < 0.05,
            )
        )
        rows.append(Row("slowest /healthz meanwhile", max(worst, default=0.0) * 1000, None, "ms"))
    finally:
        agent.close()
    return rows + await _http_rows(root)


def main() -> int:
    rows = asyncio.run(_main())
    report("hostile", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
