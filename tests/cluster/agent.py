"""The agent as the chart deploys it, against the real cluster: the chart's objects (its render by Helm's
engine, tests/fixtures/helm/default.yaml, which ``make helm-render`` writes and tests/unit/test_chart.py keeps
true to the chart) applied with kubectl, and the agent run as a host process with a token of the chart's
ServiceAccount, so that real RBAC decides every request it makes. The fake backend stands in for the chips."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.versions import needs_newer, server_release
from tests.support.agent_process import AgentProcess
from tests.support.processes import OWNER

ROOT = Path(__file__).resolve().parents[2]
RENDERS = ROOT / "tests" / "fixtures" / "helm"
CHART_RENDER = RENDERS / "default.yaml"
DRA_RENDER = RENDERS / "dra.yaml"  # the chart with its DRA values
DRA_DRIVER = "npu.huawei.com"
NAMESPACE = "kube-system"
# Kinds of the chart, and the release from which the API server serves them.
SERVED_FROM = {"FlowSchema": "1.29", "PriorityLevelConfiguration": "1.29"}


def chart_objects(render: Path = CHART_RENDER) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(render.read_text()) if doc]


def chart_object(kind: str, render: Path = CHART_RENDER, suffix: str = "") -> dict[str, Any]:
    """The render's one object of ``kind`` (whose name ends in ``suffix``)."""
    (found,) = (
        doc
        for doc in chart_objects(render)
        if doc["kind"] == kind and doc["metadata"]["name"].endswith(suffix)
    )
    return found


def served_objects(cluster: Cluster, render: Path = CHART_RENDER) -> list[dict[str, Any]]:
    """The chart's objects that Helm installs on the cluster's release: the flow control objects need
    flowcontrol.apiserver.k8s.io/v1 (1.29), and the chart leaves them out before."""
    release = server_release(cluster)
    return [
        doc
        for doc in chart_objects(render)
        if doc["kind"] not in SERVED_FROM or not needs_newer(release, SERVED_FROM[doc["kind"]])
    ]


def apply_chart(cluster: Cluster, render: Path = CHART_RENDER) -> None:
    """The README's install: the node labelled for the DaemonSet's nodeSelector, then the chart's objects."""
    cluster.kubectl("label", "node", NODE_NAME, "accelerator=huawei-Ascend910", "--overwrite")
    cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(served_objects(cluster, render)))


def agent_settings(cluster: Cluster, render: Path = CHART_RENDER, **overrides: Any) -> dict[str, Any]:
    """The chart's ConfigMap settings, with the fake backend's eight 910B chips, and the host paths that would
    outlive the cluster moved into its work directory."""
    settings: dict[str, Any] = yaml.safe_load(chart_object("ConfigMap", render)["data"]["config.yaml"])
    settings.update(
        backend="fake",
        fakeChips=8,
        fakeModel="910B4",
        cdiSpecDir=str(cluster.work / "cdi"),
        metricsAddress="127.0.0.1:9410",
    )
    settings.update(overrides)
    return settings


def agent_user(render: Path = CHART_RENDER) -> str:
    """The API server's name for the chart's ServiceAccount, which the agent's requests carry."""
    account = chart_object("ServiceAccount", render)["metadata"]
    return f"system:serviceaccount:{account['namespace']}:{account['name']}"


def agent_args(cluster: Cluster, render: Path = CHART_RENDER, **overrides: Any) -> list[str]:
    """`ascend-agent run` with a token of the chart's ServiceAccount and the chart's settings."""
    account = chart_object("ServiceAccount", render)["metadata"]["name"]
    # Bound to the Node, as a pod's token is to its node: the API server then knows the agent's node (a DRA
    # driver may write the status of the claims allocated there). Tokens bound to a Node come with 1.31.
    bound = (
        []
        if needs_newer(server_release(cluster), "1.31")
        else ["--bound-object-kind=Node", f"--bound-object-name={NODE_NAME}"]
    )
    token = cluster.kubectl(
        "create", "token", account, "-n", NAMESPACE, "--duration=2h", *bound
    ).stdout.strip()  # fmt: skip
    kubeconfig = cluster.work / "agent.kubeconfig"
    cluster.write_kubeconfig(kubeconfig, token)
    config = cluster.work / "agent.yaml"
    # Renamed into place: an agent still running reloads the file when it changes (a rolling update's
    # old process shares it, as two pods of a DaemonSet share its ConfigMap) and must never read half of it.
    written = config.with_suffix(".new")
    written.write_text(yaml.safe_dump(agent_settings(cluster, render, **overrides)))
    written.replace(config)
    return ["run", "--config", str(config), "--kubeconfig", str(kubeconfig), "--node-name", NODE_NAME]


def start_agent(
    cluster: Cluster, render: Path = CHART_RENDER, env: dict[str, str] | None = None, **overrides: Any
) -> AgentProcess:
    """The agent with the chart's ServiceAccount token, in the cluster's network namespace; ``env`` adds to
    its environment (``POD_UID``, as the downward API gives the chart's pod). It belongs to the cluster's
    maker (a module's agents outlive the test that started one): its module stops it."""
    owner = {OWNER: cluster.owner} if cluster.owner else {}
    return AgentProcess(
        agent_args(cluster, render, **overrides), env={**owner, **(env or {})}, wrapper=cluster.in_netns([])
    )


def stop_agent(cluster: Cluster, process: AgentProcess, log_name: str) -> None:
    """The agent process stopped, its output kept as ``logs/<log_name>.log``."""
    if process.proc.poll() is None:
        process.terminate(timeout=20)
    process.close()
    (cluster.work / "logs" / f"{log_name}.log").write_text(process.output)


def stop_agents(cluster: Cluster, started: list[AgentProcess], log_name: str) -> None:
    """Every agent process a module started stopped, its output kept as ``logs/<log_name>-<n>.log``."""
    for number, process in enumerate(started, 1):
        stop_agent(cluster, process, f"{log_name}-{number}")


@contextmanager
def running_agent(
    cluster: Cluster,
    log_name: str,
    render: Path = CHART_RENDER,
    registered: str | None = None,
    **overrides: Any,
) -> Iterator[AgentProcess]:
    """``start_agent``'s process, waited for until it logs ``registered`` (when given), stopped at the end."""
    process = start_agent(cluster, render, **overrides)
    try:
        if registered is not None:
            process.wait_log(registered, timeout=60)
        yield process
    finally:
        stop_agent(cluster, process, log_name)


@contextmanager
def fake_dra_agent(cluster: Cluster, log_name: str, state: Path, **overrides: Any) -> Iterator[AgentProcess]:
    """The chart's DRA values and the example DeviceClasses applied, then the agent on 8 fake 910B4 chips
    whose state file is ``state`` (empty at first), once it has registered its DRA driver."""
    apply_chart(cluster, DRA_RENDER)
    cluster.kubectl("apply", "-f", str(ROOT / "examples" / "dra" / "deviceclasses.yaml"))
    state.write_text("{}")
    with running_agent(
        cluster,
        log_name,
        DRA_RENDER,
        registered=f"Registered DRA driver {DRA_DRIVER}",
        backend="fake",
        fakeChips=8,
        fakeModel="910B4",
        fakeState=str(state),
        **overrides,
    ) as process:
        yield process


def run_doctor(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`ascend-agent doctor ARGS` on the node (the host, in the cluster's network namespace), as an operator
    runs it there."""
    argv = [sys.executable, "-m", "ascend_agent", "doctor", *args]
    return subprocess.run(cluster.in_netns(argv), capture_output=True, text=True, timeout=120, check=False)


def run_kubectl_ascend(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl ascend ARGS` (the installed `kubectl-ascend`) with the cluster's admin kubeconfig, as an
    operator runs it."""
    plugin = Path(sys.executable).with_name("kubectl-ascend")
    argv = [str(plugin), "--kubeconfig", str(cluster.admin_kubeconfig), *args]
    return subprocess.run(cluster.in_netns(argv), capture_output=True, text=True, timeout=120, check=False)


def agent_metrics(cluster: Cluster) -> str:
    """The agent's /metrics on the chart's address, as Prometheus on the node reads it ("" unanswered)."""
    return subprocess.run(
        cluster.in_netns(["curl", "-sf", "http://127.0.0.1:9410/metrics"]),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    ).stdout
