"""`ascend-agent list --json` on the devfs backend with a fake npu-smi and a fake hccn_tool printing the
shared real outputs: an 8-chip 910B node's device IPs, an A3 node's device IPs, vNIC IPs and super pod; a
hanging or garbage-printing hccn_tool gives chips without an address, never a made-up one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_volcano_allocate import NODE, _allocate, _annotations, _pod
from tests.support import CONSTRUCTED, FIXTURES, volcano_types
from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.apiserver import ApiServer
from tests.support.cli import run_cli
from tests.support.hccl import gather, hccl_json
from tests.support.hccn_fake import FakeHccnTool
from tests.support.host_tree import HostTree
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi, with_health
from tests.support.training_fixtures import per_chip

CONFIGURATION = "ascend.kubectl.kubernetes.io/ascend-910-configuration"

EIGHT = per_chip("hccn_tool-ip-g_fixture-8dev.txt")
A3_IPS = per_chip("hccn_tool-ip-g_A3-log-decoded.txt")
A3_SPOD = per_chip("npu-smi-info-t-spod-info_A3-log-decoded.txt")


@pytest.fixture
def npu_smi(short_dir: Path) -> FakeNpuSmi:
    return FakeNpuSmi(short_dir / "npu-smi")


@pytest.fixture
def tool(short_dir: Path) -> FakeHccnTool:
    return FakeHccnTool(short_dir / "hccn")


def _list(
    host: HostTree, npu_smi: FakeNpuSmi, tool: FakeHccnTool, timeout: str = "30"
) -> tuple[list[dict[str, Any]], str]:
    """``ascend-agent list --json``; its tools given ``timeout`` s, as long as a slow machine needs unless a
    test waits out a hang."""
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "list", "--backend", "devfs", "--host-root", str(host.root),
         "--npu-smi", str(npu_smi.path), "--hccn-tool", str(tool.path), "--npu-smi-timeout", timeout,
         "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout), result.stderr


def test_910b_node_lists_each_chips_device_ip(
    host: HostTree, npu_smi: FakeNpuSmi, tool: FakeHccnTool
) -> None:
    host.add_chips(range(8))
    npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
    for chip, text in EIGHT.items():
        tool.set_output(f"-i {chip} -ip -g", text)
    rows, problems = _list(host, npu_smi, tool)
    assert problems == ""
    assert [(row["id"], row["device_ip"], row["vnic_ip"], row["super_pod"]) for row in rows] == [
        (f"Ascend910-{i}", f"10.10.0.1{i}", None, None) for i in range(8)
    ]
    assert npu_smi.calls_of("info -t spod-info") == []


def test_a3_node_lists_ips_vnic_and_super_pod(
    host: HostTree, npu_smi: FakeNpuSmi, tool: FakeHccnTool
) -> None:
    host.add_chips(range(16))
    npu_smi.set_output("info", (FIXTURES / "Ascend910-A3x16-24.1.rc3.7-info.txt").read_text())
    npu_smi.set_output(
        "info -t board -i 0 -c 0",
        (CONSTRUCTED / "Ascend910-A3-24.1.rc3.7-info-t-board-i-0-c-0.txt").read_text(),
    )
    for die in range(16):
        if die in A3_SPOD:
            tool.set_output(f"-i {die} -ip -g", A3_IPS[die])
            tool.set_output(f"-i {die} -vnic -g", f"vnic link status: UP\nvnic ipaddr: 192.168.2.{die}\n")
            npu_smi.set_output(f"info -t spod-info -i {die // 2} -c {die % 2}", A3_SPOD[die])
        else:  # the capture covers 5 dies: the others say they have nothing
            npu_smi.set_error(
                f"info -t spod-info -i {die // 2} -c {die % 2}",
                "This device does not support get spod info.\n",
            )
    rows, problems = _list(host, npu_smi, tool)
    assert problems == ""
    by_die = {row["phys_id"]: row for row in rows}
    assert by_die[0]["device_ip"] == "10.0.245.11"
    assert by_die[0]["vnic_ip"] == "192.168.2.0"
    assert by_die[11]["super_pod"] == {"super_pod_id": 0, "server_index": 40, "sdid": 169148427, "size": 384}
    assert [die for die, row in by_die.items() if row["device_ip"] is None] == [
        2,
        3,
        4,
        5,
        6,
        7,
        8,
        9,
        13,
        14,
        15,
    ]
    assert all(by_die[die]["super_pod"] is None for die in (2, 15))


@pytest.mark.parametrize("mode", ["hang", "garbage"])
def test_a_bad_hccn_tool_gives_no_address_and_one_line(
    host: HostTree, npu_smi: FakeNpuSmi, tool: FakeHccnTool, mode: str
) -> None:
    host.add_chips(range(8))
    npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
    tool.set_mode(mode)
    rows, problems = _list(host, npu_smi, tool, timeout="1")  # a hang is certain: the fake never answers
    assert [row["device_ip"] for row in rows] == [None] * 8
    assert problems.count("Cannot read the device IP of chips 0, 1, 2, 3, 4, 5, 6, 7") == 1, problems


def test_fake_a3_node_publishes_ips_and_super_pod_through_volcano(
    kubelet: KubeletStandin, apiserver: ApiServer
) -> None:
    """The fake backend's synthetic facts (``--fake-training``) from the agent as a process: the pod's
    ``ascend-910-configuration``, ``baseDeviceInfos``, ``DeviceInfoCfg`` and the node labels; then, the pod
    given Volcano's rank index and an IP, ``ascend-agent ranktable`` prints its valid v1.2 rank table."""
    addresses = [{"type": "Hostname", "address": NODE}, {"type": "InternalIP", "address": "192.168.0.40"}]
    apiserver.put("nodes", {"metadata": {"name": NODE}, "status": {"addresses": addresses}})
    agent = fake_agent(
        kubelet.directory,
        *("--fake-model", "910_9392", "--fake-chips", "16", "--fake-training", "--volcano"),
        *("--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE),
    )
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 16, what="the device list")
        apiserver.put("pods", _pod("train-0", "Ascend910-3,Ascend910-5", "1700000000000"))
        _allocate(kubelet, ["Ascend910-0", "Ascend910-1"])
        annotations = apiserver.wait_for(
            lambda: _annotations(apiserver, "train-0"), lambda a: bool(a.get(CONFIGURATION))
        )
        assert json.loads(annotations[CONFIGURATION]) == {
            "pod_name": "train-0",
            "server_id": "uid-train-0",
            "host_ip": "192.168.0.40",
            "super_pod_id": 0,
            "devices": [
                {"device_id": "3", "device_ip": "198.18.0.4", "super_device_id": "3"},
                {"device_id": "5", "device_ip": "198.18.0.6", "super_device_id": "5"},
            ],
            "server_index": "0",
            "server_ip": "192.168.0.40",
        }
        pod = apiserver.get("pods", "train-0", "team-a")
        assert pod is not None
        pod["metadata"]["annotations"]["hccl/rankIndex"] = "0"
        pod["spec"]["nodeSelector"] = {"accelerator-type": "module-a3-16-super-pod"}
        pod["status"]["podIP"] = "10.244.0.7"
        apiserver.put("pods", pod)
        printed = run_cli(
            *("ranktable", "--pod", "team-a/train-0"),
            *("--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE),
        )
        assert printed.returncode == 0 and printed.stderr == "", printed.stderr
        table = hccl_json(gather([json.loads(printed.stdout)]), "1.2")
        assert table["server_list"][0] == {
            "device": [
                {"device_id": "3", "device_ip": "198.18.0.4", "super_device_id": "3", "rank_id": "0"},
                {"device_id": "5", "device_ip": "198.18.0.6", "super_device_id": "5", "rank_id": "1"},
            ],
            "server_id": "uid-train-0",
            "host_ip": "192.168.0.40",
            "container_ip": "10.244.0.7",
        }
        node = apiserver.wait_for(
            lambda: apiserver.get("nodes", NODE),
            lambda n: (
                "baseDeviceInfos" in (n["metadata"].get("annotations") or {})
                and "huawei.com/npu.super-pod-id" in (n["metadata"].get("labels") or {})
            ),
        )
        infos = volcano_types.base_device_infos(node["metadata"]["annotations"]["baseDeviceInfos"])
        assert infos["Ascend910-15"] == {"IP": "198.18.0.16", "SuperDeviceID": 15}
        assert node["metadata"]["labels"]["huawei.com/npu.server-index"] == "0"
        configmap = apiserver.wait_for(
            lambda: apiserver.get("configmaps", f"mindx-dl-deviceinfo-{NODE}", "kube-system"), bool
        )
        cache = volcano_types.node_device_info_cache(configmap["data"]["DeviceInfoCfg"])
        assert (cache["SuperPodID"], cache["ServerIndex"]) == (0, 0)
    finally:
        agent.close()


def test_an_address_that_changes_under_a_running_pod_is_an_event_not_a_rewrite(
    kubelet: KubeletStandin, apiserver: ApiServer, host: HostTree, npu_smi: FakeNpuSmi, tool: FakeHccnTool
) -> None:
    """Chip 3 goes away and comes back with another device IP (a reset, say) while a pod Volcano placed holds
    it: a Warning Event names both addresses; the pod's configuration, written at Allocate, stays."""
    host.add_chips(range(8))
    info = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()
    npu_smi.set_output("info", info)
    for chip, text in EIGHT.items():
        tool.set_output(f"-i {chip} -ip -g", text)
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    agent = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--hccn-tool", str(tool.path), "--npu-smi-timeout", "30", "--health-interval", "1",
         "--metrics-address", "", "--kubelet-dir", str(kubelet.directory), "--volcano",
         "--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE],
    )  # fmt: skip
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 8, what="the device list")
        apiserver.put("pods", _pod("train-0", "Ascend910-3,Ascend910-5", "1700000000000"))
        _allocate(kubelet, ["Ascend910-0", "Ascend910-1"])
        written = apiserver.wait_for(
            lambda: _annotations(apiserver, "train-0"), lambda a: bool(a.get(CONFIGURATION))
        )[CONFIGURATION]
        assert [d["device_ip"] for d in json.loads(written)["devices"]] == ["10.10.0.13", "10.10.0.15"]

        npu_smi.set_output("info", with_health(info, 3, "Alarm"))
        # The kubelet sees chip 3's fault under its own ID for the pod, Ascend910-0 (--volcano).
        kubelet.wait_update(lambda u: u.health().get("Ascend910-0") == "Unhealthy", what="chip 3 Unhealthy")
        tool.set_output("-i 3 -ip -g", "ipaddr:10.10.0.99\nnetmask:255.255.255.0\n")
        npu_smi.set_output("info", info)
        events = apiserver.wait_for(
            lambda: [e for e in apiserver.list("events", "default") if e["reason"] == "NPUAddressChanged"],
            bool,
            timeout=20,
        )
        assert [(e["type"], e["message"]) for e in events] == [
            (
                "Warning",
                "Ascend910-3 device IP changed from 10.10.0.13 to 10.10.0.99: pods placed on it before keep "
                "the old address in their configuration and rank tables",
            )
        ]
        assert _annotations(apiserver, "train-0")[CONFIGURATION] == written
        patches = [s for s in apiserver.seen() if s.resource == "pods" and s.verb == "patch"]
        assert len(patches) == 1, "the pod is patched once, at Allocate"
    finally:
        agent.close()
