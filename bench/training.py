"""What reading the chips' training facts costs the health loop: the devfs backend's ``query()`` in-process,
with a fake npu-smi and a fake hccn_tool answering the shared samples, on an 8-chip 910B node and a 16-die A3
node (device IP, and on A3 vNIC IP and spod-info, per chip). Timed: the first query (every chip read), a
query in which the minute's share of chips is due (1 of 8, 2 of 16 at a 5 s interval), and a query with none
due (two simulated minutes of 5 s queries)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ascend_agent.backends.devfs import DevfsBackend
from ascend_agent.config import Settings
from bench._common import Row, quick, report, stats
from tests.support import CONSTRUCTED, FIXTURES
from tests.support.hccn_fake import FakeHccnTool
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.training_fixtures import per_chip

INTERVAL = 5.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _node(root: Path, a3: bool) -> tuple[HostTree, FakeNpuSmi, FakeHccnTool]:
    chips = range(16) if a3 else range(8)
    host = HostTree(root / "host").add_driver().add_management().add_chips(chips)
    npu_smi = FakeNpuSmi(root / "npu-smi")
    tool = FakeHccnTool(root / "hccn")
    if a3:
        npu_smi.set_output("info", (FIXTURES / "Ascend910-A3x16-24.1.rc3.7-info.txt").read_text())
        board = (CONSTRUCTED / "Ascend910-A3-24.1.rc3.7-info-t-board-i-0-c-0.txt").read_text()
        npu_smi.set_output("info -t board -i 0 -c 0", board)
        spod = per_chip("npu-smi-info-t-spod-info_A3-log-decoded.txt")[0]
        for die in chips:
            tool.set_output(f"-i {die} -ip -g", f"ipaddr:10.0.{die}.11\nnetmask:255.255.255.0\n")
            tool.set_output(f"-i {die} -vnic -g", f"vnic ipaddr: 192.168.2.{die}\n")
            npu_smi.set_output(
                f"info -t spod-info -i {die // 2} -c {die % 2}", spod.replace("167772160", str(die))
            )
    else:
        npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
        for chip, text in per_chip("hccn_tool-ip-g_fixture-8dev.txt").items():
            tool.set_output(f"-i {chip} -ip -g", text)
    return host, npu_smi, tool


async def _nothing(*_: object) -> None:
    return None


async def _timed(query: Callable[[], object]) -> float:
    started = time.perf_counter()
    await query()  # type: ignore[misc]
    return time.perf_counter() - started


async def _measure(root: Path, a3: bool, repetitions: int) -> dict[str, list[float]]:
    host, npu_smi, tool = _node(root, a3)
    settings = Settings(
        backend="devfs", host_root=host.root, npu_smi=str(npu_smi.path), hccn_tool=str(tool.path),
        health_interval=INTERVAL,
    )  # fmt: skip
    samples: dict[str, list[float]] = {"first": [], "due": [], "none due": []}
    for _ in range(repetitions):
        backend = DevfsBackend(settings)
        clock = Clock()
        backend._training._clock = clock  # the bench's clock: minutes pass without waiting
        backend._network.refresh = _nothing  # type: ignore[method-assign]  # bench/network.py measures it
        samples["first"].append(await _timed(backend.query))
        for _ in range(int(120 / INTERVAL)):  # two minutes of health queries
            clock.now += INTERVAL
            before = tool.calls()
            took = await _timed(backend.query)
            samples["due" if tool.calls() > before else "none due"].append(took)
        assert backend._training.facts(7).device_ip is not None
    return samples


def main() -> None:
    repetitions = 3 if quick() else 10
    rows = []
    for a3, label in ((False, "8 x 910B"), (True, "16 A3 dies")):
        root = Path(tempfile.mkdtemp(prefix="bench-training-", dir="/tmp"))
        try:
            samples = asyncio.run(_measure(root, a3, repetitions))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        for name, values in samples.items():
            median, p99 = stats(values)
            rows.append(Row(f"{label}: query, {name}", median * 1e3, p99 * 1e3, "ms"))
    report("training", rows)


if __name__ == "__main__":
    main()
