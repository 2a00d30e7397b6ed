"""A chip's RoCE link down, end to end: the agent as a process on the devfs backend, with a fake npu-smi and a
fake hccn_tool printing the shared outputs, a kubelet stand-in and the API emulator. Past
``--link-down-debounce`` the chip is listed in ``-NetworkUnhealthy`` with an Event and stays Healthy for the
kubelet; its link up again clears both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support import FIXTURES, volcano_types
from tests.support.agent_process import AgentProcess
from tests.support.apiserver import ApiServer
from tests.support.hccn_fake import FakeHccnTool
from tests.support.host_tree import HostTree
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.training_fixtures import per_chip, per_command

NODE = "node-1"
NAME = f"mindx-dl-deviceinfo-{NODE}"
KEY = "huawei.com/Ascend910-NetworkUnhealthy"
DOC = per_command("hccn_tool-multi_doc-example_collecting-logs.txt")


def _network_unhealthy(apiserver: ApiServer) -> str | None:
    configmap = apiserver.get("configmaps", NAME, "kube-system")
    if configmap is None:
        return None
    cache = volcano_types.node_device_info_cache(configmap["data"]["DeviceInfoCfg"])
    found: str = cache["DeviceInfo"]["DeviceList"][KEY]
    return found


def _events(apiserver: ApiServer) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for event in apiserver.list("events", "default"):
        found.setdefault(event["reason"], []).append(event)
    return found


def test_a_link_down_is_network_unhealthy_for_volcano_not_for_the_kubelet(
    kubelet: KubeletStandin, apiserver: ApiServer, host: HostTree, short_dir: Path
) -> None:
    host.add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
    tool = FakeHccnTool(short_dir / "hccn")
    for chip, text in per_chip("hccn_tool-ip-g_fixture-8dev.txt").items():
        tool.set_output(f"-i {chip} -ip -g", text)
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    process = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--hccn-tool", str(tool.path), "--npu-smi-timeout", "2", "--health-interval", "1",
         "--link-down-debounce", "1", "--kubelet-dir", str(kubelet.directory), "--metrics-address", "",
         "--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE],
    )  # fmt: skip
    try:
        # Every link UP: the key is there, empty (Volcano drops a node without it for distributed jobs).
        assert apiserver.wait_for(lambda: _network_unhealthy(apiserver), lambda v: v == "", timeout=10) == ""
        tool.set_output("-i 3 -link -g", "link status: DOWN\n")
        apiserver.wait_for(lambda: _network_unhealthy(apiserver), lambda v: v == "Ascend910-3", timeout=15)
        process.wait_log("Chip 3 network-unhealthy: RoCE link DOWN for 1 s or more")
        found = apiserver.wait_for(lambda: _events(apiserver), lambda f: "NPUNetworkUnhealthy" in f)
        assert found["NPUNetworkUnhealthy"][0]["message"] == (
            "Ascend910-3 network is unhealthy: RoCE link DOWN for 1 s or more (hccn_tool -link -g)"
        )
        assert "NPUUnhealthy" not in found
        kubelet.wait_update(lambda u: len(u.devices) == 8)
        assert {u.health().get("Ascend910-3") for u in kubelet.updates} == {"Healthy"}

        tool.set_output("-i 3 -link -g", DOC["-i 0 -link -g"])
        apiserver.wait_for(lambda: _network_unhealthy(apiserver), lambda v: v == "", timeout=10)
        apiserver.wait_for(lambda: _events(apiserver), lambda f: "NPUNetworkHealthy" in f)
    finally:
        process.close()
    assert "Traceback" not in process.output
