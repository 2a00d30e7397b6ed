"""Large device lists and preferred allocations: 1024 devices on the stream, 16 chips and 16 x 8 replicas."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ascend_agent._proto.v1beta1 import Device, ListAndWatchResponse, NumaNode, TopologyInfo
from bench._common import Row, grpc_api, kubelet, quick, report, start_agent, stats


def _encode(count: int, iterations: int) -> list[float]:
    devices = [
        Device(id=f"Ascend910-{i}", health="Healthy", topology=TopologyInfo(nodes=[NumaNode(id=i % 2)]))
        for i in range(count)
    ]
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        bytes(ListAndWatchResponse(devices=devices))
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    repetitions = 10 if quick() else 30
    api = grpc_api()
    pb = api[0]
    rows = [
        Row("encode ListAndWatchResponse, 1024 devices", *[v * 1e3 for v in stats(_encode(1024, 50))], "ms")
    ]
    with kubelet(api) as standin:
        state = standin.directory.parent / "state.json"
        state.write_text("{}")
        agent = start_agent(standin.directory, "--fake-chips", "1024", "--fake-state", str(state))
        try:
            standin.wait_registrations(1)
            standin.wait_update(lambda u: len(u.devices) == 1024)
            samples = []
            for i in range(repetitions):
                after = len(standin.updates)
                temporary = state.with_name(".s")
                temporary.write_text(json.dumps({"unhealthy": [i % 1024]} if i % 2 == 0 else {}))
                started = time.monotonic()
                temporary.rename(state)
                update = standin.wait_update(lambda u: len(u.devices) == 1024, after=after)
                samples.append(update.at - started)
            rows.append(
                Row(
                    "1024 devices: change -> full list at the kubelet",
                    *[v * 1e3 for v in stats(samples)],
                    "ms",
                )
            )
        finally:
            agent.close()
    for replicas in (1, 8):
        with kubelet(api) as standin:
            agent = start_agent(
                standin.directory, "--fake-chips", "16", "--fake-model", "910A", "--replicas", str(replicas)
            )
            try:
                standin.wait_registrations(1)
                update = standin.wait_update(lambda u, n=16 * replicas: len(u.devices) == n)
                available = [device[0] for device in update.devices]
                channel, stub = standin.plugin_stub()
                request = pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=available, allocation_size=4
                        )
                    ]
                )
                samples = []
                for _ in range(300 if quick() else 1000):
                    started = time.perf_counter()
                    stub.GetPreferredAllocation(request)
                    samples.append(time.perf_counter() - started)
                channel.close()
            finally:
                agent.close()
        median, p99 = stats(samples)
        name = f"GetPreferredAllocation RPC, 16 chips x {replicas} replica(s)"
        rows.append(Row(name, median * 1e3, p99 * 1e3, "ms", "RPC; see preferred for the computation"))
    preferred = Path(__file__).with_name("results") / "preferred.json"
    report(
        "scale",
        rows,
        {"preferred_in_process": json.loads(preferred.read_text()) if preferred.exists() else None},
    )


if __name__ == "__main__":
    main()
