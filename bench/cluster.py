"""What the cluster side costs and that the kubelet path does not wait for it: start -> registered and
resident memory (16 fake chips) with the cluster side off and on, and registration and Allocate with the API
server plain and hanging (every request held 30 s), measured once the cluster side is loaded. The API server
is the tests' emulator (kmock) on loopback, reached through a kubeconfig."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench._common import KubeletStandin, Row, grpc_api, kubelet, quick, report, start_agent, stats
from tests.support.apiserver import ApiServer

NODE = "bench-node"
MODES = ("off", "on", "on, API hanging 30 s")
CHIPS = 16
# Resident memory after registration with CHIPS chips: the targets with the cluster side off and on.
RSS_TARGET_MIB = {"off": 32.0, "on": 40.0}


@contextmanager
def _apiserver(mode: str) -> Iterator[tuple[list[str], ApiServer | None]]:
    """The agent's cluster flags for ``mode``, with an API server behind them while it is on."""
    if mode == "off":
        yield ["--no-cluster"], None
        return
    server = ApiServer(Path(tempfile.mkdtemp(prefix="bench-api-", dir="/tmp")))
    server.start()
    server.put("nodes", {"metadata": {"name": NODE}})
    if "hanging" in mode:
        server.fail("hang", seconds=30)
    try:
        yield ["--kubeconfig", str(server.kubeconfig), "--node-name", NODE], server
    finally:
        server.stop()


def _allocate(standin: KubeletStandin, calls: int) -> list[float]:
    channel, stub = standin.plugin_stub()
    request = standin.pb.AllocateRequest(
        container_requests=[standin.pb.ContainerAllocateRequest(devices_ids=["Ascend910-0"])]
    )
    samples = []
    with channel:
        for _ in range(calls // 10):
            stub.Allocate(request)
        for _ in range(calls):
            started = time.perf_counter()
            stub.Allocate(request)
            samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    api = grpc_api()
    rows: list[Row] = []
    results: dict[str, Any] = {}
    runs, calls = (5, 300) if quick() else (10, 1000)
    for mode in MODES:
        starts, rss, allocates = [], [], []
        with _apiserver(mode) as (flags, server), kubelet(api) as standin:
            for _ in range(runs):
                if server is not None:
                    server.put("nodes", {"metadata": {"name": NODE}})  # each start has labels to write
                count = len(standin.registrations)
                started = time.monotonic()
                agent = start_agent(standin.directory, "--fake-chips", str(CHIPS), *flags)
                try:
                    standin.wait_registrations(count + 1)
                    starts.append(standin.registrations[count].at - started)
                    standin.wait_update(lambda u: len(u.devices) == CHIPS, after=len(standin.updates) - 1)
                    if mode == "on":
                        agent.wait_log("Node bench-node labels: ")  # the client is loaded and has written
                    elif server is not None:
                        agent.wait_log("Cluster side on: ")  # loaded; its first requests hang
                    rss.append(agent.rss_kib() / 1024)
                    allocates.extend(_allocate(standin, calls // runs))
                finally:
                    agent.close()
        median, p99 = stats(starts)
        rows.append(Row(f"start -> registered, cluster side {mode}", median * 1e3, p99 * 1e3, "ms"))
        target = RSS_TARGET_MIB.get(mode)
        median_rss = stats(rss)[0]
        rows.append(
            Row(
                f"RSS after registration, {CHIPS} chips, cluster side {mode}",
                median_rss,
                None,
                "MiB",
                "" if target is None else f"<= {target:g}",
                None if target is None else median_rss <= target,
            )
        )
        median, p99 = stats(allocates)
        rows.append(Row(f"Allocate 1 chip, cluster side {mode}", median * 1e3, p99 * 1e3, "ms"))
        results[mode] = {"starts": starts, "rss": rss}
    report("cluster", rows, {"samples": results})


if __name__ == "__main__":
    main()
