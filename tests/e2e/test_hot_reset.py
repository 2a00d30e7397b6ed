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

from tests.support import CONSTRUCTED, FIXTURES
from tests.support.agent_process import AgentProcess
from tests.support.apiserver import ApiServer
from tests.support.cli import run_cli
from tests.support.fake_libdcmi import build_libdcmi, dcmi_env
from tests.support.host_tree import HostTree
from tests.support.http_probe import free_port, without_node
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
        text = without_node(response.read().decode())
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


def test_the_fake_backend_rehearses_fault_classes_events_and_the_dry_run(
    kubelet: KubeletStandin, apiserver: ApiServer, podresources: PodResourcesStandin, short_dir: Path
) -> None:
    """A fault code per chip in the fake state file goes through the same grading as devfs's: the chip's
    class, its Event and the hot reset's dry run, without hardware. ``{"unhealthy": [5]}`` said nothing."""
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    state = short_dir / "state.json"
    state.write_text(json.dumps({"faults": {"5": ["0x8c03a000"]}}))
    port = free_port()
    process = AgentProcess(
        ["run", "--backend", "fake", "--fake-state", str(state), "--kubelet-dir", str(kubelet.directory),
         "--metrics-address", f"127.0.0.1:{port}", "--health-interval", "1",
         "--pod-resources-socket", str(podresources.path), "--kubeconfig", str(apiserver.kubeconfig),
         "--node-name", NODE, "--hot-reset", "dry-run", "--hot-reset-idle", "1"]
    )  # fmt: skip
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 8 and u.health()["Ascend910-5"] == "Unhealthy")
        process.wait_log(re.escape("Ascend910-5 is Unhealthy: RestartNPU: Alarm, error code 8C03A000 ("))
        said = process.wait_log("Hot reset of Ascend910-5: would run", timeout=15)[0]
        assert (
            "npu-smi set -t reset -i 5 -c 0 -m 1 for Ascend910-5 (RestartNPU, fault codes 8C03A000)" in said
        )
        events = apiserver.wait_for(lambda: _events(apiserver), lambda got: "HotResetDryRun" in got)
        assert "NPURestartNPU" in events
        assert _resets(port, "dry_run") == 1
        # A code the table grades SeparateNPU: no reset would clear it, so the dry run says nothing more.
        state.write_text(json.dumps({"faults": {"5": ["80E18402"], "6": ["8C03A000"]}}))
        process.wait_log("Hot reset of Ascend910-6: would run", timeout=15)
        assert not process.matching("Hot reset of Ascend910-5: would run .*80E18402")
    finally:
        process.close()


def test_the_reset_budget_survives_an_agent_restart(
    kubelet: KubeletStandin, host: HostTree, apiserver: ApiServer, podresources: PodResourcesStandin,
    short_dir: Path,
) -> None:  # fmt: skip
    """One reset allowed per chip: a restarted agent used to start with a full budget and reset the chip
    again; it reads the resets of the agent before from the node and leaves the chip to a person."""
    npu_smi = _setup(host, short_dir / "npu-smi", apiserver)
    npu_smi.set_reset("ok", after={"info": B4_OK})
    limit = ("--hot-reset", "idle", "--hot-reset-idle", "1", "--hot-reset-limit", "1")
    first = _agent(kubelet, host, npu_smi, apiserver, podresources, free_port(), *limit)
    try:
        first.wait_log("Hot reset of Ascend910-5: Ascend910-5 is Healthy again", timeout=30)
    finally:
        first.close()
    kept = json.loads((kubelet.directory.parent / "plugins/ascend-agent/hot-reset-budget.json").read_text())
    assert [(chip["physId"], len(chip["resets"])) for chip in kept["chips"]] == [(5, 1)]
    npu_smi.set_output("info", with_health(B4_OK, 5, "Alarm"))  # the fault is back
    port = free_port()
    second = _agent(kubelet, host, npu_smi, apiserver, podresources, port, *limit)
    try:
        second.wait_log("Hot reset budget from .*chip 5 reset 1 times within 21600 s")
        exhausted = second.wait_log(
            "Hot reset of Ascend910-5: reset 1 times within 21600 s already", timeout=20
        )
        assert "left to a person" in exhausted[0]
        assert npu_smi.resets() == ["set -t reset -i 5 -c 0 -m 1 | Y"], "no second reset"
        assert _resets(port, "exhausted") == 1
    finally:
        second.close()


# Atlas A3: the card a reset takes down with the faulty one is the driver's word, never a guess ------------

A3_OK = (FIXTURES / "Ascend910-A3x16-24.1.rc3.7-info.txt").read_text()
A3_ALARM = (CONSTRUCTED / "Ascend910-A3x16-24.1.rc3.7-info-alarm.txt").read_text()
A3_HEALTH = (
    CONSTRUCTED / "Ascend910-A3-24.1.rc3.7-info-t-health-i-1-c-1-alarm.txt"
).read_text()  # RestartNPU


def _a3_node(host: HostTree, directory: Path) -> FakeNpuSmi:
    host.add_chips(range(16))
    npu_smi = FakeNpuSmi(directory)
    npu_smi.set_output("info", A3_ALARM)
    npu_smi.set_output("info -t health -i 1 -c 1", A3_HEALTH)
    return npu_smi


def test_idle_on_a3_refuses_at_start_unless_the_driver_says_which_card_is_paired(
    kubelet: KubeletStandin, host: HostTree, short_dir: Path
) -> None:
    """The paired card was the one half the node away, a guess: on a board paired otherwise a reset took down
    a card whose pods were never checked. Without the driver's word (here its libdcmi.so cannot be loaded),
    idle stops the start with one line pointing at dry-run."""
    npu_smi = _a3_node(host, short_dir / "npu-smi")
    result = run_cli(
        "run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
        "--kubelet-dir", str(kubelet.directory), "--metrics-address", "", "--hot-reset", "idle", timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("ascend-agent: ")]
    assert line.startswith("ascend-agent: --hot-reset idle: on Atlas A3 ")
    assert "cannot load " in line and "libdcmi.so" in line and "--hot-reset dry-run" in line


def test_a3_resets_with_the_card_the_driver_pairs_and_dry_run_without_it(
    kubelet: KubeletStandin, host: HostTree, apiserver: ApiServer, podresources: PodResourcesStandin,
    short_dir: Path,
) -> None:  # fmt: skip
    """Atlas 9000 A3 SuperPoD boards pair no card (the driver says -1): the group is the faulty card's two
    dies, not four. Without the driver's word, the dry run names the node's A3 chips as one group."""
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    npu_smi = _a3_node(host, short_dir / "npu-smi")
    port = free_port()
    unread = _agent(kubelet, host, npu_smi, apiserver, podresources, port, "--hot-reset", "dry-run",
                    "--hot-reset-idle", "1")  # fmt: skip
    try:
        unread.wait_log("Cannot read from the driver which A3 card is reset with which")
        said = unread.wait_log("Hot reset of Ascend910-3: would run", timeout=20)[0]
        assert "(reset group Ascend910-0, Ascend910-1, " in said and "Ascend910-15)" in said
    finally:
        unread.close()
    build_libdcmi(host.root)
    npu_smi.set_reset("ok", after={"info": A3_OK})
    agent = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--kubelet-dir", str(kubelet.directory), "--metrics-address", f"127.0.0.1:{free_port()}",
         "--health-interval", "1", "--pod-resources-socket", str(podresources.path), "--kubeconfig",
         str(apiserver.kubeconfig), "--node-name", NODE, "--hot-reset", "idle", "--hot-reset-idle", "1"],
        env=dcmi_env(dict.fromkeys(range(8), -1)),
    )  # fmt: skip
    try:
        agent.wait_log("A3 cards the driver resets together: 0 alone, 1 alone, ")
        waiting = agent.wait_log("Hot reset of Ascend910-3: waiting for 1 s", timeout=20)[0]
        assert waiting.endswith("(reset group Ascend910-2, Ascend910-3)"), waiting
        agent.wait_log("Hot reset of Ascend910-3: Ascend910-3 is Healthy again", timeout=30)
        assert [reset.split(" | ")[0] for reset in npu_smi.resets()] == ["set -t reset -i 1 -c 1 -m 1"]
    finally:
        agent.close()
