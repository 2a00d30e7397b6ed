"""Shared by the benchmarks: the grpcio kubelet stand-in and agent process from tests/, statistics, tables,
and results written to bench/results/<name>.json with the machine they ran on."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.support import ROOT
from tests.support.agent_process import AgentProcess
from tests.support.kubelet_standin import KubeletStandin, compile_api

RESULTS = ROOT / "bench" / "results"

__all__ = [
    "AgentProcess",
    "KubeletStandin",
    "Row",
    "devfs_flags",
    "grpc_api",
    "kubelet",
    "quick",
    "report",
    "start_agent",
    "stats",
]


def quick() -> bool:
    return "--quick" in sys.argv


def grpc_api() -> tuple[ModuleType, ModuleType]:
    """protobuf and grpcio classes compiled from protos/ now, as the tests do."""
    return compile_api(Path(tempfile.mkdtemp(prefix="bench-api-", dir="/tmp")))


def start_agent(kubelet_dir: Path, *flags: str) -> AgentProcess:
    """``ascend-agent run`` against ``kubelet_dir`` with metrics off: the fake backend unless ``flags`` name
    another (a repeated flag takes its last value). The package's bytecode is written as its modules load
    (``PYTHONDONTWRITEBYTECODE`` cleared), so after the first start the agent loads it as an installed agent
    does instead of compiling its source at every start."""
    return AgentProcess(
        ["run", "--backend", "fake", "--kubelet-dir", str(kubelet_dir), "--metrics-address", "", *flags],
        env={"PYTHONDONTWRITEBYTECODE": ""},
    )


def devfs_flags(host_root: Path, npu_smi: Path) -> list[str]:
    """The flags for the devfs backend on a temporary host tree with a fake npu-smi."""
    return ["--backend", "devfs", "--host-root", str(host_root), "--npu-smi", str(npu_smi)]


@contextmanager
def kubelet(api: tuple[ModuleType, ModuleType]) -> Iterator[KubeletStandin]:
    directory = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp")) / "k"
    standin = KubeletStandin(directory, *api)
    standin.start()
    try:
        yield standin
    finally:
        standin.stop()


def stats(samples: Sequence[float]) -> tuple[float, float]:
    """(median, p99) of ``samples``."""
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


@dataclass
class Row:
    name: str
    median: float
    p99: float | None
    unit: str
    target: str = ""
    ok: bool | None = None


def _machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    return {
        "cpus": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def report(name: str, rows: Sequence[Row], extra: dict[str, Any] | None = None) -> None:
    """Print an aligned table and write bench/results/<name>.json."""
    print(f"\n== {name} ({_machine()['cpus']} cores, {_machine()['cpu']})")
    header = ("case", "median", "p99", "unit", "target", "ok")
    cells = [
        (
            r.name,
            f"{r.median:.3f}",
            "-" if r.p99 is None else f"{r.p99:.3f}",
            r.unit,
            r.target,
            "-" if r.ok is None else ("yes" if r.ok else "NO"),
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    for line in [header, *cells]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    RESULTS.mkdir(parents=True, exist_ok=True)
    document = {"machine": _machine(), "rows": [asdict(r) for r in rows], **(extra or {})}
    (RESULTS / f"{name}.json").write_text(json.dumps(document, indent=2))
