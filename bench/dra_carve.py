"""NodePrepareResources and NodeUnprepareResources of one claim, with and without carving a vNPU: the agent
as a DRA driver (a process, on the devfs backend over a host tree of two 310P3 chips, both dynamic), the DRA
kubelet stand-in calling it over dra.sock, the API emulator holding the claims. A whole chip is a CDI spec
and the checkpoint; a template device adds ``npu-smi info -t info-vnpu`` and ``set -t create-vnpu`` at
prepare, ``info-vnpu`` and ``destroy-vnpu`` at unprepare. The npu-smi here is the tests' stand-in, a Python
script that starts slower than npu-smi: the carving rows are the driver's own part plus two such runs.
The kubelet gives a call 45 s."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import anyio

from ascend_agent._proto.dra.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from bench._common import Row, quick, report, stats
from tests.support.agent_process import AgentProcess
from tests.support.apiserver import ApiServer
from tests.support.dra_kubelet import DraKubelet
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.vnpu_node import TEMPLATE_INFO, TEMPLATES_310P, info_310p

DRIVER = "npu.huawei.com"
NODE = "node-1"
KUBELET_TIMEOUT = 45.0


async def _rounds(root: Path, apiserver: ApiServer, repetitions: int) -> dict[str, list[float]]:
    host = HostTree(root / "host").add_driver().add_management().add_chips([0, 1])
    npu_smi = FakeNpuSmi(root / "npu-smi")
    npu_smi.set_output("info", info_310p([0, 1]))
    for npu_id in (0, 1):
        npu_smi.set_output(f"info -t template-info -i {npu_id}", TEMPLATE_INFO)
    chips = {(n, 0): {"phys": n, "aicore": 8, "memory": 21, "aicpu": 7, "vnpus": []} for n in (0, 1)}
    npu_smi.set_vnpu_state(host.dev, chips, TEMPLATES_310P)
    registry = root / "kubelet" / "plugins_registry"
    for kubelets_own in (registry, root / "kubelet" / "plugins"):
        kubelets_own.mkdir(parents=True)
    config = root / "config.yaml"
    config.write_text("vnpu: {dynamic: true}\n")
    apiserver.put("nodes", {"metadata": {"name": NODE, "uid": "node-uid-1"}})
    agent = AgentProcess(
        ["run", "--backend=devfs", f"--host-root={host.root}", f"--npu-smi={npu_smi.path}",
         f"--config={config}", f"--kubelet-dir={root / 'kubelet' / 'device-plugins'}",
         f"--cdi-spec-dir={root / 'cdi'}", "--metrics-address=", f"--kubeconfig={apiserver.kubeconfig}",
         f"--node-name={NODE}", "--kubelet-api=dra", "--health-interval=600"]
    )  # fmt: skip
    try:
        kubelet = DraKubelet(registry)
        await kubelet.register(DRIVER)
        await anyio.to_thread.run_sync(lambda: agent.wait_log("ResourceSlices of pool", timeout=30))
        seconds: dict[str, list[float]] = {}
        for turn in range(repetitions):
            for case, device in (("whole chip", "npu-0"), ("vir04 carved", "npu-1-vir04-0")):
                name = f"{case.split()[0]}-{turn}"
                uid = apiserver.put_claim(name, [device], driver=DRIVER, pool=NODE)
                claim = dra_v1.Claim(namespace="default", uid=uid, name=name)
                await kubelet.prepare([claim])  # the claim read from the API server (kept): not measured
                await kubelet.unprepare([claim])
                started = time.monotonic()
                answer = (await kubelet.prepare([claim])).claims[uid]
                seconds.setdefault(f"prepare, {case}", []).append(time.monotonic() - started)
                assert answer.error == "", answer.error
                started = time.monotonic()
                done = (await kubelet.unprepare([claim])).claims[uid]
                seconds.setdefault(f"unprepare, {case}", []).append(time.monotonic() - started)
                assert done.error == "", done.error
        return seconds
    finally:
        agent.close()


def main() -> None:
    repetitions = 5 if quick() else 20
    root = Path(tempfile.mkdtemp(prefix="bench-carve-", dir="/tmp"))
    apiserver = ApiServer(root)
    apiserver.start()
    try:
        seconds = anyio.run(_rounds, root, apiserver, repetitions)
    finally:
        apiserver.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for case, samples in seconds.items():
        median, p99 = stats(samples)
        rows.append(
            Row(case, median * 1e3, p99 * 1e3, "ms", f"< {KUBELET_TIMEOUT * 1e3:g}", p99 < KUBELET_TIMEOUT)
        )
    report("dra_carve", rows)


if __name__ == "__main__":
    main()
