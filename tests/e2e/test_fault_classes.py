"""Fault classes from the agent as a process: a fake npu-smi prints Huawei's captured health sample (Alarm,
``A4025021 8C03A000 8C084E00``) for one chip; the chip is RestartNPU, Unhealthy to the kubelet, with that
level in the device-info ConfigMap and an ``NPURestartNPU`` Event. An admin's ``mindx-dl-fault-config``
regrades the codes (the chip turns Healthy, SubHealthFault); a bad one is refused in one line, the running
table kept."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from tests.support import FIXTURES
from tests.support.agent_process import AgentProcess
from tests.support.apiserver import ApiServer
from tests.support.cli import run_cli
from tests.support.host_tree import HostTree
from tests.support.http_probe import free_port
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi, with_health
from tests.support.training_fixtures import read

NODE = "node-1"
DEVICE_INFO = f"mindx-dl-deviceinfo-{NODE}"
FAULT_CONFIG = "mindx-dl-fault-config"
# The sample as npu-smi prints it: the capture's first line is the command that printed it.
ALARM = read("npu-smi-info-t-health_fixture-alarm.txt").split("\n", 1)[1]
B4_OK = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()


def _write_map(apiserver: ApiServer, data: dict[str, str], create: bool) -> None:
    """The fault-config map as an admin writes it, through the API server."""
    path = "/api/v1/namespaces/kube-system/configmaps" + ("" if create else f"/{FAULT_CONFIG}")
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": FAULT_CONFIG,
            "namespace": "kube-system"}, "data": data}  # fmt: skip
    request = urllib.request.Request(
        apiserver.url + path,
        data=json.dumps(body).encode(),
        method="POST" if create else "PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status in (200, 201)


def _chip_5_fault(apiserver: ApiServer, level: str) -> dict[str, Any]:
    def entry() -> dict[str, Any] | None:
        found = apiserver.get("configmaps", DEVICE_INFO, "kube-system")
        if found is None:
            return None
        lists = json.loads(found["data"]["DeviceInfoCfg"])["DeviceInfo"]["DeviceList"]
        faults = json.loads(lists.get("huawei.com/Ascend910-Fault", "[]"))
        return next((f for f in faults if f["npu_name"] == "Ascend910-5"), None)

    found: dict[str, Any] = apiserver.wait_for(
        entry, lambda e: e is not None and e["fault_handling"] == level, timeout=15
    )
    return found


def test_the_class_decides_health_deviceinfo_and_events_and_the_fault_config_regrades(
    kubelet: KubeletStandin, host: HostTree, apiserver: ApiServer, short_dir: Path
) -> None:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    host.add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", with_health(B4_OK, 5, "Alarm"))
    npu_smi.set_output("info -t health -i 5 -c 0", ALARM)
    devfs = ["--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
             "--metrics-address", f"127.0.0.1:{free_port()}"]  # fmt: skip
    agent = AgentProcess(
        ["run", *devfs, "--kubelet-dir", str(kubelet.directory), "--health-interval", "1",
         "--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE]
    )  # fmt: skip
    try:
        sick = kubelet.wait_update(lambda u: u.health().get("Ascend910-5") == "Unhealthy", timeout=15)
        assert [d for d, health in sick.health().items() if health != "Healthy"] == ["Ascend910-5"]
        agent.wait_log(re.escape("Ascend910-5 is Unhealthy: RestartNPU: Alarm, error codes A4025021 ("))
        entry = _chip_5_fault(apiserver, "RestartNPU")
        assert (entry["fault_level"], entry["fault_code"]) == ("RestartNPU", "8C03A000,8C084E00,A4025021")
        assert {code: value["fault_level"] for code, value in entry["fault_time_and_level_map"].items()} == {
            "8C03A000": "RestartNPU",
            "8C084E00": "FreeRestartNPU",
            "A4025021": "NotHandleFault",
        }
        apiserver.wait_for(
            lambda: [e["reason"] for e in apiserver.list("events", "default")],
            lambda reasons: "NPURestartNPU" in reasons,
        )

        regraded = {"SubHealthFaultCodes": ["8C03A000", "8C084E00"], "NotHandleFaultCodes": ["A4025021"]}
        _write_map(apiserver, {"faultCode.json": json.dumps(regraded)}, create=True)
        kubelet.wait_update(
            lambda u: set(u.health().values()) == {"Healthy"},
            after=kubelet.updates.index(sick) + 1,
            timeout=15,
        )
        agent.wait_log(f"Fault table from ConfigMap kube-system/{FAULT_CONFIG}: 3 codes")
        assert _chip_5_fault(apiserver, "SubHealthFault")["fault_level"] == "SubHealthFault"
        # `list` reads the codes itself, but shows the class the running agent gives them (its map's).
        listed = json.loads(run_cli("list", *devfs, "--json", timeout=60).stdout)
        (row,) = [r for r in listed if r["id"] == "Ascend910-5"]
        assert (row["health"], row["fault_class"]) == ("Healthy", "SubHealthFault")

        bad_duration = {
            "FaultDuration": [{"EventId": ["8C03A000"], "FaultTimeout": 700, "FaultHandling": "SeparateNPU"}]
        }
        for data, named in (
            (
                {"faultCode.json": '{"SubHealthFaultCodes": [], "Bad": []}'},
                "faultCode.json: unknown key 'Bad'",
            ),
            (
                {"faultCode.json": '{"SubHealthFaultCodes": ["8C03A0ZZ"]}'},
                "'8C03A0ZZ' is not a hex fault code",
            ),
            (
                {"faultCustomization.json": json.dumps(bad_duration)},
                "FaultDuration[0]: FaultTimeout must be a number from 0 to 600, not 700",
            ),
        ):
            refused = len(agent.matching("not applied, keeping the running fault table"))
            _write_map(apiserver, data, create=False)
            found = agent.wait_log("not applied, keeping the running fault table", count=refused + 1)
            assert named in found[-1], found[-1]
        assert "Traceback" not in agent.output
        npu_smi.wait_count("info", npu_smi.count("info") + 2)  # two more reconciles with the kept table
        latest = kubelet.latest()
        assert latest is not None and set(latest.health().values()) == {"Healthy"}, "the running table kept"
    finally:
        agent.close()
