"""Allocate latency and throughput from a grpcio client over the unix socket, against a grpcio (C-core)
server in its own process that answers the same bytes, in the same run; and beside it the DRA driver's
NodePrepareResources for one claim of two chips (the claim read before: what a kubelet's call costs once the
agent knows the claim), with the Kubernetes API emulator of the tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpclib.exceptions import GRPCError

from ascend_agent._proto.v1beta1 import AllocateRequest, ContainerAllocateRequest
from ascend_agent.backends._container import container_base
from ascend_agent.kubelet.deviceplugin.service import MAX_CONTAINERS, MAX_REQUEST, DevicePluginService
from ascend_agent.model import Chip, DeviceNode
from bench._common import ROOT, Row, grpc_api, kubelet, quick, report, start_agent, stats
from tests.support.apiserver import ApiServer
from tests.support.http_probe import free_port, get, wait_answer
from tests.support.kubelet_standin import compile_proto


def _sequential(stub: Any, request: Any, calls: int) -> list[float]:
    for _ in range(calls // 10):
        stub.Allocate(request)
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        stub.Allocate(request)
        samples.append(time.perf_counter() - started)
    return samples


def _concurrent(stub: Any, request: Any, calls: int, workers: int = 16) -> tuple[list[float], float]:
    samples: list[float] = []
    lock = threading.Lock()

    def work() -> None:
        mine = _sequential(stub, request, calls // workers)
        with lock:
            samples.extend(mine)

    started = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return samples, len(samples) / (time.perf_counter() - started)


def _serve_reference(socket: str, answers_file: str) -> None:
    """The reference, in its own process like our agent: a grpcio server whose Allocate returns, for each
    request's bytes, the bytes our agent returned."""
    answers = {
        bytes.fromhex(k): bytes.fromhex(v) for k, v in json.loads(Path(answers_file).read_text()).items()
    }
    handler = grpc.method_handlers_generic_handler(
        "v1beta1.DevicePlugin",
        {"Allocate": grpc.unary_unary_rpc_method_handler(lambda request, context: answers[request])},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.read()  # until the benchmark closes our stdin
    server.stop(0)


def _start_reference(answers: dict[bytes, bytes]) -> tuple[subprocess.Popen[str], Path]:
    directory = Path(tempfile.mkdtemp(prefix="bench-ref-", dir="/tmp"))
    answers_file = directory / "answers.json"
    answers_file.write_text(json.dumps({k.hex(): v.hex() for k, v in answers.items()}))
    socket = directory / "ref.sock"
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.allocate", "--serve-reference", str(socket), str(answers_file)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process, socket


def _worst_requests(repetitions: int) -> list[Row]:
    """What the largest requests the plugin socket accepts cost the event loop, in the service itself: 64 KiB
    full of unknown fields, and the most containers one call may name, each a chip set not seen before."""
    service = DevicePluginService("huawei.com/Ascend910", on_stream_change=lambda: None)
    chips = [Chip.make(i, "910B4", numa_node=i // 4) for i in range(8)]
    service.publish({chip.device_id: chip for chip in chips}, None, _REAL_CONTAINER)
    rows = []
    junk = b"\x10\x01" * ((MAX_REQUEST - 2) // 2)
    times = []
    for n in range(repetitions):
        request = junk + b"\x18" + bytes([n % 128])  # every request new: none is answered from the cache
        started = time.perf_counter()
        with contextlib.suppress(GRPCError):
            service.allocate(request)
        times.append(time.perf_counter() - started)
    median, p99 = stats(times)
    rows.append(
        Row("64 KiB request of unknown fields, decode", median * 1e3, p99 * 1e3, "ms", "< 10", p99 < 0.01)
    )
    ids = [chip.device_id for chip in chips]
    times = []
    for n in range(repetitions):
        sets = [[ids[(k + c) % 8] for k in range(1 + (c + n) % 8)] for c in range(MAX_CONTAINERS)]
        request = AllocateRequest(container_requests=[ContainerAllocateRequest(devices_ids=s) for s in sets])
        # No devices, then the chips again: the service forgets every answer, so each chip set is built anew.
        service.publish({}, None, _REAL_CONTAINER)
        service.publish({chip.device_id: chip for chip in chips}, None, _REAL_CONTAINER)
        started = time.perf_counter()
        service.allocate(bytes(request))
        times.append(time.perf_counter() - started)
    median, p99 = stats(times)
    rows.append(
        Row(
            f"{MAX_CONTAINERS} containers, all new chip sets",
            median * 1e3,
            p99 * 1e3,
            "ms",
            "< 10",
            p99 < 0.01,
        )
    )
    return rows


# What the fake backend hands a container besides its chips: management devices, no driver mounts.
_REAL_CONTAINER = container_base(
    "plain",
    [DeviceNode(f"/dev/{name}", f"/dev/{name}") for name in ("davinci_manager", "devmm_svm", "hisi_hdc")],
)


def _volcano_pod(n: int, node: str) -> dict[str, Any]:
    """A pod Volcano placed on ``node`` (bound: PodScheduled): two chips (those of pod ``n - 32`` again), its
    own predicate-time."""
    chips = f"Ascend910-{2 * n % _VOLCANO_CHIPS},Ascend910-{(2 * n + 1) % _VOLCANO_CHIPS}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"job-{n}",
            "namespace": "bench",
            "uid": f"uid-{n}",
            "annotations": {"huawei.com/Ascend910": chips, "predicate-time": str(1_000_000 + n)},
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "volcano",
            "containers": [
                {"name": "main", "image": "x", "resources": {"limits": {"huawei.com/Ascend910": "2"}}}
            ],
        },
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
    }


_VOLCANO_NODE = "bench-node"
# The node's chips in the --volcano rows: pod n names the chips of pod n - 32 again, which ended by then.
_VOLCANO_CHIPS = 64
_VOLCANO_POD_LIFE = 16


def _sequential_pods_ending(
    stub: Any, request: Any, calls: int, url: str, metrics_port: int
) -> tuple[list[float], int]:
    """As :func:`_sequential`, and the pods end as they would (a pod's chips are free again only then: the
    agent never hands over a chip a pod still has): after every :data:`_VOLCANO_POD_LIFE` calls, the pods
    taken in the block of calls before are deleted, not timed, and the next call waits until the agent's
    ``ascend_agent_volcano_chips_taken`` says its watch saw them go (only the last block's chips taken).
    The samples, and how many times /metrics was read."""
    samples = []
    reads = 0

    def seen_go(body: str) -> bool:
        nonlocal reads
        reads += 1
        return _chips_taken(body) == 2 * _VOLCANO_POD_LIFE

    for n in range(calls // 10 + calls):
        started = time.perf_counter()
        stub.Allocate(request)
        if n >= calls // 10:
            samples.append(time.perf_counter() - started)
        done = n + 1
        if done % _VOLCANO_POD_LIFE == 0 and done >= 2 * _VOLCANO_POD_LIFE:
            for ended in range(done - 2 * _VOLCANO_POD_LIFE, done - _VOLCANO_POD_LIFE):
                path = f"{url}/api/v1/namespaces/bench/pods/job-{ended}"
                with urllib.request.urlopen(urllib.request.Request(path, method="DELETE"), timeout=10):
                    pass
            wait_answer(
                metrics_port,
                "/metrics",
                lambda _, body: seen_go(body),
                what=f"ascend_agent_volcano_chips_taken {2 * _VOLCANO_POD_LIFE}",
            )
    return samples, reads


def _metrics_read_cpu(pid: int, port: int, reads: int = 50) -> float:
    """The agent's CPU seconds for one read of its /metrics, over ``reads`` of them."""
    cpu = _cpu_seconds(pid)
    for _ in range(reads):
        get(port, "/metrics")
    return (_cpu_seconds(pid) - cpu) / reads


def _chips_taken(metrics: str) -> float | None:
    """``ascend_agent_volcano_chips_taken`` in the agent's /metrics answer."""
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        if name == "ascend_agent_volcano_chips_taken":
            return float(value)
    return None


def _split_cpus() -> tuple[set[int], set[int]]:
    """The CPUs for the agent and the client, and the one for the API emulator. On a cluster the API server
    is another machine; here the emulator (milliseconds of CPU for each patch and watch event) gets a CPU of
    its own, so that it never takes the agent's. One CPU: all share it."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return set(cpus), set(cpus)
    return set(cpus[:-1]), {cpus[-1]}


def _serve_apiserver(directory: str, pods: int) -> None:
    """The API emulator in its own process (its work must not share the client's interpreter lock), with
    the node and ``pods`` pods Volcano placed on it; prints its URL, then serves until stdin closes. It runs
    on its own CPU (:func:`_split_cpus`) and at the lowest priority."""
    os.sched_setaffinity(0, _split_cpus()[1])
    os.nice(19)
    server = ApiServer(Path(directory))
    server.start()
    server.put("nodes", {"metadata": {"name": _VOLCANO_NODE}})
    for n in range(pods):
        server.put("pods", _volcano_pod(n, _VOLCANO_NODE))
    sys.stdout.write(server.url + "\n")
    sys.stdout.flush()
    sys.stdin.read()
    server.stop()


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _volcano_rows(api: Any, calls: int) -> tuple[list[Row], dict[str, Any]]:
    """Allocate of 2 chips with ``--volcano`` (every pod in the agent's cache from the start: each call takes
    the next one by predicate-time and queues its patch) beside the same agent without it, both with the
    cluster side on against the API emulator, in the same run."""
    pb, _ = api
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=["Ascend910-0", "Ascend910-1"])]
    )
    directory = Path(tempfile.mkdtemp(prefix="bench-kube-", dir="/tmp"))
    server = subprocess.Popen(
        # _sequential's warm-up calls take pods too.
        [
            sys.executable,
            "-m",
            "bench.allocate",
            "--serve-apiserver",
            str(directory),
            str(calls + calls // 10),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    url = server.stdout.readline().strip()
    assert url.startswith("http")
    p99s: dict[str, float] = {}
    rows: list[Row] = []
    everywhere = os.sched_getaffinity(0)
    os.sched_setaffinity(0, _split_cpus()[0])  # the client's, and the agent's (started from here)
    try:
        for mode in ("plain", "--volcano"):
            flags = ["--kubeconfig", str(directory / "kubeconfig"), "--node-name", _VOLCANO_NODE]
            flags += ["--fake-chips", str(_VOLCANO_CHIPS)]
            metrics_port = free_port()
            if (
                mode != "plain"
            ):  # the bench waits on the agent's pod watch there (read by the bench only then)
                flags += ["--metrics-address", f"127.0.0.1:{metrics_port}"]
            with kubelet(api) as standin:
                agent = start_agent(standin.directory, *flags, *([mode] if mode != "plain" else []))
                try:
                    standin.wait_registrations(1)
                    # The pod watch starts after the registration, with a list of every pod: deletions made
                    # meanwhile are lost to it (the emulator has no resourceVersion to watch from).
                    time.sleep(3.0 if mode != "plain" else 0.0)
                    channel, stub = standin.plugin_stub()
                    with channel:
                        cpu = _cpu_seconds(agent.proc.pid)
                        reads = 0
                        if mode == "plain":  # the pods are the --volcano run's
                            samples = _sequential(stub, request, calls)
                        else:
                            samples, reads = _sequential_pods_ending(stub, request, calls, url, metrics_port)
                        # The patches of the last calls are still being written: their CPU counts too.
                        time.sleep(1.0 if mode != "plain" else 0.0)
                        cpu = _cpu_seconds(agent.proc.pid) - cpu
                        if reads:  # the bench's own reads of /metrics are not the agent's work per Allocate
                            cpu -= reads * _metrics_read_cpu(agent.proc.pid, metrics_port)
                finally:
                    agent.close()
            median, p99 = stats(samples)
            p99s[mode] = p99
            rows.append(Row(f"{mode}, 2 chips, sequential, cluster side on", median * 1e3, p99 * 1e3, "ms"))
            per_call = cpu / (calls + calls // 10)
            rows.append(
                Row(f"{mode}, agent CPU per Allocate (patch and watch included)", per_call * 1e3, None, "ms")
            )
    finally:
        os.sched_setaffinity(0, everywhere)
        server.stdin.close()
        server.wait(10)
    gap = p99s["--volcano"] - p99s["plain"]
    rows.append(Row("--volcano p99 - plain p99", gap * 1e3, None, "ms", "<= 2", gap <= 0.002))
    return rows, {"volcano_p99_gap_ms": gap * 1e3}


def _dra_prepare(calls: int) -> list[Row]:
    """NodePrepareResources (v1) of one claim with two chips from a grpcio client, the agent in DRA mode
    on the fake backend: each call writes the claim's CDI spec and the checkpoint (an unprepare after each
    call removes them again, not timed); and the same call again while the claim is prepared (from memory)."""
    directory = Path(tempfile.mkdtemp(prefix="bench-dra-", dir="/tmp"))
    (directory / "api").mkdir()
    pb, pb_grpc = compile_proto(directory / "api", "dra/v1/api.proto")
    apiserver = ApiServer(directory)
    apiserver.start()
    uid = "0d7c9b1e-7f0a-4d1e-9a51-3f4f2b8c0a11"
    apiserver.put("nodes", {"metadata": {"name": "bench-node"}})
    apiserver.put(
        "resourceclaims",
        {
            "metadata": {"name": "train", "namespace": "default", "uid": uid},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "npus", "driver": "npu.huawei.com", "pool": "bench-node", "device": d}
                            for d in ("npu-0", "npu-1")
                        ]
                    }
                }
            },
        },
    )
    kubelet_dir = directory / "kubelet" / "device-plugins"
    for kubelets_own in ("plugins", "plugins_registry"):  # a kubelet makes them; the agent waits for them
        (directory / "kubelet" / kubelets_own).mkdir(parents=True)
    agent = start_agent(
        kubelet_dir,
        "--kubelet-api=dra",
        f"--kubeconfig={apiserver.kubeconfig}",
        "--node-name=bench-node",
        f"--cdi-spec-dir={directory / 'cdi'}",
    )
    try:
        agent.wait_log("Serving DRA driver")
        # The cluster side (and with it the claim reader) loads once the driver is registered, or after 2 s.
        apiserver.wait_for(lambda: apiserver.list("resourceslices"), bool)
        socket = directory / "kubelet" / "plugins" / "npu.huawei.com" / "dra.sock"
        channel = grpc.insecure_channel(f"unix://{socket}")
        stub = pb_grpc.DRAPluginStub(channel)
        claims = [pb.Claim(namespace="default", uid=uid, name="train")]
        prepare = pb.NodePrepareResourcesRequest(claims=claims)
        unprepare = pb.NodeUnprepareResourcesRequest(claims=claims)
        answer = stub.NodePrepareResources(prepare).claims[uid]
        assert not answer.error and len(answer.devices) == 2, answer
        stub.NodeUnprepareResources(unprepare)
        fresh, again = [], []
        for _ in range(calls):
            started = time.perf_counter()
            stub.NodePrepareResources(prepare)
            fresh.append(time.perf_counter() - started)
            started = time.perf_counter()
            stub.NodePrepareResources(prepare)
            again.append(time.perf_counter() - started)
            stub.NodeUnprepareResources(unprepare)
        channel.close()
    finally:
        agent.close()
        apiserver.stop()
    fresh_med, fresh_p99 = stats(fresh)
    again_med, again_p99 = stats(again)
    return [
        Row(
            "DRA NodePrepareResources, 1 claim, 2 chips (cached claim)",
            fresh_med * 1e3,
            fresh_p99 * 1e3,
            "ms",
        ),
        Row("DRA NodePrepareResources, the same claim again", again_med * 1e3, again_p99 * 1e3, "ms"),
    ]


def main() -> None:
    calls = 500 if quick() else 2000
    api = grpc_api()
    pb, pb_grpc = api
    rows: list[Row] = []
    with kubelet(api) as standin:
        agent = start_agent(standin.directory)
        try:
            standin.wait_registrations(1)
            requests = {
                n: pb.AllocateRequest(
                    container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=[f"Ascend910-{i}" for i in range(n)])
                    ]
                )
                for n in (1, 8)
            }
            channel, ours = standin.plugin_stub()
            raw = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")  # no deserializer: the wire bytes
            answers = {r.SerializeToString(): raw(r.SerializeToString()) for r in requests.values()}
            server, socket = _start_reference(answers)
            ref_channel = grpc.insecure_channel(f"unix://{socket}")
            reference = pb_grpc.DevicePluginStub(ref_channel)
            assert reference.Allocate(requests[8]) == ours.Allocate(requests[8])
            figures: dict[str, Any] = {}
            for n, request in requests.items():
                ours_med, ours_p99 = stats(_sequential(ours, request, calls))
                ref_med, ref_p99 = stats(_sequential(reference, request, calls))
                ours_c, ours_rate = _concurrent(ours, request, calls * 2)
                _, ref_rate = _concurrent(reference, request, calls * 2)
                ratio = ours_med / ref_med
                figures[f"{n} chips"] = {
                    "ratio_median": ratio,
                    "ratio_p99": ours_p99 / ref_p99,
                    "calls_per_s_16way": ours_rate,
                    "reference_calls_per_s_16way": ref_rate,
                }
                rows += [
                    Row(
                        f"ours, {n} chip(s), sequential",
                        ours_med * 1e3,
                        ours_p99 * 1e3,
                        "ms",
                        "p99 < 3",
                        ours_p99 < 0.003,
                    ),
                    Row(f"reference, {n} chip(s), sequential", ref_med * 1e3, ref_p99 * 1e3, "ms"),
                    Row(
                        f"ours / reference, {n} chip(s)",
                        ratio,
                        ours_p99 / ref_p99,
                        "x",
                        "median <= 1.5",
                        ratio <= 1.5,
                    ),
                    Row(f"ours, {n} chip(s), 16-way", stats(ours_c)[0] * 1e3, stats(ours_c)[1] * 1e3, "ms"),
                    Row(f"ours, {n} chip(s), 16-way throughput", ours_rate, None, "calls/s"),
                    Row(f"reference, {n} chip(s), 16-way throughput", ref_rate, None, "calls/s"),
                ]
            channel.close()
            ref_channel.close()
            assert server.stdin is not None
            server.stdin.close()
            server.wait(10)
        finally:
            agent.close()
    rows += _worst_requests(20 if quick() else 100)
    rows += _dra_prepare(200 if quick() else 1000)
    volcano_rows, volcano = _volcano_rows(api, calls)
    rows += volcano_rows
    report("allocate", rows, {"ratios": figures, **volcano})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-reference"]:
        _serve_reference(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["--serve-apiserver"]:
        _serve_apiserver(sys.argv[2], int(sys.argv[3]))
    else:
        main()
