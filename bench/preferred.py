"""Time ``allocation.preferred`` on a 16-chip Box16 node, with and without 8 replicas per chip.

Each call gets one of a fixed, seeded set of requests (random availability, sometimes a must_include id,
sizes from 1 to everything), so the figures cover the cheap and the expensive paths alike. The budget is 2 ms
a call.

    .venv/bin/python -m bench.preferred [--iterations N]

Prints the median and p99 in microseconds and writes them to bench/results/preferred.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

from ascend_agent.allocation import Topology, preferred, topology_for
from ascend_agent.model import Chip

RESULTS = Path(__file__).parent / "results" / "preferred.json"
BUDGET_US = 2000.0

Request = tuple[list[str], list[str], int]


def requests(topology: Topology, count: int, rng: random.Random) -> list[Request]:
    devices = sorted(topology.chip_of)
    drawn: list[Request] = []
    for _ in range(count):
        available = rng.sample(devices, rng.randint(1, len(devices)))
        must = rng.sample(available, 1) if rng.random() < 0.3 else []
        size = min(len(available), rng.choice([1, 2, 4, 8, 10, 16, len(devices)]))
        drawn.append((available, must, size))
    return drawn


def measure(replicas: int, iterations: int, seed: int) -> dict[str, float | int]:
    topology = topology_for([Chip.make(i, "910ProB") for i in range(16)], replicas=replicas)
    drawn = requests(topology, 500, random.Random(seed))
    timings: list[float] = []
    for i in range(iterations):
        available, must, size = drawn[i % len(drawn)]
        start = time.perf_counter_ns()
        preferred(topology, available, must, size)
        timings.append((time.perf_counter_ns() - start) / 1000)
    timings.sort()
    return {
        "chips": 16,
        "replicas": replicas,
        "iterations": iterations,
        "median_us": round(statistics.median(timings), 1),
        "p99_us": round(timings[int(len(timings) * 0.99) - 1], 1),
        "max_us": round(timings[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    cases = {
        "16 chips": measure(1, args.iterations, args.seed),
        "16 chips x 8 replicas": measure(8, args.iterations, args.seed),
    }
    for name, figures in cases.items():
        verdict = "ok" if figures["p99_us"] < BUDGET_US else "OVER BUDGET"
        median, p99 = figures["median_us"], figures["p99_us"]
        print(f"{name:>22}: median {median:8.1f} us   p99 {p99:8.1f} us   {verdict}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {"python": platform.python_version(), "budget_us": BUDGET_US, "cases": cases}
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
