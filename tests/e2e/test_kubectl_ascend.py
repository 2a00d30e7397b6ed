"""``kubectl ascend`` end to end: an agent on the fake backend publishes its node summary to the Kubernetes
API emulator, and the installed ``kubectl-ascend`` executable reads it through a kubeconfig, as kubectl runs
it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ascend_agent.node_summary import DATA_KEY, LABEL, NAMESPACE, configmap_name
from tests.support.agent_process import fake_agent
from tests.support.apiserver import ApiServer
from tests.support.kubelet_standin import KubeletStandin
from tests.support.podresources import PodResourcesStandin

NODE = "npu-node-1"
PLUGIN = shutil.which("kubectl-ascend", path=str(Path(sys.executable).parent))


def _plugin(apiserver: ApiServer, *arguments: str) -> subprocess.CompletedProcess[str]:
    assert PLUGIN is not None, "kubectl-ascend is installed beside the interpreter (pip install -e .)"
    return subprocess.run(
        [PLUGIN, "--kubeconfig", str(apiserver.kubeconfig), *arguments],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _summary(apiserver: ApiServer, node: str) -> dict[str, Any] | None:
    found = apiserver.get("configmaps", configmap_name(node), NAMESPACE)
    return None if found is None else json.loads(found["data"][DATA_KEY])


def test_the_cluster_view_names_health_fault_class_and_the_pod_using_each_chip(
    kubelet: KubeletStandin, podresources: PodResourcesStandin, apiserver: ApiServer, short_dir: Path
) -> None:
    state = short_dir / "state.json"
    state.write_text(json.dumps({"faults": {"3": ["80E3A203"]}}))
    podresources.hold("huawei.com/Ascend910", ["Ascend910-2"], "team-a", "train-0", "main")
    process = fake_agent(
        kubelet.directory,
        *("--kubeconfig", str(apiserver.kubeconfig), "--node-name", NODE, "--fake-state", str(state)),
        *("--pod-resources-socket", str(podresources.path)),
    )
    try:
        summary = apiserver.wait_for(
            lambda: _summary(apiserver, NODE),
            lambda found: (
                found is not None
                and found["agent"]["ready"]
                and any(chip["usedBy"] for chip in found["chips"])
                and any(chip["health"] == "Unhealthy" for chip in found["chips"])
            ),
        )
        assert summary is not None and summary["node"] == NODE
        configmap = apiserver.get("configmaps", configmap_name(NODE), NAMESPACE)
        assert configmap is not None and configmap["metadata"]["labels"] == {LABEL: "1"}
        chips = {chip["id"]: chip for chip in summary["chips"]}
        assert chips["Ascend910-3"]["faultClass"] == "RestartNPU"
        assert chips["Ascend910-2"]["usedBy"] == [{"namespace": "team-a", "pod": "train-0"}]
        assert len(json.dumps(summary)) < 200 * len(chips), "sized for many nodes"

        table = _plugin(apiserver)
        assert table.returncode == 0, table.stderr
        header, row = table.stdout.splitlines()[:2]
        assert header.split()[:3] == ["NODE", "AGENT", "READY"]
        assert row.split()[:8] == [
            NODE,
            summary["agent"]["version"],
            "yes",
            "8",
            "7",
            "1",
            "6",
            "Ascend910-3",
        ]
        assert "(RestartNPU)" in row and "ago" in row
        assert "8 chips on 1 node: 7 healthy, 1 in use, 6 free" in table.stdout

        wide = _plugin(apiserver, "--node", NODE)
        assert wide.returncode == 0, wide.stderr
        lines = {line.split()[1]: line for line in wide.stdout.splitlines()[1:] if line.startswith(NODE)}
        assert len(lines) == 8
        assert "team-a/train-0" in lines["Ascend910-2"]
        assert "Unhealthy" in lines["Ascend910-3"] and "RestartNPU" in lines["Ascend910-3"]

        sick = _plugin(apiserver, "-o", "wide", "--unhealthy")
        assert [line.split()[1] for line in sick.stdout.splitlines()[1:] if line.startswith(NODE)] == [
            "Ascend910-3"
        ]

        shown = json.loads(_plugin(apiserver, "-o", "json").stdout)
        assert shown["totals"] == {"nodes": 1, "chips": 8, "healthy": 7, "inUse": 1, "free": 6}
        assert shown["nodes"][0]["stale"] is False
    finally:
        process.close()


# A summary its agent last wrote long ago.
_OLD = {
    "format": 1, "node": "npu-old", "updated": "2026-01-01T00:00:00Z", "problems": [], "vnpus": [],
    "agent": {"version": "0.1.0", "mode": "device-plugin", "ready": True, "reason": ""},
    "chips": [{"id": "Ascend910-0", "model": "910B3", "health": "Healthy", "reason": "", "faultClass": "",
               "flapHeld": False, "usedBy": []}],
}  # fmt: skip


def _put_summary(apiserver: ApiServer, node: str, text: str) -> None:
    apiserver.put(
        "configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": configmap_name(node), "namespace": NAMESPACE, "labels": {LABEL: "1"}},
            "data": {DATA_KEY: text},
        },
    )


def test_a_stale_summary_says_how_old_it_is_and_a_broken_one_is_skipped(apiserver: ApiServer) -> None:
    _put_summary(apiserver, "npu-old", json.dumps(_OLD))
    _put_summary(apiserver, "npu-broken", '{"node": "npu-broken"')
    shown = _plugin(apiserver)
    assert shown.returncode == 0, shown.stderr
    assert "(stale)" in shown.stdout
    assert "npu-old: summary last written" in shown.stdout and "its agent has stopped" in shown.stdout
    assert "1 chips on 1 node: 1 healthy, 0 in use, 1 free" in shown.stdout
    assert (
        shown.stderr.count("\n") == 1 and "skipped kube-system/ascend-agent-node-npu-broken" in shown.stderr
    )
    assert json.loads(_plugin(apiserver, "-o", "json").stdout)["nodes"][0]["stale"] is True


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ((), "no ascend-agent node summaries in kube-system: the agent is not installed"),
        (("--node", "npu-9"), "node npu-9 has no ascend-agent summary (kube-system/ascend-agent-node-npu-9)"),
    ],
)
def test_a_cluster_without_the_agent_is_one_line(
    apiserver: ApiServer, arguments: tuple[str, ...], says: str
) -> None:
    shown = _plugin(apiserver, *arguments)
    assert shown.returncode == 1 and shown.stdout == ""
    assert shown.stderr.count("\n") == 1 and shown.stderr.startswith(f"kubectl-ascend: {says}")


def test_an_api_server_that_does_not_answer_is_one_line(short_dir: Path) -> None:
    kubeconfig = short_dir / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    assert PLUGIN is not None
    shown = subprocess.run(
        [PLUGIN, "--kubeconfig", str(kubeconfig)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 1 and "Traceback" not in shown.stderr
    assert shown.stderr.count("\n") == 1 and shown.stderr.startswith(
        "kubectl-ascend: the Kubernetes API did not"
    )


def test_context_picks_the_kubeconfigs_context(apiserver: ApiServer, short_dir: Path) -> None:
    """A kubeconfig whose current context is a server that does not answer: --context names the one that
    does; a context it does not have is one line."""
    config = yaml.safe_load(apiserver.kubeconfig.read_text())
    working = config["current-context"]
    config["clusters"].append({"name": "dead", "cluster": {"server": "http://127.0.0.1:9"}})
    config["contexts"].append(
        {"name": "dead", "context": {"cluster": "dead", "user": config["users"][0]["name"]}}
    )
    config["current-context"] = "dead"
    kubeconfig = short_dir / "two-contexts"
    kubeconfig.write_text(yaml.safe_dump(config))
    _put_summary(apiserver, "npu-1", json.dumps({**_OLD, "node": "npu-1"}))
    assert PLUGIN is not None

    def run(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PLUGIN, "--kubeconfig", str(kubeconfig), *arguments], capture_output=True, text=True, timeout=60
        )

    assert "the Kubernetes API did not answer" in run().stderr
    chosen = run("--context", working)
    assert chosen.returncode == 0 and "1 chips on 1 node" in chosen.stdout, chosen.stderr
    missing = run("--context", "nowhere")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr
