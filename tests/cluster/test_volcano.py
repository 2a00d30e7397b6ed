"""`--volcano` (the chart's Volcano values) under the real API server and kubelet: no Volcano scheduler runs,
so a token of Volcano's scheduler's ServiceAccount binds the pod to the node as Volcano does (a Binding
carrying the annotations its ascend plugin writes); the kubelet's Allocate gets the chips those annotations
name, and the marks the agent writes back (and its device-info ConfigMap and Node annotation) pass the real
API server's validation, the chart's RBAC and its admission policy. The pod's configuration carries the Node's
InternalIP, and `ascend-agent ranktable` with the chart's token prints a valid v1.0 rank-table part with the
pod's real IP. The chart's ValidatingAdmissionPolicy refuses a namespace user's pod (create or update) that
sets or changes those annotations, with its message, and lets Volcano's identity write them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.agent import RENDERS, apply_chart, chart_object, running_agent
from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.node import wait_allocatable
from tests.cluster.pods import (
    RESOURCE,
    chip_devices,
    one_pod_spec,
    runtime_spec,
    spec_envs,
    wait_running,
)
from tests.cluster.polling import poll, until
from tests.support.agent_process import AgentProcess
from tests.support.hccl import gather, hccl_json

pytestmark = [
    pytest.mark.e2e_cluster,
    pytest.mark.kubernetes("1.30", "ValidatingAdmissionPolicy, admissionregistration.k8s.io/v1 from 1.30"),
]

RENDER = RENDERS / "volcano.yaml"
# The chart's policy on the annotations the agent trusts (it has another, on the agent's own ConfigMaps).
ANNOTATION_POLICY = "-volcano-annotations"
# The chart's volcano.annotationPolicy.schedulerServiceAccount by default: Volcano's own install.
VOLCANO = ("volcano-system", "volcano-scheduler")
VOLCANO_USER = f"system:serviceaccount:{VOLCANO[0]}:{VOLCANO[1]}"
# A namespace user: team-b's ServiceAccount with the edit role there.
DEVELOPER = ("team-b", "developer")
DEVELOPER_USER = f"system:serviceaccount:{DEVELOPER[0]}:{DEVELOPER[1]}"


def _apply(cluster: Cluster, *objects: dict[str, Any]) -> None:
    cluster.kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )


def _account_token(cluster: Cluster, namespace: str, name: str) -> str:
    return cluster.kubectl("create", "token", name, "-n", namespace, "--duration=1h").stdout.strip()


@pytest.fixture(scope="module")
def volcano_token(cluster: Cluster) -> str:
    """A token of Volcano's scheduler's ServiceAccount, with what Volcano's own install gives it on pods."""
    namespace, name = VOLCANO
    _apply(
        cluster,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "e2e-volcano-scheduler"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["create", "get", "list", "patch", "update"],
                },
                {"apiGroups": [""], "resources": ["pods/binding", "bindings"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "e2e-volcano-scheduler"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "e2e-volcano-scheduler",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    return _account_token(cluster, namespace, name)


@pytest.fixture(scope="module")
def developer_token(cluster: Cluster) -> Iterator[str]:
    """A token of a namespace user: the ServiceAccount team-b/developer, with the edit role in team-b."""
    namespace, name = DEVELOPER
    _apply(
        cluster,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "developer-edit", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    yield _account_token(cluster, namespace, name)
    cluster.kubectl(
        "delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False, timeout=90
    )


@pytest.fixture(scope="module")
def volcano_agent(cluster: Cluster) -> Iterator[AgentProcess]:
    apply_chart(cluster, RENDER)
    try:
        with running_agent(
            cluster,
            "agent-volcano",
            RENDER,
            registered=f"Registered resource {RESOURCE}",
            backend="fake",
            fakeChips=8,
            fakeModel="910B4",
            fakeTraining=True,
        ) as process:
            yield process
    finally:  # cluster-wide: the other modules' pods are not checked by it
        for kind in ("ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy"):
            name = chart_object(kind, RENDER, ANNOTATION_POLICY)["metadata"]["name"]
            cluster.kubectl("delete", kind.lower(), name, "--ignore-not-found", check=False)


def _forged_pod(name: str, namespace: str) -> dict[str, Any]:
    """A pod naming chips 6 and 7 with the smallest predicate-time, as a user would write it to take the
    next Volcano Allocate of two chips."""
    pod = one_pod_spec(name, name, 2)
    pod["metadata"]["namespace"] = namespace
    pod["metadata"]["annotations"] = {RESOURCE: "Ascend910-6,Ascend910-7", "predicate-time": "1"}
    pod["spec"]["schedulerName"] = "volcano"
    return pod


def _as(
    cluster: Cluster, token: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """kubectl with ``token`` in place of the admin's."""
    return cluster.kubectl(f"--token={token}", *args, stdin=stdin, check=False)


def _wait_enforced(cluster: Cluster, developer_token: str) -> None:
    """The API server enforces the chart's policy (it loads a new policy within a few seconds): a forged pod
    refused on a dry run, which goes through admission and stores nothing."""
    forged = json.dumps(_forged_pod("probe", DEVELOPER[0]))
    until(
        lambda: _as(cluster, developer_token, "create", "--dry-run=server", "-f", "-", stdin=forged),
        lambda answer: answer.returncode != 0 and "ValidatingAdmissionPolicy" in answer.stderr,
        "the chart's admission policy enforced",
    )


def test_the_chips_volcano_chose_and_the_marks_written_back(
    cluster: Cluster, volcano_agent: AgentProcess, volcano_token: str, developer_token: str
) -> None:
    wait_allocatable(cluster, "8")
    _wait_enforced(cluster, developer_token)
    pod = one_pod_spec("placed", "placed", 2)
    pod["spec"]["schedulerName"] = "volcano"  # only pods Volcano placed name their chips
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    # Bound as Volcano binds it: a Binding that carries the pod's annotations, its choice among them.
    chosen = {RESOURCE: "Ascend910-3,Ascend910-5", "predicate-time": "1700000000000", "hccl/rankIndex": "0"}
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "placed", "namespace": "default", "annotations": chosen},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME},
    }
    try:
        path = "/api/v1/namespaces/default/pods/placed/binding"
        bound = _as(cluster, volcano_token, "create", "--raw", path, "-f", "-", stdin=json.dumps(binding))
        assert bound.returncode == 0, bound.stderr
        wait_running(cluster, "placed")
        spec = runtime_spec(cluster, "placed", "placed")
        assert chip_devices(spec) == {"/dev/davinci3", "/dev/davinci5"}, spec["linux"].get("devices")
        assert spec_envs(spec)["ASCEND_VISIBLE_DEVICES"] == "3,5"
        annotations: dict[str, str] = poll(
            lambda: json.loads(cluster.kubectl("get", "pod", "placed", "-o", "json").stdout)["metadata"].get(
                "annotations", {}
            ),
            lambda got: got.get("huawei.com/AscendReal") is not None,
        )
        assert annotations.get("huawei.com/AscendReal") == "Ascend910-3,Ascend910-5", annotations
        assert annotations.get("predicate-time") == "18446744073709551615", annotations
        _the_rank_table(cluster, annotations)
    finally:
        cluster.kubectl("delete", "pod", "placed", "--wait=true", "--timeout=60s", check=False, timeout=90)
    configmap = json.loads(
        cluster.kubectl(
            "get", "configmap", f"mindx-dl-deviceinfo-{NODE_NAME}", "-n", "kube-system", "-o", "json"
        ).stdout
    )
    assert "DeviceInfoCfg" in configmap["data"]
    node = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    assert "baseDeviceInfos" in node["metadata"].get("annotations", {}), node["metadata"].get("annotations")


def _the_rank_table(cluster: Cluster, annotations: dict[str, str]) -> None:
    """The configuration's host_ip is the Node's InternalIP; `ascend-agent ranktable` (the chart's token, its
    RBAC) prints the pod's part of a v1.0 table with the pod's IP."""
    node = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    configuration = json.loads(annotations["ascend.kubectl.kubernetes.io/ascend-910-configuration"])
    assert configuration["host_ip"] == configuration["server_ip"] == internal[0], configuration
    pod = json.loads(cluster.kubectl("get", "pod", "placed", "-o", "json").stdout)
    argv = [sys.executable, "-m", "ascend_agent", "ranktable", "--pod", "default/placed"]
    argv += ["--kubeconfig", str(cluster.work / "agent.kubeconfig"), "--node-name", NODE_NAME]
    printed = subprocess.run(cluster.in_netns(argv), capture_output=True, text=True, timeout=60, check=False)
    assert printed.returncode == 0 and printed.stderr == "", printed.stderr
    table = hccl_json(gather([json.loads(printed.stdout)]), "1.0")
    (server,) = table["server_list"]
    assert (server["host_ip"], server["container_ip"]) == (internal[0], pod["status"]["podIP"])
    assert [(d["device_id"], d["rank_id"]) for d in server["device"]] == [("3", "0"), ("5", "1")]


def test_only_volcano_and_the_agent_write_the_annotations_the_agent_trusts(
    cluster: Cluster, volcano_agent: AgentProcess, volcano_token: str, developer_token: str
) -> None:
    """A namespace user's pod with Volcano's annotations is refused, with the policy's message naming the
    annotations and the user, as is the same user's update that adds one to a pod of theirs; an update of
    another annotation passes. Volcano's identity creates such a pod and changes them; the policy's CEL is
    typed without a warning."""
    _wait_enforced(cluster, developer_token)
    namespace = DEVELOPER[0]
    refused = _as(
        cluster, developer_token, "create", "-f", "-", stdin=json.dumps(_forged_pod("thief", namespace))
    )
    assert refused.returncode != 0
    print(f"a namespace user's forged pod: {refused.stderr.strip()}")
    policy = chart_object("ValidatingAdmissionPolicy", RENDER, ANNOTATION_POLICY)["metadata"]["name"]
    assert f"ValidatingAdmissionPolicy '{policy}'" in refused.stderr, refused.stderr
    said = refused.stderr
    assert f"only the Volcano scheduler ({VOLCANO_USER}) and ascend-agent may set or change" in said, said
    assert RESOURCE in said and "predicate-time" in said and f"not {DEVELOPER_USER}" in said, said
    assert "thief" not in cluster.kubectl("get", "pods", "-n", namespace, "-o", "name").stdout

    plain = one_pod_spec("plain", "plain", 1)
    plain["metadata"]["namespace"] = namespace
    plain["metadata"]["annotations"] = {"team-b/owner": "dev"}
    plain["spec"]["schedulerName"] = "volcano"  # never placed here: no Volcano runs
    made = _as(cluster, developer_token, "create", "-f", "-", stdin=json.dumps(plain))
    assert made.returncode == 0, made.stderr
    forged_update = json.dumps({"metadata": {"annotations": {"predicate-time": "1"}}})
    updated = _as(cluster, developer_token, "patch", "pod", "plain", "-n", namespace, "-p", forged_update)
    assert updated.returncode != 0 and "predicate-time" in updated.stderr, updated.stderr
    other = json.dumps({"metadata": {"annotations": {"team-b/owner": "ops"}}})
    updated = _as(cluster, developer_token, "patch", "pod", "plain", "-n", namespace, "-p", other)
    assert updated.returncode == 0, updated.stderr

    by_volcano = _as(
        cluster,
        volcano_token,
        "create",
        "--dry-run=server",
        "-f",
        "-",
        stdin=json.dumps(_forged_pod("placed", namespace)),
    )
    assert by_volcano.returncode == 0, by_volcano.stderr
    by_volcano = _as(cluster, volcano_token, "patch", "pod", "plain", "-n", namespace, "-p", forged_update)
    assert by_volcano.returncode == 0, by_volcano.stderr

    status = poll(
        lambda: json.loads(cluster.kubectl("get", "validatingadmissionpolicy", policy, "-o", "json").stdout),
        lambda got: got.get("status", {}).get("observedGeneration") == got["metadata"]["generation"],
    )
    assert not status["status"].get("typeChecking", {}).get("expressionWarnings"), status["status"]
