"""The doctor's "pods on Unhealthy chips" with ``--volcano``: the kubelet's PodResources view names its own
IDs; the doctor moves it to the chips the pods' marks say were mounted (API emulator, PodResources
stand-in)."""

from __future__ import annotations

from ascend_agent.config import Settings
from ascend_agent.doctor.holders import holders_check
from tests.support.apiserver import ApiServer
from tests.support.podresources import PodResourcesStandin

Pods = PodResourcesStandin

T = "huawei.com/Ascend910"


def _marked_pod(node: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": "train-0",
            "namespace": "team-a",
            "uid": "uid-train-0",
            "annotations": {
                T: "Ascend910-3",
                "predicate-time": "18446744073709551615",
                "huawei.com/AscendReal": "Ascend910-3",
                "huawei.com/kltDev": "Ascend910-0",
            },
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": {T: "1"}}}]},
    }


def _settings(apiserver: ApiServer, podresources: PodResourcesStandin, volcano: bool) -> Settings:
    return Settings(
        volcano=volcano,
        kubeconfig=apiserver.kubeconfig,
        node_name="node-1",
        pod_resources_socket=podresources.path,
    )


async def test_the_pod_on_the_chip_really_mounted(
    apiserver: ApiServer, podresources: PodResourcesStandin
) -> None:
    apiserver.put("pods", _marked_pod("node-1"))
    podresources.hold(T, ["Ascend910-0"], "team-a", "train-0", "main")
    check = await holders_check(_settings(apiserver, podresources, volcano=True), [(T, "Ascend910-3")])
    assert (check.ok, check.detail) == (False, "Ascend910-3 held by team-a/train-0/main")
    check = await holders_check(_settings(apiserver, podresources, volcano=True), [(T, "Ascend910-0")])
    assert check.ok is True, "chip 0 is the kubelet's ID only: nothing runs on it"


async def test_without_volcano_the_kubelets_ids(
    apiserver: ApiServer, podresources: PodResourcesStandin
) -> None:
    apiserver.put("pods", _marked_pod("node-1"))
    podresources.hold(T, ["Ascend910-0"], "team-a", "train-0", "main")
    check = await holders_check(_settings(apiserver, podresources, volcano=False), [(T, "Ascend910-0")])
    assert (check.ok, check.detail) == (False, "Ascend910-0 held by team-a/train-0/main")
    assert not [s for s in apiserver.seen() if s.resource == "pods"]


async def test_pods_on_another_node_move_nothing(
    apiserver: ApiServer, podresources: PodResourcesStandin
) -> None:
    apiserver.put("pods", _marked_pod("node-2"))
    podresources.hold(T, ["Ascend910-0"], "team-a", "train-0", "main")
    check = await holders_check(_settings(apiserver, podresources, volcano=True), [(T, "Ascend910-3")])
    assert check.ok is True
