"""`make run-dra`: the agent as a DRA driver on the fake backend (two 310P3 chips, chip 1 dynamic: carved into
vNPUs by the claims prepared on it), against the test suite's Kubernetes API emulator and DRA kubelet
stand-in, in a scratch directory under /tmp. It shows the registration, the ResourceSlices (the dynamic chip's
counter set and the templates it offers), two claims of devices picked from what was published (the whole
chip 0, and a vir04 carved from chip 1) and one of a device the node does not have, with what the driver
answered for each (the third's error), their CDI specs, and the health stream's changes; Ctrl-C (or SIGTERM)
stops it, removes the scratch directory and exits 0.
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
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

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
    slices = apiserver.wait_for(lambda: apiserver.list("resourceslices"), _whole_pool)
    devices = [device for found in slices for device in found["spec"].get("devices", ())]
    for found in slices:
        for counters in found["spec"].get("sharedCounters", ()):
            amounts = ", ".join(f"{name} {c['value']}" for name, c in counters["counters"].items())
            print(f">> counter set {counters['name']} (a dynamic chip): {amounts}")
    offers: dict[str, list[str]] = {}
    for device in devices:
        attributes = {k: next(iter(v.values())) for k, v in device["attributes"].items()}
        if "template" in attributes:
            offers.setdefault(str(attributes["parent"]), []).append(str(attributes["template"]))
        else:
            print(f">> slice device {device['name']}: {attributes} {device.get('capacity', {})}")
    for parent, templates in offers.items():
        counted = ", ".join(f"{t} x{templates.count(t)}" for t in dict.fromkeys(templates))
        print(f">> {parent} offers, from its counter set: {counted}")
    claims = {
        "train": _first(devices, lambda attributes: "template" not in attributes),
        "infer": _first(devices, lambda attributes: attributes.get("template") == {"string": "vir04"}),
        "elsewhere": "npu-7",  # what the driver answers for a device the node does not have
    }
    asked = []
    for name, device in claims.items():
        if device is None:
            print(f">> no device for claim {name} in the slices")
            continue
        uid = apiserver.put_claim(name, [device], driver=DRIVER, pool=NODE)
        print(f">> ResourceClaim {name}: {device}")
        asked.append(dra_v1.Claim(namespace="default", uid=uid, name=name))
    answer = await kubelet.prepare(asked)
    for claim in asked:
        prepared = answer.claims[claim.uid]
        if prepared.error:
            print(f">> NodePrepareResources {claim.name}: error: {prepared.error}")
        else:
            ids = [id_ for device in prepared.devices for id_ in device.cdi_device_ids]
            print(f">> NodePrepareResources {claim.name}: {ids}")
    for spec in sorted((directory / "cdi").glob("*.json")):
        print(f">> {spec}:\n{json.dumps(json.loads(spec.read_text()), indent=1)}")
    state = directory / "state.json"
    print(f"\n>> Health stream; script a fault with: echo '{{\"unhealthy\": [1]}}' > {state}")
    async with kubelet.watching() as updates:
        shown, said = 0, ""
        while True:
            await updates.wait_for(partial(_newer, updates, shown), "an update", timeout=3600)
            shown = len(updates.seen)
            if (now := _health(updates.seen[-1])) != said:
                print(f">> NodeWatchResources: {now}")
                said = now


def _health(devices: dict[str, tuple[str, str]]) -> str:
    """One line: each device that is not HEALTHY with its reason, and how many are."""
    others = [
        f"{name} {health} ({reason})" for name, (health, reason) in devices.items() if health != "HEALTHY"
    ]
    return "; ".join([*others, f"{len(devices) - len(others)} of {len(devices)} devices HEALTHY"])


def _whole_pool(slices: list[dict[str, Any]]) -> bool:
    """Every slice of the pool's newest generation is there."""
    if not slices:
        return False
    newest = max(found["spec"]["pool"]["generation"] for found in slices)
    current = [found for found in slices if found["spec"]["pool"]["generation"] == newest]
    return len(current) == current[0]["spec"]["pool"]["resourceSliceCount"]


def _first(devices: list[dict[str, Any]], wanted: Callable[[dict[str, Any]], bool]) -> str | None:
    return next((str(device["name"]) for device in devices if wanted(device["attributes"])), None)


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
        (directory / "config.yaml").write_text('vnpu: {"1": {dynamic: true}}\n')
        for kubelets_own in ("plugins", "plugins_registry"):  # a kubelet makes them; the agent waits for them
            (directory / "kubelet" / kubelets_own).mkdir(parents=True)
        apiserver = ApiServer(directory)
        apiserver.start()
        apiserver.put("nodes", {"metadata": {"name": NODE}})
        agent = AgentProcess(
            [
                "run",
                f"--config={directory / 'config.yaml'}",
                "--backend=fake",
                "--fake-model=310P3",
                "--fake-chips=2",
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
