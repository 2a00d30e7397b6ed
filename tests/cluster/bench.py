"""`make bench-cluster`: how long the real cluster takes to see what the agent does, measured through
watches (`kubectl get --watch`, each line timed as it arrives) and the kubelet's own log timestamps,
so no poll interval is in the figures; the agent beside a Go device plugin;
and the agent's API requests at rest.

    python -m tests.cluster.bench BINARY GENERIC_PLUGIN IMAGE_ARCHIVE [ROUNDS [WINDOW_SECONDS]]

The kubelet runs on containerd (tests/cluster/runtime/), which runs the pods from the agent's image
(IMAGE_ARCHIVE, made by image/build.sh).

Figures: agent start -> Allocatable 8 in the API; chip fault -> Allocatable 7; recovery -> Allocatable 8;
kubelet restart -> the agent registered again and Allocatable 8; pod create -> Running (the scheduler, the
kubelet's Allocate through the agent, the runtime). Each is the median and the maximum of ROUNDS rounds.

Side by side, in the same cluster: squat's generic-device-plugin (GENERIC_PLUGIN, built by
tests/cluster/goplugin/build.sh) advertising the chips' eight stand-in device nodes in /dev as
``generic.example/davinci``. For each plugin, each round: killed (SIGKILL) and, once the kubelet reports
Allocatable 0, started again -> the kubelet's log line for its Register request, and -> Allocatable 8; its RSS
then; a one-device pod create -> Running; and a kubelet restart -> Register again (both plugins at once).

At rest: the requests the API server's audit log records from the chart's ServiceAccount that arrived in
WINDOW_SECONDS of an idle agent (registered, no pod, no change), times 3600 / WINDOW_SECONDS; for the chart's
default values, its Volcano values and its DRA values.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import grpc

from ascend_agent.naming import socket_name
from tests.cluster.agent import DRA_RENDER, RENDERS, ROOT, agent_args, agent_user, apply_chart
from tests.cluster.harness import KUBELET_DIR, NODE_NAME, Cluster
from tests.cluster.pods import RESOURCE, one_pod_spec
from tests.cluster.runtime import binaries
from tests.support.agent_process import AgentProcess
from tests.support.kubelet_standin import compile_api

GENERIC_RESOURCE = "generic.example/davinci"
CHIPS = 8
VOLCANO_RENDER = RENDERS / "volcano.yaml"
DRA_DRIVER = "npu.huawei.com"
ALLOCATE_CALLS = 1000
SETTLE_SECONDS = 5.0  # after the agent is registered, before the window at rest opens


def allocatable(resource: str) -> str:
    return "{.status.allocatable." + resource.replace(".", "\\.") + "}"


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

    def drain(self) -> None:
        """Forget the lines that arrived so far."""
        while True:
            try:
                self.lines.get_nowait()
            except queue.Empty:
                return

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(20)


def node_watch(cluster: Cluster, resource: str) -> Watch:
    return Watch(cluster, "node", NODE_NAME, "-o", f"jsonpath={allocatable(resource)}{{'\\n'}}")


def settle(cluster: Cluster, watches: dict[str, Watch]) -> None:
    """Each watched resource at Allocatable 8 in the API, and the lines about the way there forgotten."""
    for resource, watch in watches.items():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = cluster.kubectl("get", "node", NODE_NAME, "-o", f"jsonpath={allocatable(resource)}").stdout
            if now.strip() == str(CHIPS):
                break
            time.sleep(0.2)
        else:
            raise TimeoutError(f"Allocatable {resource} is not {CHIPS} 60 s after the kubelet's restart")
        watch.drain()


def klog_time(line: str) -> float:
    """The wall-clock time of a klog line (``I1204 20:20:24.063673 ...``, local time, no year)."""
    stamp = datetime.strptime(f"{datetime.now().year} {line[1:21]}", "%Y %m%d %H:%M:%S.%f")
    return stamp.timestamp()


def kubelet_registered(cluster: Cluster, resource: str, after: float, timeout: float = 60.0) -> float:
    """The wall-clock time the kubelet logged a Register request for ``resource`` at or after ``after``."""
    wanted = f'"Got registration request from device plugin with resource" resourceName="{resource}"'
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = cluster.components["kubelet"].log
        for line in log.read_text(errors="replace").splitlines():
            if wanted in line and klog_time(line) >= after:
                return klog_time(line)
        time.sleep(0.05)  # the time is read from the line, not from when it is seen
    raise TimeoutError(f"the kubelet logged no Register request for {resource} in {timeout:.0f} s")


class GenericPlugin:
    """squat's generic-device-plugin over the chips' device nodes, in the cluster's network namespace."""

    def __init__(self, binary: Path, cluster: Cluster, log: IO[bytes]) -> None:
        spec = {"name": "davinci", "groups": [{"paths": [{"path": "/dev/davinci[0-9]*"}]}]}
        argv = [
            str(binary),
            f"--device={json.dumps(spec)}",
            f"--domain={GENERIC_RESOURCE.split('/')[0]}",
            f"--plugin-directory={KUBELET_DIR / 'device-plugins'}",
            "--listen=127.0.0.1:9411",
        ]
        # nsenter execs the plugin: the pid is the plugin's.
        self.proc = subprocess.Popen(
            cluster.in_netns(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def pod_running(cluster: Cluster, name: str, resource: str) -> float:
    """Seconds from a one-device pod's create to Running; the pod is deleted after."""
    spec = one_pod_spec(name, name, 1)
    spec["spec"]["containers"][0]["resources"]["limits"] = {resource: "1"}
    pods = Watch(
        cluster, "pods", f"--field-selector=metadata.name={name}", "-o", "jsonpath={.status.phase}{'\\n'}"
    )
    created = time.monotonic()
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(spec))
    seconds = pods.until("Running".__eq__) - created
    pods.close()
    cluster.kubectl("delete", "pod", name, "--wait=true", "--timeout=60s", timeout=90)
    return seconds


def allocate_seconds(api: tuple[ModuleType, ModuleType], socket: Path, calls: int) -> list[float]:
    """Sequential one-device Allocate calls on a plugin's socket, beside the kubelet's own connection."""
    messages, services = api
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = services.DevicePluginStub(channel)
        stream = stub.ListAndWatch(messages.Empty(), timeout=30)
        device = next(iter(stream)).devices[0].ID
        stream.cancel()
        request = messages.AllocateRequest(
            container_requests=[messages.ContainerAllocateRequest(devices_ids=[device])]
        )
        for _ in range(calls // 10):
            stub.Allocate(request, timeout=10)
        samples = []
        for _ in range(calls):
            started = time.perf_counter()
            stub.Allocate(request, timeout=10)
            samples.append(time.perf_counter() - started)
    return samples


def requests_in(audit_log: Path, user: str, start: float, end: float) -> Counter[str]:
    """The requests of ``user`` the API server received in [start, end), by verb and resource."""
    seen: dict[str, str] = {}
    for line in audit_log.read_text().splitlines():
        event: dict[str, Any] = json.loads(line)
        if event["user"]["username"] != user or event["auditID"] in seen:
            continue
        received = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if start <= received.timestamp() < end:
            target = event.get("objectRef", {}).get("resource", event["requestURI"])
            seen[event["auditID"]] = f"{event['verb']} {target}"
    return Counter(seen.values())


def at_rest(cluster: Cluster, agent: AgentProcess, user: str, window: float) -> Counter[str]:
    """The agent's requests in ``window`` seconds at rest, once it has settled."""
    time.sleep(SETTLE_SECONDS)
    start = time.time()
    time.sleep(window)
    end = time.time()
    assert agent.proc.poll() is None, agent.output[-3000:]
    time.sleep(1.0)  # the audit log line of a request that arrived just before the end
    return requests_in(cluster.audit_log, user, start, end)


def side_by_side(
    cluster: Cluster, generic_binary: Path, agent_argv: list[str], rounds: int, agents: list[AgentProcess]
) -> dict[str, dict[str, list[float]]]:
    """The figures of each plugin; every agent started is appended to ``agents`` (the caller stops them)."""
    api_dir = cluster.work / "api"
    api_dir.mkdir()
    api = compile_api(api_dir)
    log = (cluster.work / "logs" / "generic-device-plugin.log").open("ab")
    watches = {
        RESOURCE: node_watch(cluster, RESOURCE),
        GENERIC_RESOURCE: node_watch(cluster, GENERIC_RESOURCE),
    }
    running: dict[str, AgentProcess | GenericPlugin] = {}
    figures: dict[str, dict[str, list[float]]] = {"ascend-agent": {}, "generic-device-plugin": {}}

    def spawn(resource: str) -> AgentProcess | GenericPlugin:
        if resource == RESOURCE:
            agents.append(AgentProcess(agent_argv, wrapper=cluster.in_netns([])))
            return agents[-1]
        return GenericPlugin(generic_binary, cluster, log)

    try:
        for _ in range(rounds):
            for name, resource in (("ascend-agent", RESOURCE), ("generic-device-plugin", GENERIC_RESOURCE)):
                mine = figures[name]
                if resource in running:
                    old = running.pop(resource)
                    old.proc.send_signal(signal.SIGKILL)
                    old.proc.wait(20)
                # The first round too: the agent of the rounds before was stopped, the generic one never ran.
                watches[resource].until(lambda line: line in ("", "0"))
                started_wall, started = time.time(), time.monotonic()
                plugin = running[resource] = spawn(resource)
                registered = kubelet_registered(cluster, resource, started_wall)
                mine.setdefault("start -> Register at the kubelet", []).append(registered - started_wall)
                mine.setdefault(f"start -> Allocatable {CHIPS}", []).append(
                    watches[resource].until(str(CHIPS).__eq__) - started
                )
                mine.setdefault("RSS after registration (MB)", []).append(rss_mb(plugin.proc.pid))
                mine.setdefault("pod create -> Running", []).append(
                    pod_running(cluster, f"bench-{resource.split('/')[1].lower()}", resource)
                )
            restarted = time.time()
            cluster.restart_kubelet()
            for name, resource in (("ascend-agent", RESOURCE), ("generic-device-plugin", GENERIC_RESOURCE)):
                figures[name].setdefault("kubelet restart -> Register again", []).append(
                    kubelet_registered(cluster, resource, restarted) - restarted
                )
            settle(cluster, watches)
        plugins = KUBELET_DIR / "device-plugins"
        newest_generic = max(plugins.glob("gdp-*.sock"), key=lambda path: path.stat().st_mtime)
        for name, socket in (
            ("ascend-agent", plugins / socket_name(RESOURCE)),
            ("generic-device-plugin", newest_generic),
        ):
            figures[name]["Allocate 1 device on its socket, sequential"] = allocate_seconds(
                api, socket, ALLOCATE_CALLS
            )
        for name, resource in (("ascend-agent", RESOURCE), ("generic-device-plugin", GENERIC_RESOURCE)):
            figures[name]["RSS at the end (MB)"] = [rss_mb(running[resource].proc.pid)]
    finally:
        generic = running.pop(GENERIC_RESOURCE, None)
        if isinstance(generic, GenericPlugin) and generic.proc.poll() is None:
            generic.kill()
        log.close()
        for watch in watches.values():
            watch.close()
    return figures


def rest_figures(cluster: Cluster, window: float) -> dict[str, Counter[str]]:
    """The agent's requests at rest with the chart's default, Volcano and DRA values, one after the other."""
    figures: dict[str, Counter[str]] = {}
    state = cluster.work / "fake-state-rest.json"
    state.write_text("{}")
    for label, render, registered in (
        ("default", RENDERS / "default.yaml", f"Registered resource {RESOURCE}"),
        ("--volcano", VOLCANO_RENDER, f"Registered resource {RESOURCE}"),
        ("DRA driver", DRA_RENDER, f"Registered DRA driver {DRA_DRIVER}"),
    ):
        apply_chart(cluster, render)
        if render == DRA_RENDER:
            cluster.kubectl("apply", "-f", str(ROOT / "examples" / "dra" / "deviceclasses.yaml"))
        agent = AgentProcess(agent_args(cluster, render, fakeState=str(state)), wrapper=cluster.in_netns([]))
        try:
            agent.wait_log(registered, timeout=60)
            figures[label] = at_rest(cluster, agent, agent_user(render), window)
        finally:
            agent.terminate(timeout=20)
            (cluster.work / "logs" / f"agent-rest-{label.strip('-').split()[0]}.log").write_text(agent.output)
            agent.close()
    return figures


def run(
    binary: Path, generic_binary: Path, image: Path, rounds: int, window: float
) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]], dict[str, Counter[str]]]:
    figures: dict[str, list[float]] = {}
    beside: dict[str, dict[str, list[float]]] = {}
    rest: dict[str, Counter[str]] = {}
    cluster = Cluster(binary, audited_users=(agent_user(),), runtime_tools=binaries(), images=(image,))
    agents: list[AgentProcess] = []
    try:
        cluster.start()
        apply_chart(cluster)
        state = cluster.work / "fake-state.json"
        state.write_text("{}")
        nodes = node_watch(cluster, RESOURCE)
        for _ in range(rounds):
            if agents:
                agents[-1].terminate(timeout=20)
                nodes.until(lambda line: line in ("", "0"))
            argv = agent_args(cluster, fakeState=str(state))
            started = time.monotonic()
            agents.append(AgentProcess(argv, wrapper=cluster.in_netns([])))
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
            settle(cluster, {RESOURCE: nodes})

            figures.setdefault("pod create -> Running", []).append(pod_running(cluster, "bench", RESOURCE))
        nodes.close()
        agents[-1].terminate(timeout=20)

        beside = side_by_side(
            cluster, generic_binary, agent_args(cluster, fakeState=str(state)), rounds, agents
        )
        agents[-1].terminate(timeout=20)
        rest = rest_figures(cluster, window)
    finally:
        for agent in agents:
            if agent.proc.poll() is None:
                agent.terminate(timeout=20)
            agent.close()
        if os.environ.get("E2E_KEEP_WORK"):
            print(f"work directory kept: {cluster.work}", file=sys.stderr)
        problems = cluster.stop() + cluster.leftovers()
        if problems:
            print("the cluster left things behind:\n" + "\n".join(problems), file=sys.stderr)
    return figures, beside, rest


def milliseconds(samples: list[float]) -> str:
    return f"median {statistics.median(samples) * 1000:.0f} ms, max {max(samples) * 1000:.0f} ms"


def cell(what: str, samples: list[float]) -> str:
    if "(MB)" in what:
        return f"{statistics.median(samples):.1f} MB (max {max(samples):.1f})"
    if "Allocate" in what:
        p99 = statistics.quantiles(samples, n=100)[98]
        return f"{statistics.median(samples) * 1000:.2f} ms (p99 {p99 * 1000:.2f})"
    return f"{statistics.median(samples) * 1000:.0f} ms (max {max(samples) * 1000:.0f})"


def main(argv: list[str]) -> int:
    if not 3 <= len(argv) <= 5:
        print(
            "usage: python -m tests.cluster.bench BINARY GENERIC_PLUGIN IMAGE_ARCHIVE "
            "[ROUNDS [WINDOW_SECONDS]]",
            file=sys.stderr,
        )
        return 2
    rounds = int(argv[3]) if len(argv) >= 4 else 5
    window = float(argv[4]) if len(argv) == 5 else 60.0
    figures, beside, rest = run(Path(argv[0]), Path(argv[1]), Path(argv[2]), rounds, window)
    for name, samples in figures.items():
        print(f"{name}: {milliseconds(samples)} ({len(samples)} rounds)")
    if beside:
        print(f"\nside by side, medians of {rounds} rounds (max in brackets):")
        print(f"| what | ascend-agent ({RESOURCE}) | generic-device-plugin ({GENERIC_RESOURCE}) |")
        print("|---|---|---|")
        for what, samples in beside["ascend-agent"].items():
            print(f"| {what} | {cell(what, samples)} | {cell(what, beside['generic-device-plugin'][what])} |")
    if rest:
        print(f"\nAPI requests at rest, {window:.0f} s window, scaled to an hour (x {3600 / window:g}):")
        for label, counts in rest.items():
            total = sum(counts.values())
            detail = ", ".join(f"{what} {n}" for what, n in sorted(counts.items())) or "none"
            print(f"{label}: {total} in {window:.0f} s -> {total * 3600 / window:.0f} per hour ({detail})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
