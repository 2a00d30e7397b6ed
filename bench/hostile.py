"""What a hostile client costs the agent: the agent process's resident memory before and after 100,000
HTTP/2 rapid resets (HEADERS then RST_STREAM at once) on its DevicePlugin socket, reconnecting whenever the
agent ends a connection; and the time until a 1 MiB GetInfo on the plugin-watcher registration socket is
answered, with the slowest /healthz answer meanwhile. ``--quick``: 10,000 resets.

Run from another checkout's directory (this file copied into its bench/) to measure that checkout's agent.
"""

from __future__ import annotations

import asyncio
import http.client
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


def _start(kubelet_dir: Path, registry: Path, port: int) -> AgentProcess:
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


async def _main() -> list[Row]:
    total = 10_000 if quick() else 100_000
    root = Path(tempfile.mkdtemp(prefix="bench-h-", dir="/tmp"))
    kubelet_dir, registry = root / "kubelet", root / "registry"
    kubelet_dir.mkdir()
    registry.mkdir()
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
    return rows


def main() -> int:
    rows = asyncio.run(_main())
    report("hostile", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
