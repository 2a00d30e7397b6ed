"""``--volcano`` from the agent as a process: Allocate hands over the chips Volcano wrote on the pod, not the
kubelet's IDs, and marks the pod; pods placed together get their own chips in ``predicate-time`` order; no
placed pod is a clear refusal; a request for every chip keeps the kubelet's IDs; without ``--volcano`` nothing
of it is on."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.apiserver import ApiServer
from tests.support.cli import run_cli
from tests.support.http_probe import free_port, wait_answer
from tests.support.kubelet_standin import KubeletStandin
from tests.support.podresources import PodResourcesStandin

NODE = "node-1"
T = "huawei.com/Ascend910"


def _pod(
    name: str,
    chips: str,
    predicate_time: str,
    count: int = 2,
    node: str = NODE,
    namespace: str = "team-a",
    bound: bool = True,
) -> dict[str, Any]:
    """A pod as Volcano leaves it: its choice and ``predicate-time`` written, bound to the node (the API
    server sets PodScheduled as it takes the Binding); without ``bound``, created with its node named."""
    status: dict[str, Any] = {"phase": "Pending"}
    if bound:
        status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": {T: chips, "predicate-time": predicate_time},
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "volcano",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {T: str(count)}}}],
        },
        "status": status,
    }


def _start(kubelet: KubeletStandin, apiserver: ApiServer, *extra: str) -> AgentProcess:
    agent = fake_agent(
        kubelet.directory,
        *("--fake-model", "910B3", "--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE),
        *extra,
    )
    kubelet.wait_update(lambda u: len(u.devices) == 8, what="the device list")
    return agent


@pytest.fixture
def volcano(kubelet: KubeletStandin, apiserver: ApiServer) -> Iterator[AgentProcess]:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    agent = _start(kubelet, apiserver, "--volcano")
    yield agent
    agent.close()


def test_a_pod_bound_by_hand_cannot_take_a_chip_another_pod_has(
    kubelet: KubeletStandin, apiserver: ApiServer, volcano: AgentProcess
) -> None:
    """A namespace user binds pods to the node with Volcano's annotation and ``predicate-time: "0"``: without
    ``schedulerName: volcano`` the pod is never chosen; with it, a chip another pod has is refused, naming
    that pod."""
    apiserver.put("pods", _pod("train-0", "Ascend910-3,Ascend910-5", "100"))
    assert _allocate(kubelet, ["Ascend910-0", "Ascend910-1"]).envs["ASCEND_VISIBLE_DEVICES"] == "3,5"
    by_hand = _pod("by-hand", "Ascend910-3", "0", count=1)
    del by_hand["spec"]["schedulerName"]
    _create(apiserver, by_hand)
    _create(apiserver, _pod("placed", "Ascend910-6", "200", count=1))
    assert _allocate(kubelet, ["Ascend910-2"]).envs["ASCEND_VISIBLE_DEVICES"] == "6"

    _create(apiserver, _pod("claims-volcano", "Ascend910-5", "0", count=1))
    with pytest.raises(grpc.RpcError) as refused:
        _allocate(kubelet, ["Ascend910-4"])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "pod team-a/claims-volcano names Ascend910-5" in str(refused.value.details())
    assert "which pod team-a/train-0 has" in str(refused.value.details())
    _create(apiserver, _pod("next", "Ascend910-7", "300", count=1))
    assert _allocate(kubelet, ["Ascend910-4"]).envs["ASCEND_VISIBLE_DEVICES"] == "7", (
        "the refused pod skipped"
    )


@pytest.mark.parametrize("time", ["\u00b2", "9" * 5000], ids=["superscript two", "5000 digits"])
def test_a_predicate_time_that_is_no_number_ignores_that_pod_only(
    kubelet: KubeletStandin, apiserver: ApiServer, volcano: AgentProcess, time: str
) -> None:
    apiserver.put("pods", _pod("odd", "Ascend910-2,Ascend910-4", time))
    apiserver.put("pods", _pod("train-0", "Ascend910-3,Ascend910-5", "100"))
    assert _allocate(kubelet, ["Ascend910-0", "Ascend910-1"]).envs["ASCEND_VISIBLE_DEVICES"] == "3,5"
    with pytest.raises(grpc.RpcError) as refused:
        _allocate(kubelet, ["Ascend910-0", "Ascend910-1"])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
    volcano.wait_log("Pod team-a/odd is ignored")


def test_a_chip_name_of_200_kb_is_refused_in_one_bounded_line(
    kubelet: KubeletStandin, apiserver: ApiServer, volcano: AgentProcess
) -> None:
    """A pod naming a 200 KB chip: the refusal echoed it whole, which took seconds to send and which the
    kubelet's gRPC client drops (RESOURCE_EXHAUSTED: metadata over its hard limit) instead of reading why."""
    apiserver.put("pods", _pod("first", "Ascend910-3", "50", count=1))
    apiserver.put("pods", _pod("odd", "Ascend910-" + "9" * 200_000, "100", count=1))
    assert _allocate(kubelet, ["Ascend910-0"]).envs["ASCEND_VISIBLE_DEVICES"] == "3"
    with pytest.raises(grpc.RpcError) as refused:
        _allocate(kubelet, ["Ascend910-1"])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
    details = str(refused.value.details())
    assert len(details) < 300, details
    assert re.fullmatch(
        r"Volcano chose Ascend910-9{54}\.\.\. \(1025 characters\) for pod team-a/odd, which this node does "
        r"not have; check the node's device-info ConfigMap",
        details,
    ), details


def _allocate(kubelet: KubeletStandin, ids: list[str], timeout: float = 10) -> Any:
    channel, stub = kubelet.plugin_stub(T)
    with channel:
        request = kubelet.pb.AllocateRequest(
            container_requests=[kubelet.pb.ContainerAllocateRequest(devices_ids=ids)]
        )
        return stub.Allocate(request, timeout=timeout).container_responses[0]


def _create(apiserver: ApiServer, pod: dict[str, Any]) -> None:
    """Create ``pod`` by a POST to the API, as a client of Kubernetes does."""
    request = urllib.request.Request(
        f"{apiserver.url}/api/v1/namespaces/{pod['metadata']['namespace']}/pods",
        json.dumps(pod).encode(),
        {"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        assert answer.status in (200, 201)


def _annotations(apiserver: ApiServer, name: str, namespace: str = "team-a") -> dict[str, str]:
    pod = apiserver.get("pods", name, namespace)
    assert pod is not None
    return dict(pod["metadata"].get("annotations") or {})


def test_volcano_chips_mounted_and_the_pod_marked(
    kubelet: KubeletStandin, apiserver: ApiServer, volcano: AgentProcess
) -> None:
    apiserver.put("pods", _pod("train-0", "Ascend910-3,Ascend910-5", "1700000000000"))
    container = _allocate(kubelet, ["Ascend910-0", "Ascend910-1"])
    assert container.envs["ASCEND_VISIBLE_DEVICES"] == "3,5"
    chips = [
        d.host_path
        for d in container.devices
        if d.host_path.startswith("/dev/davinci") and d.host_path[12:].isdigit()
    ]
    assert chips == ["/dev/davinci3", "/dev/davinci5"]

    annotations = apiserver.wait_for(
        lambda: _annotations(apiserver, "train-0"),
        lambda a: a.get("predicate-time") == "18446744073709551615",
    )
    assert annotations["huawei.com/AscendReal"] == "Ascend910-3,Ascend910-5"
    assert annotations["huawei.com/kltDev"] == "Ascend910-0,Ascend910-1"
    assert json.loads(annotations["ascend.kubectl.kubernetes.io/ascend-910-configuration"]) == {
        "pod_name": "train-0",
        "server_id": "uid-train-0",
        "host_ip": "",
        "super_pod_id": -2,
        "devices": [{"device_id": "3", "device_ip": ""}, {"device_id": "5", "device_ip": ""}],
        "server_index": "-2",
        "server_ip": "",
    }
    volcano.wait_log("host_ip empty: the Node has no InternalIP address")
    volcano.wait_log("Allocated Ascend910-3,Ascend910-5")


def test_pods_placed_together_get_their_own_chips_in_predicate_time_order(
    kubelet: KubeletStandin, apiserver: ApiServer, volcano: AgentProcess
) -> None:
    apiserver.put("pods", _pod("later", "Ascend910-6,Ascend910-7", "300"))
    apiserver.put("pods", _pod("earlier", "Ascend910-2,Ascend910-4", "200"))
    apiserver.put("pods", _pod("other-node", "Ascend910-0,Ascend910-1", "100", node="node-2"))
    apiserver.put("pods", _pod("one-chip", "Ascend910-0", "50", count=1))
    first = _allocate(kubelet, ["Ascend910-0", "Ascend910-1"])
    second = _allocate(kubelet, ["Ascend910-2", "Ascend910-3"])
    assert [first.envs["ASCEND_VISIBLE_DEVICES"], second.envs["ASCEND_VISIBLE_DEVICES"]] == ["2,4", "6,7"]
    for name, kubelet_ids in (("earlier", "Ascend910-0,Ascend910-1"), ("later", "Ascend910-2,Ascend910-3")):
        annotations = apiserver.wait_for(
            lambda name=name: _annotations(apiserver, name), lambda a: "huawei.com/kltDev" in a
        )
        assert annotations["huawei.com/kltDev"] == kubelet_ids
    assert "huawei.com/kltDev" not in _annotations(apiserver, "other-node")


def test_no_placed_pod_refuses_after_three_tries(
    kubelet: KubeletStandin, apiserver: ApiServer, volcano: AgentProcess
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        _allocate(kubelet, ["Ascend910-0", "Ascend910-1"])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pod on this node placed by Volcano asks for 2 huawei.com/Ascend910" in str(
        refused.value.details()
    )


def test_a_pod_arriving_during_the_tries_is_taken_and_the_wait_blocks_nothing(
    kubelet: KubeletStandin, apiserver: ApiServer, volcano: AgentProcess
) -> None:
    answers: list[Any] = []
    waiting = threading.Thread(
        target=lambda: answers.append(_allocate(kubelet, ["Ascend910-0", "Ascend910-1"]))
    )
    waiting.start()
    try:
        # The miss read the pods once; the call now waits between tries, and other calls are answered.
        apiserver.wait_for(
            lambda: [s for s in apiserver.seen() if s.resource == "pods"], lambda seen: len(seen) >= 2
        )
        every_chip = _allocate(kubelet, [f"Ascend910-{i}" for i in range(8)], timeout=2)
        assert every_chip.envs["ASCEND_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
        assert waiting.is_alive()
        _create(apiserver, _pod("late", "Ascend910-6,Ascend910-7", "100"))  # seen by the agent's watch
    finally:
        waiting.join(10)
    assert [answer.envs["ASCEND_VISIBLE_DEVICES"] for answer in answers] == ["6,7"]


def test_a_choice_of_an_unhealthy_chip_is_refused_and_the_pod_not_taken(
    kubelet: KubeletStandin, apiserver: ApiServer, state: Path
) -> None:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    apiserver.put("pods", _pod("train-0", "Ascend910-3,Ascend910-5", "100"))
    state.write_text(json.dumps({"unhealthy": [5]}))
    agent = _start(kubelet, apiserver, "--volcano", "--fake-state", str(state))
    try:
        with pytest.raises(grpc.RpcError) as refused:
            _allocate(kubelet, ["Ascend910-0", "Ascend910-1"])
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "Volcano chose Ascend910-5 for pod team-a/train-0, which is Unhealthy" in str(
            refused.value.details()
        )
        assert "predicate-time" in _annotations(apiserver, "train-0")
        assert _annotations(apiserver, "train-0")["predicate-time"] == "100"
    finally:
        agent.close()


def test_every_chip_keeps_the_kubelets_ids(
    kubelet: KubeletStandin, apiserver: ApiServer, volcano: AgentProcess
) -> None:
    ids = [f"Ascend910-{i}" for i in range(8)]
    container = _allocate(kubelet, ids)
    assert container.envs["ASCEND_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_without_volcano_the_kubelets_ids_and_no_pod_read(
    kubelet: KubeletStandin, apiserver: ApiServer
) -> None:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    apiserver.put("pods", _pod("train-0", "Ascend910-3,Ascend910-5", "100"))
    agent = _start(kubelet, apiserver)
    try:
        container = _allocate(kubelet, ["Ascend910-0", "Ascend910-1"])
        assert container.envs["ASCEND_VISIBLE_DEVICES"] == "0,1"
        assert not [s for s in apiserver.seen() if s.resource == "pods"]
    finally:
        agent.close()


def _held_by(device: str, pod: str) -> str:
    container, namespace = ("main", "team-a") if pod else ("", "")
    labels = f'container="{container}",device="{device}",namespace="{namespace}",pod="{pod}"'
    return re.escape(f'ascend_agent_device_health{{{labels},resource="{T}"}} 1.0')


def test_metrics_name_the_pod_on_the_chips_really_mounted(
    kubelet: KubeletStandin, apiserver: ApiServer, podresources: PodResourcesStandin
) -> None:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    apiserver.put("pods", _pod("train-0", "Ascend910-3,Ascend910-5", "100"))
    port = free_port()
    agent = _start(
        kubelet,
        apiserver,
        "--volcano",
        "--metrics-address",
        f"127.0.0.1:{port}",
        "--pod-resources-socket",
        str(podresources.path),
    )
    try:
        # The kubelet records its own IDs for the pod.
        podresources.hold(T, ["Ascend910-0", "Ascend910-1"], "team-a", "train-0", "main")
        assert _allocate(kubelet, ["Ascend910-0", "Ascend910-1"]).envs["ASCEND_VISIBLE_DEVICES"] == "3,5"
        _, body = wait_answer(
            port,
            "/metrics",
            lambda status, body: re.search(_held_by("Ascend910-5", "train-0"), body) is not None,
        )
        assert re.search(_held_by("Ascend910-3", "train-0"), body)
        assert re.search(_held_by("Ascend910-0", ""), body) and re.search(_held_by("Ascend910-1", ""), body)
    finally:
        agent.close()

    apiserver.wait_for(lambda: _annotations(apiserver, "train-0"), lambda got: "huawei.com/kltDev" in got)
    common = ["--backend", "fake", "--pod-resources-socket", str(podresources.path), "--json"]
    cluster = ["--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE]
    rows = {
        row["id"]: row["holders"]
        for row in json.loads(run_cli("list", *common, *cluster, "--volcano").stdout)
    }
    holder = [{"namespace": "team-a", "pod": "train-0", "container": "main"}]
    assert (rows["Ascend910-3"], rows["Ascend910-5"], rows["Ascend910-0"]) == (holder, holder, [])
    rows = {row["id"]: row["holders"] for row in json.loads(run_cli("list", *common).stdout)}
    assert (rows["Ascend910-0"], rows["Ascend910-3"]) == (holder, []), "without --volcano: the kubelet's IDs"


def test_a_pod_holds_the_chips_handed_over_for_its_kubelet_ids_after_the_marks_went_elsewhere(
    kubelet: KubeletStandin, apiserver: ApiServer, podresources: PodResourcesStandin
) -> None:
    """``legit`` (team-a) was placed by Volcano on chips 6 and 7; a pod of team-b naming them with
    ``predicate-time: "1"`` got the Allocate the kubelet made for ``legit`` (nothing in an Allocate says
    which pod it is for; the chart's admission policy keeps such annotations off pods), so the marks are on
    it. The kubelet lists ``legit`` under its own IDs 2 and 3: ``legit`` holds chips 6 and 7, and once that
    pod is gone another team-b pod naming them is skipped, also by an agent started again."""
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    apiserver.put("pods", _pod("legit", "Ascend910-6,Ascend910-7", "1700000000000"))
    apiserver.put("pods", _pod("thief", "Ascend910-6,Ascend910-7", "1", namespace="team-b"))
    args = ("--volcano", "--pod-resources-socket", str(podresources.path), "--health-interval", "1")
    agent = _start(kubelet, apiserver, *args)
    try:
        assert _allocate(kubelet, ["Ascend910-2", "Ascend910-3"]).envs["ASCEND_VISIBLE_DEVICES"] == "6,7"
        podresources.hold(T, ["Ascend910-2", "Ascend910-3"], "team-a", "legit", "main")
        apiserver.wait_for(
            lambda: _annotations(apiserver, "thief", "team-b"), lambda marks: "huawei.com/kltDev" in marks
        )
        apiserver.delete("pods", "thief", "team-b")
        _create(apiserver, _pod("thief-2", "Ascend910-6,Ascend910-7", "2", namespace="team-b"))
        _listed_by_agent(podresources)
        with pytest.raises(grpc.RpcError) as refused:
            _allocate(kubelet, ["Ascend910-4", "Ascend910-5"])
        assert "pod team-b/thief-2 names Ascend910-6" in str(refused.value.details())
        assert "which pod team-a/legit has" in str(refused.value.details())
        assert "pod team-a/legit holds Ascend910-6 already" in str(refused.value.details()), "admitted before"
        assert agent.terminate(timeout=20)[0] == 0
    finally:
        agent.close()

    # `ascend-agent list` reads the agent's record too: legit on chips 6 and 7, not on the kubelet's IDs.
    config = kubelet.directory.parent / "list.yaml"
    config.write_text(f"kubeletDir: {kubelet.directory}\n")
    common = ["--backend", "fake", "--pod-resources-socket", str(podresources.path), "--json"]
    cluster = ["--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE, "--volcano"]
    listed = run_cli("list", "--config", str(config), *common, *cluster)
    rows = {row["id"]: row["holders"] for row in json.loads(listed.stdout)}
    legit = [{"namespace": "team-a", "pod": "legit", "container": "main"}]
    assert (rows["Ascend910-6"], rows["Ascend910-7"], rows["Ascend910-2"]) == (legit, legit, []), (
        listed.stderr
    )

    agent = _start(kubelet, apiserver, *args)
    try:
        _listed_by_agent(podresources)
        with pytest.raises(grpc.RpcError) as refused:
            _allocate(kubelet, ["Ascend910-4", "Ascend910-5"])
        assert "which pod team-a/legit has" in str(refused.value.details()), "the agent started again knows"
        agent.wait_log("read from .*handed-out.json")
    finally:
        agent.close()


def _listed_by_agent(podresources: PodResourcesStandin) -> None:
    """The agent has read the holders PodResources lists now: it asks again only once it took in an answer."""
    podresources.wait_calls(podresources.calls + 2)


@pytest.mark.parametrize("admitted", [False, True], ids=["as created", "admitted, waiting for its image"])
def test_the_marks_land_on_the_pod_volcano_bound_not_on_one_created_on_the_node(
    kubelet: KubeletStandin, apiserver: ApiServer, volcano: AgentProcess, admitted: bool
) -> None:
    """A pod of team-b created with the node named and Volcano's annotation, ``predicate-time: "1"``: no
    scheduler bound it, so the Allocate the kubelet makes for ``legit`` is ``legit``'s, marks included. Once
    the kubelet admitted it (and wrote ``PodScheduled: True`` and ``startTime``, as for every pod it syncs),
    it still waits in Pending for its image, and is still no pod an Allocate is for."""
    apiserver.put("pods", _pod("legit", "Ascend910-6,Ascend910-7", "1700000000000"))
    thief = _pod("thief", "Ascend910-6,Ascend910-7", "1", namespace="team-b", bound=admitted)
    if admitted:
        thief["status"]["startTime"] = "2026-01-02T03:04:05Z"
    apiserver.put("pods", thief)
    assert _allocate(kubelet, ["Ascend910-2", "Ascend910-3"]).envs["ASCEND_VISIBLE_DEVICES"] == "6,7"
    marks = apiserver.wait_for(
        lambda: _annotations(apiserver, "legit"), lambda got: "huawei.com/kltDev" in got
    )
    assert (marks["huawei.com/kltDev"], marks["huawei.com/AscendReal"]) == (
        "Ascend910-2,Ascend910-3",
        "Ascend910-6,Ascend910-7",
    )
    assert _annotations(apiserver, "thief", "team-b")["predicate-time"] == "1"
    if not admitted:
        volcano.wait_log("Pod team-b/thief is ignored: it names chips but no scheduler bound it")


def test_five_pods_naming_a_held_chip_cost_a_volcano_pod_no_refused_allocate(
    kubelet: KubeletStandin, apiserver: ApiServer, volcano: AgentProcess
) -> None:
    """Five pods of team-b name chip 6, which ``legit-0`` has, with predicate-times smaller than
    ``legit-1``'s. The kubelet does not retry a refused Allocate (it fails the pod), so ``legit-1`` must get
    its chip from the first: each of the five is skipped with a log line and an Event on it."""
    apiserver.put("pods", _pod("legit-0", "Ascend910-6", "100", count=1))
    assert _allocate(kubelet, ["Ascend910-0"]).envs["ASCEND_VISIBLE_DEVICES"] == "6"
    for n in range(1, 6):
        apiserver.put("pods", _pod(f"thief-{n}", "Ascend910-6", str(n), count=1, namespace="team-b"))
    apiserver.put("pods", _pod("legit-1", "Ascend910-7", "200", count=1))
    assert _allocate(kubelet, ["Ascend910-1"]).envs["ASCEND_VISIBLE_DEVICES"] == "7", "the first Allocate"
    volcano.wait_log(r"Pod team-b/thief-\d is skipped: .* which pod team-a/legit-0 has", count=5)

    def skipped() -> list[dict[str, Any]]:
        return [e for e in apiserver.list("events", "team-b") if e["reason"] == "NPUChoiceSkipped"]

    events = apiserver.wait_for(skipped, lambda found: len(found) == 5)
    assert sorted(e["involvedObject"]["name"] for e in events) == [f"thief-{n}" for n in range(1, 6)]
    assert {(e["involvedObject"]["kind"], e["type"]) for e in events} == {("Pod", "Warning")}
    assert all("names Ascend910-6" in e["message"] for e in events)


@pytest.mark.soak
def test_soak_2000_volcano_pods_come_get_chips_and_go(
    kubelet: KubeletStandin, apiserver: ApiServer, volcano: AgentProcess
) -> None:
    """Every pod the agent cached, took and marked is forgotten when it goes: memory and descriptors level
    off while pods keep coming."""

    def rounds(first: int, count: int) -> None:
        for n in range(first, first + count):
            chips = f"Ascend910-{2 * n % 8},Ascend910-{(2 * n + 1) % 8}"
            _create(apiserver, _pod(f"job-{n}", chips, str(1000 + n)))
            container = _allocate(kubelet, ["Ascend910-0", "Ascend910-1"])
            assert container.envs["ASCEND_VISIBLE_DEVICES"] == chips.replace("Ascend910-", "")
            apiserver.wait_for(
                lambda n=n: _annotations(apiserver, f"job-{n}"), lambda a: "huawei.com/kltDev" in a
            )
            apiserver.delete("pods", f"job-{n}", "team-a")

    rounds(0, 200)
    fds, rss = volcano.open_fds(), volcano.rss_kib()
    rounds(200, 1800)
    grown = volcano.rss_kib() - rss
    print(f"soak: 2000 Volcano pods, fds {fds} -> {volcano.open_fds()}, RSS grew {grown} KiB")
    assert volcano.open_fds() <= fds + 2
    assert grown < 2 * 1024, f"RSS grew by {grown} KiB over 1,800 Volcano pods"
