"""The device-info ConfigMap from the agent as a process (fake backend, kubelet stand-in, API emulator): what
Volcano reads appears, a chip an admin separates there turns Unhealthy for the kubelet and comes back when
the admin removes it, and ``--no-device-info`` writes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ascend_agent.node_summary import configmap_name
from tests.support import volcano_types
from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.apiserver import ApiServer, Seen
from tests.support.kubelet_standin import KubeletStandin

NODE = "node-1"
NAME = f"mindx-dl-deviceinfo-{NODE}"
T = "huawei.com/Ascend910"


def _agent(kubelet: KubeletStandin, apiserver: ApiServer, *extra: str) -> AgentProcess:
    return fake_agent(
        kubelet.directory,
        *("--fake-model", "910B3", "--health-interval", "1"),
        *("--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE),
        *extra,
    )


@pytest.fixture
def node(apiserver: ApiServer) -> Iterator[None]:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    yield


def _lists(configmap: dict[str, Any]) -> dict[str, str]:
    cache = volcano_types.node_device_info_cache(configmap["data"]["DeviceInfoCfg"])
    lists: dict[str, str] = cache["DeviceInfo"]["DeviceList"]
    return lists


def test_separated_chip_turns_unhealthy_for_the_kubelet_and_back(
    kubelet: KubeletStandin, apiserver: ApiServer, node: None, state: Path
) -> None:
    state.write_text(json.dumps({"unhealthy": [1]}))
    agent = _agent(kubelet, apiserver, "--fake-state", str(state))
    try:
        found = apiserver.wait_for(lambda: apiserver.get("configmaps", NAME, "kube-system"), bool)
        assert found["metadata"]["labels"] == {"mx-consumer-cim": "true"}
        assert _lists(found)[f"{T}-Unhealthy"] == "Ascend910-1"
        node_object = apiserver.wait_for(
            lambda: apiserver.get("nodes", NODE),
            lambda n: "baseDeviceInfos" in (n["metadata"].get("annotations") or {}),
        )
        assert (
            len(volcano_types.base_device_infos(node_object["metadata"]["annotations"]["baseDeviceInfos"]))
            == 8
        )

        found["data"]["ManuallySeparateNPU"] = "Ascend910-6"
        apiserver.put("configmaps", found)
        kubelet.wait_update(lambda u: u.health().get("Ascend910-6") == "Unhealthy", what="chip 6 separated")
        agent.wait_log("Ascend910-6 is Unhealthy: separated by the ConfigMap")
        found = apiserver.wait_for(
            lambda: apiserver.get("configmaps", NAME, "kube-system"),
            lambda cm: _lists(cm)[f"{T}-Unhealthy"] == "Ascend910-1,Ascend910-6",
        )
        assert found["data"]["ManuallySeparateNPU"] == "Ascend910-6"

        found["data"]["ManuallySeparateNPU"] = ""
        apiserver.put("configmaps", found)
        kubelet.wait_update(lambda u: u.health().get("Ascend910-6") == "Healthy", what="chip 6 back")
    finally:
        agent.close()


def test_no_device_info_writes_nothing(kubelet: KubeletStandin, apiserver: ApiServer, node: None) -> None:
    agent = _agent(kubelet, apiserver, "--no-device-info")
    try:
        apiserver.wait_for(
            lambda: apiserver.get("nodes", NODE),
            lambda n: "accelerator" in (n["metadata"].get("labels") or {}),
        )
        kubelet.wait_update(lambda u: len(u.devices) == 8)
        # The node summary (kubectl ascend) alone, whatever --device-info says.
        apiserver.wait_for(lambda: apiserver.list("configmaps"), lambda found: bool(found))
        assert [c["metadata"]["name"] for c in apiserver.list("configmaps")] == [configmap_name(NODE)]
        node_object = apiserver.get("nodes", NODE)
        assert node_object is not None
        assert "baseDeviceInfos" not in (node_object["metadata"].get("annotations") or {})

        def named(seen: Seen) -> object:
            return seen.name or (seen.data or {}).get("metadata", {}).get("name")

        others = [s for s in apiserver.seen() if s.resource == "pods" or s.resource == "configmaps"]
        assert others and not [s for s in others if named(s) != configmap_name(NODE)]
    finally:
        agent.close()
