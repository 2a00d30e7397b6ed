"""A chip's RoCE link down, end to end: the agent as a process on the devfs backend, with a fake npu-smi and a
fake hccn_tool printing the shared outputs, a kubelet stand-in and the API emulator. Past
``--link-down-debounce`` the chip is listed in ``-NetworkUnhealthy`` with an Event and stays Healthy for the
kubelet; `list` (asking the running agent) and /metrics say so; its link up again clears each."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from tests.support import FIXTURES, volcano_types
from tests.support.agent_process import AgentProcess
from tests.support.apiserver import ApiServer
from tests.support.cli import run_cli
from tests.support.hccn_fake import FakeHccnTool
from tests.support.host_tree import HostTree
from tests.support.http_probe import free_port, without_node
from tests.support.kubelet_standin import KubeletStandin
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.training_fixtures import per_chip, per_command

NODE = "node-1"
NAME = f"mindx-dl-deviceinfo-{NODE}"
KEY = "huawei.com/Ascend910-NetworkUnhealthy"
DOC = per_command("hccn_tool-multi_doc-example_collecting-logs.txt")
# The links are read once a health interval, every read within it: 16 fake hccn_tool runs, which took more
# than 1 s on a loaded machine. npu-smi's own timeout is longer: the interval bounds the round.
INTERVAL = 3


def _network_unhealthy(apiserver: ApiServer) -> str | None:
    configmap = apiserver.get("configmaps", NAME, "kube-system")
    if configmap is None:
        return None
    cache = volcano_types.node_device_info_cache(configmap["data"]["DeviceInfoCfg"])
    found: str = cache["DeviceInfo"]["DeviceList"][KEY]
    return found


def _sample(metrics: str, name: str, device: str) -> str | None:
    """The value of ``name``'s series for ``device`` (the holder labels beside it are the pod's)."""
    found = re.search(rf'^{name}{{[^}}]*device="{device}"[^}}]*}} (\S+)$', metrics, re.MULTILINE)
    return found.group(1) if found else None


def _events(apiserver: ApiServer) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for event in apiserver.list("events", "default"):
        found.setdefault(event["reason"], []).append(event)
    return found


def _eight_chips(host: HostTree, short_dir: Path, apiserver: ApiServer) -> tuple[FakeNpuSmi, FakeHccnTool]:
    """Eight chips on the host, npu-smi printing the 910B4 sample, hccn_tool each chip's address, the Node."""
    host.add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
    tool = FakeHccnTool(short_dir / "hccn")
    for chip, text in per_chip("hccn_tool-ip-g_fixture-8dev.txt").items():
        tool.set_output(f"-i {chip} -ip -g", text)
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    return npu_smi, tool


def test_a_link_down_is_network_unhealthy_for_volcano_not_for_the_kubelet(
    kubelet: KubeletStandin, apiserver: ApiServer, host: HostTree, short_dir: Path
) -> None:
    npu_smi, tool = _eight_chips(host, short_dir, apiserver)
    address = f"127.0.0.1:{free_port()}"
    devfs = ["--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
             "--hccn-tool", str(tool.path), "--npu-smi-timeout", "30",
             "--metrics-address", address]  # fmt: skip
    process = AgentProcess(
        ["run", *devfs, "--health-interval", str(INTERVAL), "--link-down-debounce", "1",
         "--kubelet-dir", str(kubelet.directory), "--kubeconfig", str(apiserver.kubeconfig),
         "--node-name", NODE],
    )  # fmt: skip
    try:
        # Every link UP: the key is there, empty (Volcano drops a node without it for distributed jobs).
        assert apiserver.wait_for(lambda: _network_unhealthy(apiserver), lambda v: v == "") == ""
        tool.set_output("-i 3 -link -g", "link status: DOWN\n")
        apiserver.wait_for(lambda: _network_unhealthy(apiserver), lambda v: v == "Ascend910-3")
        process.wait_log("Chip 3 network-unhealthy: RoCE link DOWN for 1 s or more")
        found = apiserver.wait_for(lambda: _events(apiserver), lambda f: "NPUNetworkUnhealthy" in f)
        assert found["NPUNetworkUnhealthy"][0]["message"] == (
            "Ascend910-3 network is unhealthy: RoCE link DOWN for 1 s or more (hccn_tool -link -g)"
        )
        assert "NPUUnhealthy" not in found
        kubelet.wait_update(lambda u: len(u.devices) == 8)
        assert {u.health().get("Ascend910-3") for u in kubelet.updates} == {"Healthy"}
        listed = run_cli("list", *devfs, "--json", timeout=60)
        assert listed.returncode == 0, listed.stderr
        faults = {row["id"]: row["network_fault"] for row in json.loads(listed.stdout)}
        assert faults["Ascend910-3"] == "RoCE link DOWN for 1 s or more (hccn_tool -link -g)"
        assert faults["Ascend910-2"] == ""
        table = run_cli("list", *devfs, timeout=60).stdout.splitlines()
        (line,) = [row for row in table if row.startswith("Ascend910-3 ")]
        assert line.endswith("network-unhealthy: RoCE link DOWN for 1 s or more (hccn_tool -link -g)"), line
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as answer:
            metrics = without_node(answer.read().decode())
        assert _sample(metrics, "ascend_agent_chip_network_unhealthy", "Ascend910-3") == "1.0"
        assert _sample(metrics, "ascend_agent_chip_link_up", "Ascend910-3") == "0.0"
        assert _sample(metrics, "ascend_agent_chip_link_up", "Ascend910-2") == "1.0"
        assert _sample(metrics, "ascend_agent_chip_net_health_info", "Ascend910-3") == "1.0"

        tool.set_output("-i 3 -link -g", DOC["-i 0 -link -g"])
        apiserver.wait_for(lambda: _network_unhealthy(apiserver), lambda v: v == "")
        apiserver.wait_for(lambda: _events(apiserver), lambda f: "NPUNetworkHealthy" in f)
    finally:
        process.close()
    assert "Traceback" not in process.output


def test_a_hung_then_garbled_hccn_tool_is_one_line_per_change_and_no_traceback(
    kubelet: KubeletStandin, apiserver: ApiServer, host: HostTree, short_dir: Path
) -> None:
    npu_smi, tool = _eight_chips(host, short_dir, apiserver)
    process = AgentProcess(
        ["run", "--backend", "devfs", "--host-root", str(host.root), "--npu-smi", str(npu_smi.path),
         "--hccn-tool", str(tool.path), "--npu-smi-timeout", "30", "--health-interval", str(INTERVAL),
         "--link-down-debounce", "0", "--kubelet-dir", str(kubelet.directory), "--metrics-address", "",
         "--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE],
    )  # fmt: skip
    try:
        apiserver.wait_for(lambda: _network_unhealthy(apiserver), lambda v: v == "")
        for mode, said in (("hang", f"no answer within {INTERVAL} s"), ("garbage", "unexpected")):
            tool.set_mode(mode)
            process.wait_log(f"Cannot read the link state of chips 0, 1, 2, 3, 4, 5, 6, 7 .*({said})")
            queries = npu_smi.count("info")
            npu_smi.wait_count("info", queries + 2)  # a whole round more, after the one that said it
            assert len(process.matching(f"Cannot read the link state .*({said})")) == 1
            assert len(process.matching(f"Cannot read the net health .*({said})")) == 1
        assert _network_unhealthy(apiserver) == ""  # nothing read: nothing made up
        tool.set_mode("ok")
        process.wait_log("The link state of chips 0, 1, 2, 3, 4, 5, 6, 7 reads again")
    finally:
        process.close()
    assert "Traceback" not in process.output
