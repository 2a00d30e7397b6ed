"""The hot reset through the whole agent: the devfs backend over a fake npu-smi, the kubelet stand-in, the
PodResources stand-in and the Kubernetes API emulator; what the kubelet sees, the Events on the Node, the
``ResetInfo`` annotation and ``ascend_agent_resets_total``."""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request
from datetime import datetime
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support import FIXTURES
from tests.support.agent_process import AgentProcess
from tests.support.apiserver import ApiServer
from tests.support.host_tree import HostTree
from tests.support.http_probe import free_port
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi, with_health
from tests.support.podresources import PodResourcesStandin
from tests.support.training_fixtures import TRAINING

NODE = "node-1"
B4_OK = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()
ALARM = (TRAINING / "npu-smi-info-t-health_fixture-alarm.txt").read_text()  # 8C03A000: RestartNPU


def _agent(
    kubelet: KubeletStandin, host: HostTree, npu_smi: FakeNpuSmi, apiserver: ApiServer,
    podresources: PodResourcesStandin, port: int, *extra: str,
) -> AgentProcess:  # fmt: skip
    return AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", f"127.0.0.1:{port}",
         "--health-interval", "1", "--pod-resources-socket", str(podresources.path),
         "--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE, *extra]
    )  # fmt: skip


def _resets(port: int, result: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ascend_agent_resets_total" and sample.labels == {"result": result}:
                return float(sample.value)
    return 0.0


def _events(apiserver: ApiServer) -> dict[str, str]:
    return {event["reason"]: event["message"] for event in apiserver.list("events", "default")}


def _setup(host: HostTree, npu_smi_dir: Path, apiserver: ApiServer) -> FakeNpuSmi:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    host.add_chips(range(8))
    npu_smi = FakeNpuSmi(npu_smi_dir)
    npu_smi.set_output("info", with_health(B4_OK, 5, "Alarm"))
    npu_smi.set_output("info -t health -i 5 -c 0", ALARM)
    npu_smi.set_output("info -m", (FIXTURES / "910B4x8-25.0.rc1.1-info-m.txt").read_text())
    return npu_smi


def _stamp(line: str) -> datetime:
    found = re.match(r"^(\S+)Z ", line)
    assert found is not None, line
    return datetime.fromisoformat(found.group(1))


def test_a_reset_cycle_the_kubelet_and_the_cluster_see(
    kubelet: KubeletStandin, host: HostTree, apiserver: ApiServer, podresources: PodResourcesStandin,
    short_dir: Path,
) -> None:  # fmt: skip
    npu_smi = _setup(host, short_dir / "npu-smi", apiserver)
    npu_smi.set_reset("ok", after={"info": B4_OK})
    port = free_port()
    process = _agent(kubelet, host, npu_smi, apiserver, podresources, port, "--hot-reset", "idle",
                     "--hot-reset-idle", "2", "--hot-reset-recover", "20")  # fmt: skip
    try:
        sick = kubelet.wait_update(lambda u: len(u.devices) == 8 and u.health()["Ascend910-5"] == "Unhealthy")
        waiting = process.wait_log("Hot reset of Ascend910-5: waiting for 2 s of no pod and no process")[0]
        # During the reset the whole HCCS box is Unhealthy to the kubelet, then every chip is Healthy again.
        kubelet.wait_update(
            lambda u: set(u.health().values()) == {"Unhealthy"},
            after=kubelet.updates.index(sick) + 1,
            timeout=20,
        )
        back = kubelet.wait_update(
            lambda u: set(u.health().values()) == {"Healthy"},
            after=kubelet.updates.index(sick) + 1,
            timeout=30,
        )
        assert len(back.devices) == 8
        done = process.wait_log("Hot reset of Ascend910-5: Ascend910-5 is Healthy again", timeout=10)[0]
        started = process.matching("Hot reset of Ascend910-5: npu-smi set -t reset -i 5 -c 0 -m 1")
        assert len(started) == 1
        assert npu_smi.resets() == ["set -t reset -i 5 -c 0 -m 1 | Y"]
        events = apiserver.wait_for(lambda: _events(apiserver), lambda got: "HotResetComplete" in got)
        assert events["HotResetStart"].startswith(
            "Hot reset of Ascend910-5: npu-smi set -t reset -i 5 -c 0 -m 1 (RestartNPU, fault codes "
        )
        assert {"HotResetWaiting", "HotResetStart", "HotResetComplete"} <= events.keys()
        assert _resets(port, "succeeded") == 1 and _resets(port, "started") == 1
        print(
            "reset cycle: idle wait start to Healthy "
            f"{(_stamp(done) - _stamp(waiting)).total_seconds():.1f} s, reset start to Healthy "
            f"{(_stamp(done) - _stamp(started[0])).total_seconds():.1f} s"
        )
    finally:
        process.close()


def test_a_reload_that_turns_the_hot_reset_on_starts_it(
    kubelet: KubeletStandin, host: HostTree, apiserver: ApiServer, podresources: PodResourcesStandin,
    short_dir: Path,
) -> None:  # fmt: skip
    """Off at start (its code is not loaded then: test_run_imports), the hot reset is made by the reload that
    turns it on, and its task starts and sees the chip that was already faulty."""
    npu_smi = _setup(host, short_dir / "npu-smi", apiserver)
    config = short_dir / "config.yaml"
    config.write_text("hotResetIdle: 1\n")
    process = _agent(kubelet, host, npu_smi, apiserver, podresources, free_port(), "--config", str(config))
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 8 and u.health()["Ascend910-5"] == "Unhealthy")
        replaced = short_dir / "config.yaml.new"
        replaced.write_text("hotReset: dry-run\nhotResetIdle: 1\n")
        os.replace(replaced, config)
        process.proc.send_signal(signal.SIGHUP)
        process.wait_log("Config applied: hot_reset changed")
        would = "Hot reset of Ascend910-5: would run npu-smi set -t reset -i 5 -c 0 -m 1 for Ascend910-5"
        process.wait_log(would, timeout=20)
        assert npu_smi.resets() == []
    finally:
        process.close()


def test_a_hanging_reset_lands_in_reset_info(
    kubelet: KubeletStandin, host: HostTree, apiserver: ApiServer, podresources: PodResourcesStandin,
    short_dir: Path,
) -> None:  # fmt: skip
    npu_smi = _setup(host, short_dir / "npu-smi", apiserver)
    npu_smi.set_reset("hang")
    podresources.hold("huawei.com/Ascend910", ["Ascend910-1"], "team-a", "train-0", "main")
    port = free_port()
    process = _agent(kubelet, host, npu_smi, apiserver, podresources, port, "--hot-reset", "idle",
                     "--hot-reset-idle", "1", "--hot-reset-timeout", "3")  # fmt: skip
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 8 and u.health()["Ascend910-5"] == "Unhealthy")
        podresources.wait_calls(podresources.calls + 2)
        waits = process.wait_log("Hot reset of Ascend910-5 waits: a pod holds Ascend910-1")
        assert process.matching("Hot reset of") == waits, "a pod holds a chip of the box: no reset, no wait"
        podresources.release_all()
        hung = "Hot reset of Ascend910-5: npu-smi set -t reset -i 5 -c 0 -m 1 did not finish within 3 s"
        process.wait_log(hung, timeout=20)

        def reset_info() -> str:
            node = apiserver.get("nodes", NODE) or {}
            return str((node["metadata"].get("annotations") or {}).get("ResetInfo", ""))

        written = json.loads(apiserver.wait_for(reset_info, bool))
        assert written == {
            "ThirdPartyResetDevs": [],
            "ManualResetDevs": [
                {"CardId": 5, "DeviceId": 0, "AssociatedCardId": -1, "PhyID": 5, "LogicID": 5}
            ],
        }
        assert _resets(port, "hung") == 1
        assert "HotResetFailed" in apiserver.wait_for(
            lambda: _events(apiserver), lambda got: "HotResetFailed" in got
        )
    finally:
        process.close()
