"""`make bench-cluster`: how long the real cluster takes to see what the agent does, measured through watches
(`kubectl get --watch`, each line timed as it arrives), so no poll interval is in the figures.

    python -m tests.cluster.bench BINARY [ROUNDS]

Figures: agent start -> Allocatable 8 in the API; chip fault -> Allocatable 7; recovery -> Allocatable 8;
kubelet restart -> the agent registered again and Allocatable 8; pod create -> Running (the scheduler, the
kubelet's Allocate through the agent, the runtime). Each is the median and the maximum of ROUNDS rounds.
"""

from __future__ import annotations

import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.cluster.agent import apply_chart, start_agent
from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.pods import RESOURCE, one_pod_spec
from tests.support.agent_process import AgentProcess

ALLOCATABLE = "{.status.allocatable." + RESOURCE.replace(".", "\\.") + "}"


class Watch:
    """`kubectl get ... --watch -o jsonpath=...`: every line it prints, with the monotonic time it arrived."""

    def __init__(self, cluster: Cluster, *args: str) -> None:
        argv = [
            str(cluster.binary),
            "kubectl",
            f"--kubeconfig={cluster.admin_kubeconfig}",
            "get",
            *args,
            "--watch",
        ]
        self.process = subprocess.Popen(cluster.in_netns(argv), stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put((time.monotonic(), line.strip()))

    def until(self, wanted: Callable[[str], bool], timeout: float = 120.0) -> float:
        """The arrival time of the first line from now on that ``wanted`` accepts."""
        deadline = time.monotonic() + timeout
        while True:
            arrived, line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if wanted(line):
                return arrived

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(20)


def milliseconds(samples: list[float]) -> str:
    return f"median {statistics.median(samples) * 1000:.0f} ms, max {max(samples) * 1000:.0f} ms"


def run(binary: Path, rounds: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {}
    cluster = Cluster(binary)
    agents: list[AgentProcess] = []
    try:
        cluster.start()
        apply_chart(cluster)
        state = cluster.work / "fake-state.json"
        state.write_text("{}")
        nodes = Watch(cluster, "node", NODE_NAME, "-o", f"jsonpath={ALLOCATABLE}{{'\\n'}}")
        for _ in range(rounds):
            if agents:
                agents[-1].terminate(timeout=20)
                nodes.until(lambda line: line in ("", "0"))
            started = time.monotonic()
            agents.append(start_agent(cluster, fakeState=str(state)))
            figures.setdefault("agent start -> Allocatable 8", []).append(nodes.until("8".__eq__) - started)

            state.write_text(json.dumps({"unhealthy": [3]}))
            faulted = time.monotonic()
            figures.setdefault("chip fault -> Allocatable 7", []).append(nodes.until("7".__eq__) - faulted)
            state.write_text("{}")
            recovered = time.monotonic()
            figures.setdefault("recovery -> Allocatable 8", []).append(nodes.until("8".__eq__) - recovered)

            restarted = time.monotonic()
            cluster.restart_kubelet()
            agents[-1].wait_log(f"Registered resource {RESOURCE}", timeout=60, count=2)
            figures.setdefault("kubelet restart -> registered again", []).append(time.monotonic() - restarted)

            pods = Watch(
                cluster,
                "pods",
                "--field-selector=metadata.name=bench",
                "-o",
                "jsonpath={.status.phase}{'\\n'}",
            )
            created = time.monotonic()
            cluster.kubectl("apply", "-f", "-", stdin=json.dumps(one_pod_spec("bench", "bench", 1)))
            figures.setdefault("pod create -> Running", []).append(pods.until("Running".__eq__) - created)
            pods.close()
            cluster.kubectl("delete", "pod", "bench", "--wait=true", "--timeout=60s", timeout=90)
        nodes.close()
    finally:
        for agent in agents:
            if agent.proc.poll() is None:
                agent.terminate(timeout=20)
            agent.close()
        problems = cluster.stop() + cluster.leftovers()
        if problems:
            print("the cluster left things behind:\n" + "\n".join(problems), file=sys.stderr)
    return figures


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print("usage: python -m tests.cluster.bench BINARY [ROUNDS]", file=sys.stderr)
        return 2
    figures = run(Path(argv[0]), int(argv[1]) if len(argv) == 2 else 5)
    for name, samples in figures.items():
        print(f"{name}: {milliseconds(samples)} ({len(samples)} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
