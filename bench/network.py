"""What reading the chips' network (``hccn_tool -link -g`` and ``-net_health -g`` per chip with a device IP)
adds to each health interval: the devfs backend's ``query()`` in-process, with a fake npu-smi and a fake
hccn_tool (Python scripts) answering the shared samples, on an 8-chip 910B node and a 16-die A3 node. Each
query is timed with the network read and without it (the probe's refresh replaced by nothing), and with the
network read from a ``/bin/sh`` hccn_tool (a tool that starts in about a millisecond, as a compiled one does,
where the Python fake takes tens), over two simulated minutes of 5 s queries after the first: wall time, the
agent's own CPU time and its children's (the tools') CPU time per query."""

from __future__ import annotations

import asyncio
import resource
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ascend_agent.backends.devfs import DevfsBackend
from ascend_agent.config import Settings
from bench._common import Row, quick, report, stats
from bench.training import INTERVAL, Clock, _node

MODES = ("with network", "without network", "with network, sh tool")
# hccn_tool as a shell script: every chip has an address, a link UP and net health Success.
_SH_TOOL = """#!/bin/sh
case "$3" in
-ip) printf 'ipaddr:10.0.%s.11\\nnetmask:255.255.255.0\\n' "$2" ;;
-vnic) printf 'vnic ipaddr: 192.168.2.%s\\n' "$2" ;;
-link) echo 'link status: UP' ;;
-net_health) echo 'net health status: Success' ;;
*) echo 'Get ipconf failed, because no ip was preset there!' >&2; exit 13 ;;
esac
"""


async def _nothing(*_: object) -> None:
    return None


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _measure(root: Path, a3: bool, repetitions: int) -> dict[str, dict[str, list[float]]]:
    host, npu_smi, tool = _node(root, a3)
    settings = Settings(
        backend="devfs", host_root=host.root, npu_smi=str(npu_smi.path), hccn_tool=str(tool.path),
        health_interval=INTERVAL,
    )  # fmt: skip
    sh_tool = root / "sh" / "hccn_tool"
    sh_tool.parent.mkdir()
    sh_tool.write_text(_SH_TOOL)
    sh_tool.chmod(0o755)
    samples: dict[str, dict[str, list[float]]] = {m: {"wall": [], "cpu": [], "tools": []} for m in MODES}
    for _ in range(repetitions):
        for mode in MODES:
            sh = mode.endswith("sh tool")
            backend = DevfsBackend(replace(settings, hccn_tool=str(sh_tool)) if sh else settings)
            clock = Clock()
            backend._training._clock = clock  # the bench's clock: minutes pass without waiting
            if mode == "without network":
                backend._network.refresh = _nothing  # type: ignore[method-assign]
            await backend.query()  # the first query reads every chip's training facts: not an interval's cost
            for _ in range(int(120 / INTERVAL)):
                clock.now += INTERVAL
                wall, cpu, tools = time.perf_counter(), time.process_time(), _children_cpu()
                await backend.query()
                samples[mode]["wall"].append(time.perf_counter() - wall)
                samples[mode]["cpu"].append(time.process_time() - cpu)
                samples[mode]["tools"].append(_children_cpu() - tools)
            if mode != "without network":
                links = [link for _, link, _, _ in backend._network.view()]
                assert links == [True] * (16 if a3 else 8), links
    return samples


def main() -> None:
    repetitions = 1 if quick() else 3
    rows = []
    for a3, label in ((False, "8 x 910B"), (True, "16 A3 dies")):
        root = Path(tempfile.mkdtemp(prefix="bench-network-", dir="/tmp"))
        try:
            samples = asyncio.run(_measure(root, a3, repetitions))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        for mode in MODES:
            for name, what in (("wall", "wall"), ("cpu", "agent CPU"), ("tools", "tools' CPU")):
                median, p99 = stats(samples[mode][name])
                rows.append(Row(f"{label}: query {mode}, {what}", median * 1e3, p99 * 1e3, "ms"))
    report("network", rows)


if __name__ == "__main__":
    main()
