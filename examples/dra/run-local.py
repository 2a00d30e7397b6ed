"""`make run-dra`: the agent as a DRA driver on the fake backend, against the test suite's Kubernetes API
emulator and DRA kubelet stand-in, in a scratch directory under /tmp. It shows the registration, the
ResourceSlice, a claim of two chips prepared (its CDI spec) and the health stream; Ctrl-C (or SIGTERM) stops
it, removes the scratch directory and exits 0.
Script a fault meanwhile: echo '{"unhealthy": [1]}' > <scratch>/state.json."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ascend_agent._proto.dra.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
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


def _a_job_of_its_own() -> Callable[[], None]:
    """On a terminal, run as a job of its own that the terminal signals alone: Ctrl-C then reaches this
    walk-through and the agent, not what started them (make would die of it and report "Interrupt").
    SIGTERM and SIGHUP stop it as Ctrl-C does. The function returned gives the terminal back."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda *_: signal.raise_signal(signal.SIGINT))
    if not os.isatty(0) or os.tcgetpgrp(0) != os.getpgrp() or os.getpgrp() == os.getpid():
        return lambda: None  # not on a terminal, not in its foreground, or a job of its own already
    starter = os.getpgrp()
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # handing the terminal over from another group
    os.setpgid(0, 0)
    os.tcsetpgrp(0, os.getpgrp())

    def give_back() -> None:
        with contextlib.suppress(OSError):  # the starter's group is gone
            os.tcsetpgrp(0, starter)

    return give_back


def main() -> int:
    give_back = _a_job_of_its_own()
    directory = Path(tempfile.mkdtemp(prefix="ascend-agent-dra.", dir="/tmp"))
    apiserver: ApiServer | None = None
    agent: AgentProcess | None = None
    try:
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
        asyncio.run(walk(directory, apiserver))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        if agent is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.terminate()
            agent.close()
            print(agent.output)
        if apiserver is not None:
            apiserver.stop()
        shutil.rmtree(directory, ignore_errors=True)
        give_back()
    return 0


if __name__ == "__main__":
    sys.exit(main())
