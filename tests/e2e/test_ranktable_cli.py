"""``ascend-agent ranktable --pod NS/NAME`` as a process against the API emulator: a pod it cannot make a rank
table of is one line on stderr naming the pod and what to do, exit 1; a chip without a device IP is printed
and named on stderr; a pod without Volcano's annotation gets the chips the kubelet's PodResources says it
holds. (Its output for a pod the agent marked: ``test_training_facts.py``.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.apiserver import ApiServer
from tests.support.cli import run_cli
from tests.support.podresources import PodResourcesStandin

NODE = "node-1"
CONFIGURATION = "ascend.kubectl.kubernetes.io/ascend-910-configuration"


def _pod(name: str, node: str = NODE, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "annotations": annotations},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": "Running", "podIP": "10.244.0.7"},
    }


def _ranktable(apiserver: ApiServer, pod: str, *extra: str) -> tuple[int, str, str]:
    done = run_cli(
        *("ranktable", "--pod", pod, "--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE),
        *extra,
    )
    return done.returncode, done.stdout, done.stderr


def _one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr.strip()


@pytest.mark.parametrize(
    ("pod", "line"),
    [
        (
            "team-a/absent",
            "ascend-agent: there is no pod team-a/absent: check the name with kubectl get pods",
        ),
        ("team-a/elsewhere", "pod team-a/elsewhere is on node node-2, not on this node (node-1)"),
        (
            "team-a/unmarked",
            "pod team-a/unmarked has no ascend.kubectl.kubernetes.io/ascend-910-configuration",
        ),
    ],
)
def test_a_pod_it_cannot_use_is_one_line(apiserver: ApiServer, pod: str, line: str) -> None:
    apiserver.put("pods", _pod("elsewhere", node="node-2"))
    apiserver.put("pods", _pod("unmarked", **{"hccl/rankIndex": "0"}))
    code, out, err = _ranktable(apiserver, pod)
    assert (code, out) == (1, "")
    assert line in _one_line(err)


def test_an_api_server_refusing_is_one_line(apiserver: ApiServer) -> None:
    apiserver.fail(403, verb="list", resource="pods")
    code, out, err = _ranktable(apiserver, "team-a/p")
    assert (code, out) == (1, "")
    assert "could not be read: 403 Forbidden: the agent may not list pods" in _one_line(err)


def test_a_chip_without_an_ip_is_printed_and_named(apiserver: ApiServer) -> None:
    configuration = {
        "pod_name": "p",
        "server_id": "uid-p",
        "host_ip": "192.168.0.11",
        "super_pod_id": -2,
        "devices": [{"device_id": "0", "device_ip": "10.10.0.10"}, {"device_id": "1", "device_ip": ""}],
        "server_index": "-2",
        "server_ip": "192.168.0.11",
    }
    apiserver.put("pods", _pod("p", **{CONFIGURATION: json.dumps(configuration), "hccl/rankIndex": "3"}))
    code, out, err = _ranktable(apiserver, "team-a/p", "--version", "1.0")
    assert code == 0
    assert [d["rank_id"] for d in json.loads(out)["server_list"][0]["device"]] == ["6", "7"]
    assert "pod team-a/p: device 1 has no device_ip" in _one_line(err)


def test_bad_flags_are_usage_errors(apiserver: ApiServer) -> None:
    assert _ranktable(apiserver, "no-slash")[0] == 2
    code, _, err = _ranktable(apiserver, "team-a/p", "--version", "2.0")
    assert code == 2 and "--version is 1.0 or 1.2, got '2.0'" in _one_line(err)


_CONFIGURATION = json.dumps(
    {
        "pod_name": "p",
        "server_id": "uid-p",
        "host_ip": "192.168.0.11",
        "super_pod_id": -2,
        "devices": [{"device_id": "0", "device_ip": "10.10.0.10"}],
        "server_index": "-2",
        "server_ip": "192.168.0.11",
    }
)


@pytest.mark.parametrize(
    ("annotations", "line"),
    [
        (
            {CONFIGURATION: _CONFIGURATION, "hccl/rankIndex": "9" * 5000},
            "pod team-a/p's hccl/rankIndex is '999",
        ),
        (
            {CONFIGURATION: "[" * 100_000 + "]" * 100_000, "hccl/rankIndex": "0"},
            "nests arrays or objects too deep to read",
        ),
    ],
    ids=["a 5000-digit rankIndex", "JSON nested 100,000 deep"],
)
def test_hostile_annotations_are_one_line(
    apiserver: ApiServer, annotations: dict[str, str], line: str
) -> None:
    apiserver.put("pods", _pod("p", **annotations))
    code, out, err = _ranktable(apiserver, "team-a/p")
    assert (code, out) == (1, "")
    assert line in _one_line(err)


def test_a_5000_digit_sp_block_is_no_sp_block(apiserver: ApiServer) -> None:
    apiserver.put(
        "pods", _pod("p", **{CONFIGURATION: _CONFIGURATION, "hccl/rankIndex": "1", "sp-block": "9" * 5000})
    )
    code, out, err = _ranktable(apiserver, "team-a/p", "--version", "1.2")
    assert code == 0, err
    assert json.loads(out)["super_pod_list"] == [
        {"super_pod_id": "0", "server_list": [{"server_id": "uid-p"}]}
    ]


@pytest.mark.parametrize(
    "pod", ["../node-1", "team-a/..", "team-a/a/b", "Team-A/p", "team-a/p%2f..", "a" * 64 + "/p"]
)
def test_a_pod_that_is_no_kubernetes_name_is_refused_before_any_request(
    apiserver: ApiServer, pod: str
) -> None:
    """``--pod ../node-1`` reached /api/v1/pods (every namespace) through the path the client made."""
    code, out, err = _ranktable(apiserver, pod)
    assert (code, out) == (2, "")
    assert (
        "--pod needs NAMESPACE/NAME, a namespace (a DNS label) and a pod's name (a DNS subdomain)"
        in _one_line(err)
    )
    assert apiserver.seen() == []


_FAKE = ("--backend", "fake", "--fake-model", "910B3", "--fake-training")
_NODE = {
    "metadata": {"name": NODE},
    "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.11"}]},
}


def test_a_pod_the_default_scheduler_placed_gets_the_chips_the_kubelet_gave_it(
    apiserver: ApiServer, podresources: PodResourcesStandin
) -> None:
    """No configuration annotation (the default scheduler placed it): the same fields as for a pod Volcano
    placed, from the kubelet's PodResources (its device IDs) and the chips as the backend finds them."""
    apiserver.put("nodes", _NODE)
    apiserver.put("pods", _pod("p", **{"hccl/rankIndex": "1"}))
    podresources.hold("huawei.com/Ascend910", ["Ascend910-5", "Ascend910-3"], "team-a", "p", "main")
    podresources.hold("huawei.com/Ascend910", ["Ascend910-6"], "team-a", "other", "main")
    code, out, err = _ranktable(
        apiserver, "team-a/p", *_FAKE, "--pod-resources-socket", str(podresources.path)
    )
    assert (code, err) == (0, ""), err
    assert json.loads(out) == {
        "server_list": [
            {
                "device": [
                    {"device_id": "3", "device_ip": "198.18.0.4", "rank_id": "2"},
                    {"device_id": "5", "device_ip": "198.18.0.6", "rank_id": "3"},
                ],
                "server_id": "uid-p",
                "host_ip": "192.168.0.11",
                "container_ip": "10.244.0.7",
            }
        ],
        "version": "1.0",
    }


def test_a_pod_holding_chips_through_a_dra_claim_gets_them(
    apiserver: ApiServer, podresources: PodResourcesStandin
) -> None:
    apiserver.put("nodes", _NODE)
    apiserver.put("pods", _pod("p", **{"hccl/rankIndex": "0"}))
    podresources.claim("npu.huawei.com", NODE, "npu-2", "team-a", "p", "main", "train")
    podresources.claim("gpu.example.com", NODE, "npu-4", "team-a", "p", "main", "other")
    code, out, err = _ranktable(
        apiserver, "team-a/p", *_FAKE, "--pod-resources-socket", str(podresources.path)
    )
    assert (code, err) == (0, ""), err
    (server,) = json.loads(out)["server_list"]
    assert server["device"] == [{"device_id": "2", "device_ip": "198.18.0.3", "rank_id": "0"}]


def test_a_pod_without_the_annotation_or_chips_is_one_line(
    apiserver: ApiServer, podresources: PodResourcesStandin
) -> None:
    apiserver.put("pods", _pod("p", **{"hccl/rankIndex": "0"}))
    code, out, err = _ranktable(
        apiserver, "team-a/p", *_FAKE, "--pod-resources-socket", str(podresources.path)
    )
    assert (code, out) == (1, "")
    assert (
        "pod team-a/p has no ascend.kubectl.kubernetes.io/ascend-910-configuration annotation and the "
        "kubelet lists no chip of this node for it" in _one_line(err)
    )
    code, out, err = _ranktable(apiserver, "team-a/p", *_FAKE, "--pod-resources-socket", "/nonexistent.sock")
    assert (code, out) == (1, "")
    assert (
        "pod team-a/p has no ascend.kubectl.kubernetes.io/ascend-910-configuration annotation, and which "
        "chips the kubelet gave it cannot be told: /nonexistent.sock does not exist"
    ) in _one_line(err)
