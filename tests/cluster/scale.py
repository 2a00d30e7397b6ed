"""`make bench-scale`: what each agent costs the API server when many nodes run it, at rest and in storms.

    python -m tests.cluster.scale BINARY KWOK [--nodes N] [--agents M] [--modes default,volcano,dra]
        [--rest-seconds S] [--outage-seconds S] [--agent-source DIR] [--out build/bench-scale.json]

For each mode (the chart's default values, its ``--volcano`` values, its DRA values): a fresh control plane of
``make e2e`` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler; no kubelet) with the chart's
objects but its DaemonSet; kwok (KWOK) keeps N fake Nodes Ready; M real agent processes (fake backend, eight
910B4 chips each, a token of the chart's ServiceAccount bound to its own Node, the chart's settings) run on
M of those nodes, each beside a kubelet stand-in of its own in the device plugin modes. The figures come
from the API server itself: its /metrics (requests, 429s, in-flight and queued requests per priority level,
watches, response bytes, its own CPU) and its audit log, which records every request of the chart's
ServiceAccount with the Node its token is bound to, so each request counts for the agent that made it.

Phases, in order:

- every agent started at once: the time until all are registered and their Nodes labelled;
- a window at rest: requests, watches, bytes and API server CPU per agent an hour;
- a restart storm: every agent stopped, its Node's labels removed, all started at once: the time until all
  are registered and labelled again, the API server's peak in-flight requests, 429s, each agent's densest
  second and its spacing after a refusal;
- the same with the agents' requests in a priority level of one seat that rejects the rest (the API server
  answering 429 with Retry-After);
- an API server restart (down ``--outage-seconds``): the time until every agent's watches are open again,
  and how many resumed from their resourceVersion instead of reading again;
- etcd down for a minute while a chip of every agent turns Unhealthy (the API server answering 5xx): the
  agents' requests meanwhile, and the time from etcd's return until every node's published state (its
  device-info ConfigMap, or its ResourceSlices) shows the chip; then the chip Healthy again;
- a fault storm: every chip of 10% of the agents Unhealthy and back, three times within a minute: the
  writes per node, by resource;
- a baseline window after the agents stopped (kwok's heartbeats, the controllers): what the agents at rest
  cost the API server beyond it (CPU, bytes, etcd writes, watches).

``--agent-source`` runs the agents from another checkout of the project (its renders and its code), for the
figures before a change. The result is ``--out`` (one object per mode) and a table.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import yaml

from tests.cluster.agent import agent_settings, chart_objects
from tests.cluster.harness import Cluster, ClusterError
from tests.support.kubelet_standin import KubeletStandin, compile_api

ROOT = Path(__file__).resolve().parents[2]
RENDER_NAMES = {"default": "default.yaml", "volcano": "volcano.yaml", "dra": "dra.yaml"}
DRA_DRIVER = "npu.huawei.com"
AGENT_LABEL = "bench.ascend-agent/agent"
CHIP_LABEL = "node.kubernetes.io/npu.chip.name"
AGENT_LABEL_PREFIXES = ["huawei.com/npu.", "node.kubernetes.io/npu.", "mind-cluster/"]
NODE_IDENTITY = "authentication.kubernetes.io/node-name"
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
CONVERGE_TIMEOUT = 600.0
BASELINE_SECONDS = 60.0
SETTLE_SECONDS = 10.0
CHIPS = 8
FAULT_SHARE = 0.10
FAULT_FLIPS = 3
FAULT_PHASE_SECONDS = 10.0
FAULT_SETTLE_SECONDS = 20.0
SAMPLE_SECONDS = 1.0
ETCD_OUTAGE_SECONDS = 60.0
# A priority level of one seat that refuses what does not fit (429 with Retry-After), and a flow schema that
# sends the agents' ServiceAccount to it ahead of any the chart ships: the API server refusing them.
THROTTLE_NAME = "bench-scale-throttle"
THROTTLE_PRECEDENCE = 200


class ScaleError(Exception):
    """A phase did not converge, or the cluster failed: the bench stops with this line."""


class Probe:
    """tests/cluster/scale_probe.py in the cluster's network namespace, one request at a time."""

    def __init__(self, cluster: Cluster) -> None:
        argv = cluster.in_netns(
            [sys.executable, "-m", "tests.cluster.scale_probe", str(cluster.admin_kubeconfig)]
        )
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        self._lock = threading.Lock()

    def ask(self, op: str, **arguments: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        with self._lock:
            self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            raise ScaleError(f"the cluster probe ended (exit {self.process.poll()})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise ScaleError(answer["error"])
        return answer

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        self.process.wait(10)


class Sampler:
    """The API server's in-flight and queued requests sampled every second while a storm lasts: peaks."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.peak_inflight = 0.0
        self.peak_executing: dict[str, float] = defaultdict(float)
        self.peak_queued: dict[str, float] = defaultdict(float)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            with contextlib.suppress(ScaleError):
                figures = self.probe.ask("metrics")
                inflight = figures.get("apiserver_current_inflight_requests", {})
                self.peak_inflight = max(self.peak_inflight, sum(inflight.values()))
                for level, value in figures.get(
                    "apiserver_flowcontrol_current_executing_requests", {}
                ).items():
                    self.peak_executing[level] = max(self.peak_executing[level], value)
                for level, value in figures.get("apiserver_flowcontrol_current_inqueue_requests", {}).items():
                    self.peak_queued[level] = max(self.peak_queued[level], value)


@dataclass
class Agent:
    """One agent process on one fake Node, with its own files and kubelet stand-in."""

    node: str
    directory: Path
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    standin: KubeletStandin | None
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    starts: int = 0

    @property
    def state(self) -> Path:
        return self.directory / "state.json"

    def start(self) -> None:
        self.starts += 1
        self.log = (self.directory / f"agent-{self.starts}.log").open("wb")
        self.process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )

    def signal(self, number: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, number)

    def wait(self, timeout: float = 30.0) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(10)
        if self.log is not None:
            self.log.close()

    def write_state(self, state: dict[str, Any]) -> None:
        written = self.state.with_suffix(".new")
        written.write_text(json.dumps(state))
        written.replace(self.state)

    def registrations(self) -> int:
        return 0 if self.standin is None else len(self.standin.registrations)


@dataclass
class AuditRecord:
    node: str
    verb: str
    resource: str
    code: int
    at: float  # seconds since the epoch, when the API server received it
    uri: str


def read_audit(path: Path, since: float, until: float) -> list[AuditRecord]:
    """The agents' requests the API server received in [since, until): a watch when it started, any other
    request when it was answered."""
    records: list[AuditRecord] = []
    if not path.exists():
        return records
    with path.open() as lines:
        for line in lines:
            if not line.endswith("\n"):
                break  # the API server is still writing it
            event = json.loads(line)
            watch = event.get("verb") == "watch"
            if event.get("stage") != ("ResponseStarted" if watch else "ResponseComplete"):
                continue
            at = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
            if not since <= at < until:
                continue
            extra = (event.get("user") or {}).get("extra") or {}
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            records.append(
                AuditRecord(
                    node=(extra.get(NODE_IDENTITY) or ["?"])[0],
                    verb=event.get("verb", ""),
                    resource=resource or event.get("requestURI", ""),
                    code=int((event.get("responseStatus") or {}).get("code") or 0),
                    at=at,
                    uri=event.get("requestURI", ""),
                )
            )
    return records


def densest_second(records: list[AuditRecord]) -> int:
    """The most requests any one agent made within one second."""
    per_second = Counter((r.node, int(r.at)) for r in records)
    return max(per_second.values(), default=0)


def retry_gaps(records: list[AuditRecord]) -> list[float]:
    """For each refused request (429, 5xx), the time until the same agent asked the same again."""
    gaps: list[float] = []
    by_call: dict[tuple[str, str, str], list[AuditRecord]] = defaultdict(list)
    for record in sorted(records, key=lambda r: r.at):
        by_call[(record.node, record.verb, record.resource)].append(record)
    for calls in by_call.values():
        for first, second in itertools.pairwise(calls):
            if first.code == 429 or first.code >= 500:
                gaps.append(second.at - first.at)
    return gaps


def _delta(after: dict[str, Any], before: dict[str, Any], name: str, key: str | None = None) -> float:
    a, b = after.get(name, {}), before.get(name, {})
    if key is not None:
        return float(a.get(key, 0.0) - b.get(key, 0.0))
    return float(sum(a.values()) - sum(b.values()))


def _watches(figures: dict[str, Any]) -> float:
    running = figures.get("apiserver_longrunning_requests", {})
    return float(sum(v for k, v in running.items() if k.startswith("WATCH/")))


def _bytes(figures: dict[str, Any]) -> float:
    sizes = figures.get("apiserver_response_sizes_sum", {})
    watched = figures.get("apiserver_watch_events_sizes_sum", {})
    return float(sum(sizes.values()) + sum(watched.values()))


def _refused(after: dict[str, Any], before: dict[str, Any]) -> int:
    return int(_delta(after, before, "apiserver_request_total", "429"))


@dataclass
class ModeRun:
    """One mode's cluster, agents and figures."""

    mode: str
    binary: Path
    kwok: Path
    nodes: int
    agents: int
    rest_seconds: float
    outage_seconds: float
    source: Path
    api: tuple[ModuleType, ModuleType] | None
    figures: dict[str, Any] = field(default_factory=dict)
    # The API server's figures when the window at rest opened and closed, and its length in seconds.
    rest: tuple[dict[str, Any], dict[str, Any], float] | None = None

    @property
    def render(self) -> Path:
        return self.source / "tests" / "fixtures" / "helm" / RENDER_NAMES[self.mode]

    def run(self) -> dict[str, Any]:
        account = next(o for o in chart_objects(self.render) if o["kind"] == "ServiceAccount")["metadata"]
        user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
        cluster = Cluster(self.binary, {}, with_node=False, audited_users=(user,))
        work = Path(tempfile.mkdtemp(prefix="ascale-", dir="/tmp"))
        agents: list[Agent] = []
        probe: Probe | None = None
        try:
            cluster.start()
            probe = Probe(cluster)
            self._install(cluster)
            names = [f"scale-{i:04d}" for i in range(self.nodes)]
            with_agents = names[: self.agents]
            probe.ask("create_nodes", names=names, agents=with_agents)
            cluster._spawn(
                "kwok",
                [
                    f"--kubeconfig={cluster.admin_kubeconfig}",
                    "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                    "--node-lease-duration-seconds=40",
                    "--v=WARN",
                    # The stages build.sh keeps beside the binary: a Node made Ready, then its Lease renewed.
                    *(f"--config={stage}" for stage in sorted((self.kwok.parent / "stages").glob("*.yaml"))),
                ],
                program=self.kwok,
            )
            self._until(
                "kwok keeps every Node Ready", lambda: probe.ask("ready_nodes")["count"] >= self.nodes
            )
            tokens = probe.ask(
                "tokens", account=account["name"], namespace=account["namespace"], nodes=with_agents
            )["tokens"]
            agents = [
                self._agent(cluster, work, node, token)
                for node, token in zip(with_agents, tokens, strict=True)
            ]
            self._phases(cluster, probe, agents)
            self.figures.update(
                mode=self.mode, nodes=self.nodes, agents=self.agents, rest_seconds=self.rest_seconds
            )
            return self.figures
        finally:
            for agent in agents:
                agent.signal(signal.SIGTERM)
            for agent in agents:
                agent.wait()
                if agent.standin is not None:
                    agent.standin.stop()
            if probe is not None:
                probe.close()
            problems = cluster.stop()
            if problems:
                print(f"{self.mode}: left behind: {'; '.join(problems)}", file=sys.stderr)
            if not os.environ.get("E2E_KEEP_WORK"):
                subprocess.run(["rm", "-rf", str(work)], check=False)

    def _install(self, cluster: Cluster) -> None:
        """The chart's objects without its DaemonSet (kwok would run its pods on every fake Node)."""
        objects = [o for o in chart_objects(self.render) if o["kind"] != "DaemonSet"]
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
        if self.mode == "dra":
            cluster.kubectl("apply", "-f", str(self.source / "examples" / "dra" / "deviceclasses.yaml"))

    def _agent(self, cluster: Cluster, work: Path, node: str, token: str) -> Agent:
        directory = work / node
        # The kubelet's directories: its device plugins', its plugins' (a DRA driver's sockets) and the plugin
        # watcher's, which the agent waits for.
        for kubelet_dir in ("device-plugins", "plugins", "plugins_registry"):
            (directory / kubelet_dir).mkdir(parents=True)
        kubeconfig = directory / "kubeconfig"
        cluster.write_kubeconfig(kubeconfig, token)
        (directory / "state.json").write_text("{}")
        settings = agent_settings(
            cluster,
            self.render,
            kubeletDir=str(directory / "device-plugins"),
            cdiSpecDir=str(directory / "cdi"),
            fakeState=str(directory / "state.json"),
            metricsAddress="",
        )
        (directory / "agent.yaml").write_text(yaml.safe_dump(settings))
        standin = None
        if self.mode != "dra":
            assert self.api is not None
            standin = KubeletStandin(directory / "device-plugins", *self.api)
            standin.start()
        argv = cluster.in_netns(
            [
                sys.executable, "-m", "ascend_agent", "run", "--config", str(directory / "agent.yaml"),
                "--kubeconfig", str(kubeconfig), "--node-name", node,
            ]
        )  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(self.source)}
        return Agent(node, directory, argv, env, self.source, standin)

    # -- phases ---------------------------------------------------------------------------------------------

    def _until(self, what: str, done: Callable[[], bool], timeout: float = CONVERGE_TIMEOUT) -> float:
        """Seconds until ``done()``, checked every half second."""
        began = time.monotonic()
        while not done():
            if time.monotonic() - began > timeout:
                raise ScaleError(f"{self.mode}: {what}: not within {timeout:.0f} s")
            time.sleep(0.5)
        return time.monotonic() - began

    def _converged(self, probe: Probe, agents: list[Agent], registered: dict[str, int]) -> Callable[[], bool]:
        """Every agent registered with its kubelet again (device plugin modes) or its Node's slices published
        (DRA), and every agent's Node labelled."""

        def done() -> bool:
            if any(agent.registrations() <= registered[agent.node] for agent in agents if agent.standin):
                return False
            if self.mode == "dra" and probe.ask("slice_nodes", driver=DRA_DRIVER)["count"] < len(agents):
                return False
            labelled = probe.ask("count_nodes", selector=f"{AGENT_LABEL},{CHIP_LABEL}")["count"]
            return bool(labelled >= len(agents))

        return done

    def _phases(self, cluster: Cluster, probe: Probe, agents: list[Agent]) -> None:
        m = len(agents)
        figures = self.figures
        audit = cluster.audit_log

        # Start: every agent at once.
        registered = {agent.node: agent.registrations() for agent in agents}
        started = time.time()
        with Sampler(probe) as sampler:
            for agent in agents:
                agent.start()
            figures["start_seconds"] = round(
                self._until("agents start", self._converged(probe, agents, registered)), 2
            )
        start_records = read_audit(audit, started, time.time())
        figures["start_requests_per_agent"] = round(len(start_records) / m, 1)
        figures["start_peak_inflight"] = sampler.peak_inflight

        # At rest.
        time.sleep(SETTLE_SECONDS)  # the start's last writes and the first reads back, out of the window
        rest_from, at_rest = time.time(), probe.ask("metrics")
        time.sleep(self.rest_seconds)
        rest_to, after_rest = time.time(), probe.ask("metrics")
        self.rest = (at_rest, after_rest, rest_to - rest_from)
        rest = read_audit(audit, rest_from, rest_to)
        hour = 3600.0 / (rest_to - rest_from)
        figures["requests_per_agent_hour"] = round(len(rest) / m * hour, 1)
        by_call = Counter(f"{r.verb} {r.resource}" for r in rest)
        figures["requests_per_agent_hour_by_call"] = {
            k: round(v / m * hour, 1) for k, v in by_call.most_common()
        }

        self._restart_storm(probe, agents, audit)
        self._throttled_restart(cluster, probe, agents, audit)
        self._apiserver_restart(cluster, probe, agents, audit)
        self._etcd_outage(cluster, probe, agents, audit)
        self._fault_storm(probe, agents, audit)
        self._baseline(probe, agents)

    def _baseline(self, probe: Probe, agents: list[Agent]) -> None:
        """The API server without agents (kwok's heartbeats, the controllers) for ``BASELINE_SECONDS``,
        after they stopped; what the agents at rest cost beyond it, per agent an hour."""
        for agent in agents:
            agent.signal(signal.SIGTERM)
        for agent in agents:
            agent.wait()
        time.sleep(SETTLE_SECONDS)
        before = probe.ask("metrics")
        time.sleep(BASELINE_SECONDS)
        after = probe.ask("metrics")
        assert self.rest is not None
        at_rest, after_rest, seconds = self.rest
        m = len(agents)

        def per_agent_hour(rest: float, baseline: float) -> float:
            return (rest / seconds - baseline / BASELINE_SECONDS) * 3600 / m

        figures = self.figures
        figures["apiserver_cpu_seconds_per_agent_hour"] = round(
            per_agent_hour(
                _delta(after_rest, at_rest, "process_cpu_seconds_total"),
                _delta(after, before, "process_cpu_seconds_total"),
            ),
            2,
        )
        figures["bytes_per_agent_hour"] = round(
            per_agent_hour(_bytes(after_rest) - _bytes(at_rest), _bytes(after) - _bytes(before))
        )
        writes = ("create", "update", "delete", "GuaranteedUpdate")
        figures["etcd_writes_per_agent_hour"] = round(
            per_agent_hour(
                sum(_delta(after_rest, at_rest, "etcd_request_duration_seconds_count", op) for op in writes),
                sum(_delta(after, before, "etcd_request_duration_seconds_count", op) for op in writes),
            ),
            1,
        )
        figures["watches_per_agent"] = round((_watches(at_rest) - _watches(after)) / m, 2)

    def _restart_storm(
        self, probe: Probe, agents: list[Agent], audit: Path, name: str = "restart_storm"
    ) -> None:
        figures = self.figures
        for agent in agents:
            agent.signal(signal.SIGTERM)
        for agent in agents:
            agent.wait()
        probe.ask(
            "strip_labels", nodes=[a.node for a in agents], prefixes=AGENT_LABEL_PREFIXES, keys=[CHIP_LABEL]
        )
        registered = {agent.node: agent.registrations() for agent in agents}
        before = probe.ask("metrics")
        began = time.time()
        with Sampler(probe) as sampler:
            for agent in agents:
                agent.start()
            figures[f"{name}_seconds"] = round(
                self._until(f"{name}: agents restarted at once", self._converged(probe, agents, registered)),
                2,
            )
        after = probe.ask("metrics")
        records = read_audit(audit, began, time.time())
        figures[f"{name}_requests_per_agent"] = round(len(records) / len(agents), 1)
        figures[f"{name}_429"] = _refused(after, before)
        figures[f"{name}_refused_by_level"] = {
            level: int(value)
            for level in after.get("apiserver_flowcontrol_rejected_requests_total", {})
            if (value := _delta(after, before, "apiserver_flowcontrol_rejected_requests_total", level))
        }
        figures[f"{name}_peak_inflight"] = sampler.peak_inflight
        figures[f"{name}_peak_executing_by_level"] = {k: v for k, v in sampler.peak_executing.items() if v}
        figures[f"{name}_peak_queued_by_level"] = {k: v for k, v in sampler.peak_queued.items() if v}
        figures[f"{name}_densest_agent_second"] = densest_second(records)
        gaps = retry_gaps(records)
        figures[f"{name}_retries"] = len(gaps)
        figures[f"{name}_retry_gap_min_median_s"] = (
            [round(min(gaps), 3), round(statistics.median(gaps), 3)] if gaps else []
        )

    def _throttled_restart(self, cluster: Cluster, probe: Probe, agents: list[Agent], audit: Path) -> None:
        """The restart storm again with the agents' requests in a priority level of one seat that rejects
        what does not fit: the API server answers them 429 with Retry-After."""
        account = next(o for o in chart_objects(self.render) if o["kind"] == "ServiceAccount")["metadata"]
        subject = {"name": account["name"], "namespace": account["namespace"]}
        objects = [
            {
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                "kind": "PriorityLevelConfiguration",
                "metadata": {"name": THROTTLE_NAME},
                "spec": {
                    "type": "Limited",
                    "limited": {
                        "nominalConcurrencyShares": 1,
                        "lendablePercent": 0,
                        "borrowingLimitPercent": 0,
                        "limitResponse": {"type": "Reject"},
                    },
                },
            },
            {
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                "kind": "FlowSchema",
                "metadata": {"name": THROTTLE_NAME},
                "spec": {
                    "priorityLevelConfiguration": {"name": THROTTLE_NAME},
                    "matchingPrecedence": THROTTLE_PRECEDENCE,
                    "distinguisherMethod": {"type": "ByUser"},
                    "rules": [
                        {
                            "subjects": [
                                {
                                    "kind": "ServiceAccount",
                                    "serviceAccount": subject,
                                }
                            ],
                            "resourceRules": [
                                {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": True,
                                 "namespaces": ["*"]}
                            ],
                            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                        }
                    ],
                },
            },
        ]  # fmt: skip
        cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
        try:
            self._restart_storm(probe, agents, audit, name="throttled_restart")
        finally:
            cluster.kubectl("delete", "flowschema,prioritylevelconfiguration", THROTTLE_NAME, check=False)

    def _apiserver_restart(self, cluster: Cluster, probe: Probe, agents: list[Agent], audit: Path) -> None:
        figures = self.figures
        watching = self._watch_streams(audit)
        cluster.stop_component("kube-apiserver")
        time.sleep(self.outage_seconds)  # the outage itself: the agents find the API server gone meanwhile
        # Watches count from the API server's start: an agent may open one before /readyz says ok.
        starting = time.time()
        cluster.start_apiserver()
        back = time.time()

        def reopened() -> bool:
            opened = Counter(r.node for r in read_audit(audit, starting, time.time()) if r.verb == "watch")
            return all(opened[a.node] >= watching for a in agents)

        figures["apiserver_restart_outage_seconds"] = self.outage_seconds
        figures["apiserver_restart_watches_back_seconds"] = round(
            self._until("watches open again after the API server restart", reopened), 2
        )
        time.sleep(5.0)
        records = read_audit(audit, back - self.outage_seconds - 5.0, time.time())
        watches = [r for r in records if r.verb == "watch"]
        resumed = [r for r in watches if "resourceVersion=" in r.uri and "resourceVersion=&" not in r.uri]
        figures["apiserver_restart_watches_per_agent"] = round(len(watches) / len(agents), 2)
        figures["apiserver_restart_watches_resumed_share"] = round(len(resumed) / max(1, len(watches)), 2)
        lists = [r for r in records if r.verb in ("list", "get")]
        figures["apiserver_restart_reads_per_agent"] = round(len(lists) / len(agents), 2)
        figures["apiserver_restart_densest_agent_second"] = densest_second(records)

    def _watch_streams(self, audit: Path) -> int:
        """How many watches an agent of this mode holds: the distinct watched paths of the first agent."""
        records = read_audit(audit, 0.0, time.time())
        first = next((r.node for r in records if r.verb == "watch"), None)
        return len(
            {r.uri.split("?")[0] + r.resource for r in records if r.node == first and r.verb == "watch"}
        )

    def _fault_storm(self, probe: Probe, agents: list[Agent], audit: Path) -> None:
        figures = self.figures
        hit = agents[: max(1, math.ceil(len(agents) * FAULT_SHARE))]
        names = {agent.node for agent in hit}
        began = time.time()
        for _ in range(FAULT_FLIPS):
            for agent in hit:
                agent.write_state({"unhealthy": list(range(CHIPS))})
            time.sleep(FAULT_PHASE_SECONDS)
            for agent in hit:
                agent.write_state({})
            time.sleep(FAULT_PHASE_SECONDS)
        time.sleep(FAULT_SETTLE_SECONDS)
        records = [r for r in read_audit(audit, began, time.time()) if r.node in names]
        writes = [r for r in records if r.verb in WRITES]
        by_resource = Counter(r.resource for r in writes)
        figures["fault_storm_nodes"] = len(hit)
        figures["fault_storm_health_changes_per_node"] = 2 * FAULT_FLIPS
        figures["fault_storm_writes_per_node"] = round(len(writes) / len(hit), 1)
        figures["fault_storm_writes_per_node_by_resource"] = {
            k: round(v / len(hit), 1) for k, v in by_resource.most_common()
        }
        # Each chip's turns, as the kubelet sees them: what a write per turn per chip would have cost.
        figures["fault_storm_chip_turns_per_node"] = 2 * FAULT_FLIPS * CHIPS
        figures["fault_storm_requests_per_node"] = round(len(records) / len(hit), 1)

    def _etcd_outage(self, cluster: Cluster, probe: Probe, agents: list[Agent], audit: Path) -> None:
        """etcd stopped for a minute (the API server answers 5xx to what it cannot serve from its cache) while
        a chip of every agent turns Unhealthy: the agents' requests meanwhile, and the time from etcd's return
        until every node's published state (device-info ConfigMap, or ResourceSlices) shows the chip."""
        figures = self.figures
        driver = DRA_DRIVER if self.mode == "dra" else ""
        cluster.stop_component("etcd")
        began = time.time()
        for agent in agents:
            agent.write_state({"unhealthy": [0]})
        time.sleep(ETCD_OUTAGE_SECONDS)
        cluster.start_etcd()
        back = time.time()
        figures["etcd_outage_seconds"] = ETCD_OUTAGE_SECONDS
        figures["etcd_outage_converged_seconds"] = round(
            self._until(
                "the chip's fault published after etcd's return",
                lambda: probe.ask("unhealthy_published", driver=driver)["count"] >= len(agents),
            ),
            2,
        )
        during = read_audit(audit, began, back)
        figures["etcd_outage_requests_per_agent"] = round(len(during) / len(agents), 1)
        figures["etcd_outage_refused"] = sum(1 for r in during if r.code >= 500 or r.code == 429)
        figures["etcd_outage_densest_agent_second"] = densest_second(during)
        gaps = retry_gaps(read_audit(audit, began, time.time()))
        figures["etcd_outage_retry_gap_min_median_s"] = (
            [round(min(gaps), 3), round(statistics.median(gaps), 3)] if gaps else []
        )
        for agent in agents:
            agent.write_state({})
        self._until(
            "the chip Healthy again after the etcd outage",
            lambda: probe.ask("unhealthy_published", driver=driver)["count"] == 0,
        )


# -- the whole run ----------------------------------------------------------------------------------------

COLUMNS = (
    ("requests_per_agent_hour", "requests/agent/h"),
    ("watches_per_agent", "watches/agent"),
    ("bytes_per_agent_hour", "bytes/agent/h"),
    ("apiserver_cpu_seconds_per_agent_hour", "API CPU s/agent/h"),
    ("start_seconds", "start s"),
    ("restart_storm_seconds", "restart storm s"),
    ("restart_storm_429", "429s"),
    ("restart_storm_peak_inflight", "peak in-flight"),
    ("restart_storm_densest_agent_second", "densest agent second"),
    ("throttled_restart_seconds", "throttled restart s"),
    ("throttled_restart_429", "throttled 429s"),
    ("throttled_restart_retry_gap_min_median_s", "retry gap after 429/5xx, min/median s"),
    ("apiserver_restart_watches_back_seconds", "API restart: watches back s"),
    ("apiserver_restart_watches_resumed_share", "resumed share"),
    ("fault_storm_writes_per_node", "fault storm writes/node"),
    ("etcd_outage_requests_per_agent", "etcd down 60 s: requests/agent"),
    ("etcd_outage_converged_seconds", "etcd back -> fault published s"),
)


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| figure | " + " | ".join(r["mode"] for r in results) + " |"]
    lines.append("|---|" + "---|" * len(results))
    for key, title in COLUMNS:
        lines.append(f"| {title} | " + " | ".join(str(r.get(key, "-")) for r in results) + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        "unknown",
    )  # fmt: skip
    memory = int(Path("/proc/meminfo").read_text().split()[1]) // 1024 // 1024
    return {"cpus": os.cpu_count(), "cpu": model, "memory_gib": memory, "python": sys.version.split()[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.scale", description=__doc__.split("\n")[0])
    parser.add_argument("binary", type=Path)
    parser.add_argument("kwok", type=Path)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--modes", default="default,volcano,dra")
    # Past the agents' longest period (the device-info ConfigMap's rewrite and its watch, 300 s): each
    # agent's periodic requests fall in the window once, whatever their phase.
    parser.add_argument("--rest-seconds", type=float, default=310.0)
    parser.add_argument("--outage-seconds", type=float, default=20.0)
    parser.add_argument("--agent-source", type=Path, default=ROOT)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench-scale.json")
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in RENDER_NAMES]
    if unknown:
        print(
            f"bench-scale: no mode {', '.join(unknown)}: the modes are {', '.join(RENDER_NAMES)}",
            file=sys.stderr,
        )
        return 2
    if not 0 < args.agents <= args.nodes:
        print(f"bench-scale: --agents {args.agents} must be 1 to --nodes ({args.nodes})", file=sys.stderr)
        return 2
    # Stopped by SIGTERM (a timeout, make's interruption): the clusters and agents are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    source = args.agent_source.resolve()
    compiled = tempfile.TemporaryDirectory(prefix="ascale-api-", dir="/tmp")
    api = compile_api(Path(compiled.name))
    results: list[dict[str, Any]] = []
    began = datetime.now(UTC)
    for mode in modes:
        print(f"bench-scale: {mode}: {args.nodes} nodes, {args.agents} agents", file=sys.stderr, flush=True)
        run = ModeRun(
            mode, args.binary, args.kwok, args.nodes, args.agents, args.rest_seconds, args.outage_seconds,
            source, api,
        )  # fmt: skip
        try:
            results.append(run.run())
        except (ScaleError, ClusterError) as exc:
            print(f"bench-scale: {exc}", file=sys.stderr)
            return 1
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "date": began.isoformat(timespec="seconds"),
                    "machine": machine(),
                    "agent_source": str(source),
                    "modes": results,
                },
                indent=2,
            )
            + "\n"
        )
    compiled.cleanup()
    print(table(results))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
