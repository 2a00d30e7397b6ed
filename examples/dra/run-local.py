"""`make run-dra`: the agent as a DRA driver on the fake backend, against the test suite's Kubernetes API
emulator and DRA kubelet stand-in, in a scratch directory under /tmp. It shows the registration, the
ResourceSlice, a claim of two chips prepared (its CDI spec) and the health stream; Ctrl-C stops it.
Script a fault meanwhile: echo '{"unhealthy": [1]}' > <scratch>/state.json."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import uuid
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ascend_agent._proto.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from tests.support.agent_process import AgentProcess
from tests.support.apiserver import ApiServer
from tests.support.dra_kubelet import DraKubelet, HealthUpdates

NODE, DRIVER = "local-node", "npu.huawei.com"


async def walk(directory: Path, apiserver: ApiServer) -> None:
    kubelet = DraKubelet(directory / "kubelet" / "plugins_registry")
    info = await kubelet.register(DRIVER)
    versions = list(info.supported_versions)
    print(f"\n>> GetInfo: {info.type} {info.name} at {info.endpoint}, versions {versions}")
    slices = apiserver.wait_for(lambda: apiserver.list("resourceslices"), bool)
    for device in slices[0]["spec"]["devices"]:
        attributes = {k: next(iter(v.values())) for k, v in device["attributes"].items()}
        print(f">> slice device {device['name']}: {attributes} {device.get('capacity', {})}")
    uid = str(uuid.uuid4())
    apiserver.put(
        "resourceclaims",
        {
            "metadata": {"name": "train", "namespace": "default", "uid": uid},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "npus", "driver": DRIVER, "pool": NODE, "device": d}
                            for d in ("npu-0", "npu-1")
                        ]
                    }
                }
            },
        },
    )
    answer = await kubelet.prepare([dra_v1.Claim(namespace="default", uid=uid, name="train")])
    print(f">> NodePrepareResources: {[list(d.cdi_device_ids) for d in answer.claims[uid].devices]}")
    for spec in sorted((directory / "cdi").glob("*.json")):
        print(f">> {spec}:\n{json.dumps(json.loads(spec.read_text()), indent=1)}")
    state = directory / "state.json"
    print(f"\n>> Health stream; script a fault with: echo '{{\"unhealthy\": [1]}}' > {state}")
    async with kubelet.watching() as updates:
        shown = 0
        while True:
            await updates.wait_for(partial(_newer, updates, shown), "an update", timeout=3600)
            shown = len(updates.seen)
            print(f">> NodeWatchResources: {updates.seen[-1]}")


def _newer(updates: HealthUpdates, shown: int, _: object) -> bool:
    return len(updates.seen) > shown


def main() -> int:
    directory = Path(tempfile.mkdtemp(prefix="ascend-agent-dra.", dir="/tmp"))
    (directory / "state.json").write_text("{}")
    for kubelets_own in ("plugins", "plugins_registry"):  # a kubelet makes them; the agent waits for them
        (directory / "kubelet" / kubelets_own).mkdir(parents=True)
    apiserver = ApiServer(directory)
    apiserver.start()
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    agent = AgentProcess(
        [
            "run",
            "--backend=fake",
            f"--fake-state={directory / 'state.json'}",
            "--kubelet-api=dra",
            f"--kubeconfig={apiserver.kubeconfig}",
            f"--node-name={NODE}",
            f"--kubelet-dir={directory / 'kubelet' / 'device-plugins'}",
            f"--cdi-spec-dir={directory / 'cdi'}",
            "--metrics-address=",
            "--log-level=warning",
        ]
    )
    try:
        asyncio.run(walk(directory, apiserver))
    except KeyboardInterrupt:
        pass
    finally:
        agent.close()
        apiserver.stop()
        print(agent.output)
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
