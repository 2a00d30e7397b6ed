"""The chart released with Helm on the real node, as an operator installs it, and the DaemonSet's own pod that
runs the agent from its image on containerd.

The node's driver tree is made under the cluster's work directory: the driver's files, and stand-ins for
npu-smi and hccn_tool in its ``tools`` directory, which the chart mounts at the same path inside the pod (they
run under the image's own Python); the chips' and management devices' nodes are the harness's stand-ins in
/dev. The values point the chart's hostPaths at that tree::

    node = DriverTree.make(cluster)
    released = helm.install(cluster, chart_values(cluster, node))
    pod = wait_agent_pod(cluster)           # Running and Ready by its probe
"""

from __future__ import annotations

import calendar
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import helm
from tests.cluster.agent import RENDERS
from tests.cluster.harness import NODE_NAME, Cluster
from tests.cluster.node import allocatable_path
from tests.cluster.polling import until
from tests.support import FIXTURES
from tests.support.hccn_fake import FakeHccnTool
from tests.support.npusmi_fake import FakeNpuSmi

DAEMONSET = "ascend-device-plugin-daemonset"
NAMESPACE = helm.NAMESPACE
SELECTOR = "app.kubernetes.io/name=ascend-agent"
B4_INFO = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()
# The image's interpreter runs the stand-ins inside the pod, the host's beside it (the doctor on the node).
IN_IMAGE = "/usr/bin/env python3"


@dataclass(frozen=True)
class DriverTree:
    """The Ascend driver's files as a node has them, under ``root`` instead of /."""

    root: Path
    npu_smi: FakeNpuSmi
    hccn_tool: FakeHccnTool

    @property
    def driver(self) -> Path:
        return self.root / "usr/local/Ascend/driver"

    @classmethod
    def make(cls, cluster: Cluster, chips_info: str = B4_INFO) -> DriverTree:
        root = cluster.work / "node"
        driver = root / "usr/local/Ascend/driver"
        for directory in (driver / "lib64", driver / "include", driver / "tools", root / "usr/local/dcmi"):
            directory.mkdir(parents=True, exist_ok=True)
        (driver / "version.info").write_text("Version=25.0.rc1.1\nascendhal_version=7.35.23\n")
        (root / "etc").mkdir(exist_ok=True)
        (root / "etc/ascend_install.info").write_text(f"Driver_Install_Path_Param={driver.parent}\n")
        # Each stand-in in a directory of its own under tools/ (its answers beside it), all under the tree the
        # chart mounts: the pod sees the same paths.
        npu_smi = FakeNpuSmi(_directory(driver / "tools" / "npu-smi.d"), IN_IMAGE)
        npu_smi.set_output("info", chips_info)
        hccn_tool = FakeHccnTool(_directory(driver / "tools" / "hccn.d"), IN_IMAGE)
        link = driver / "tools" / "hccn_tool"
        link.unlink(missing_ok=True)  # the tree of a module before
        link.symlink_to(hccn_tool.path)
        return cls(root, npu_smi, hccn_tool)


def _directory(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def chart_values(cluster: Cluster, node: DriverTree, **config: Any) -> dict[str, Any]:
    """The chart's values for this node: its hostPaths in the driver tree, the CDI directory containerd reads,
    ``config`` over the chart's settings (None deletes one, as in Helm)."""
    return {
        "host": {
            "npuSmi": str(node.npu_smi.path),
            "driverDir": str(node.driver),
            "dcmiDir": str(node.root / "usr/local/dcmi"),
            "installInfo": str(node.root / "etc/ascend_install.info"),
            "cdiDir": str(cluster.cdi_dir),
        },
        "config": {"cdiSpecDir": str(cluster.cdi_dir), **config},
    }


def remove_applied_chart(cluster: Cluster) -> None:
    """Helm's engine there (else the test skips, or fails under `make e2e`), the chart's objects that other
    modules applied with kubectl deleted (Helm adopts none of them), and the node labelled for the
    DaemonSet's nodeSelector as the README's install says."""
    if not helm.HELM_PYTHON.exists():
        reason = f"{helm.HELM_PYTHON} is missing: `make e2e` makes it (Python >= 3.12)"
        if os.environ.get("E2E_REQUIRE_CLUSTER"):
            pytest.fail(reason)
        pytest.skip(reason)
    for render in sorted(RENDERS.glob("*.yaml")):
        answer = cluster.kubectl(
            "delete", "-f", str(render), "--ignore-not-found", "--wait=true", timeout=120, check=False
        )
        # Objects of a kind this release does not serve (ValidatingAdmissionPolicy before 1.30) were not made.
        other = [line for line in answer.stderr.splitlines() if line.strip() and not _unserved_kind(line)]
        assert answer.returncode == 0 or not other, answer.stderr
    cluster.kubectl("label", "node", NODE_NAME, "accelerator=huawei-Ascend910", "--overwrite")


def _unserved_kind(line: str) -> bool:
    """Whether kubectl's line says the API server serves no such kind."""
    return "no matches for kind" in line or "ensure CRDs are installed first" in line


def released(result: helm.HelmResult) -> None:
    assert result.error is None, result.error


def upgraded(cluster: Cluster, values: dict[str, Any], resource: str = "huawei.com/Ascend910") -> None:
    """``helm upgrade`` to ``values``, then until the DaemonSet rolled and its pod registered again: a pod
    the kubelet admits while the agent is away fails (its devices count as unhealthy meanwhile)."""
    released(helm.upgrade(cluster, values))
    agent_pod(cluster)
    cluster.kubectl(
        "wait", f"node/{NODE_NAME}", f"--for=jsonpath={allocatable_path(resource)}=8", "--timeout=90s",
        timeout=120,
    )  # fmt: skip


def rolled_out(cluster: Cluster, timeout: int = 180) -> None:
    """Until the DaemonSet's pods are all of its newest template and available (its probe passed)."""
    cluster.kubectl(
        "rollout", "status", f"daemonset/{DAEMONSET}", "-n", NAMESPACE, f"--timeout={timeout}s",
        timeout=timeout + 30,
    )  # fmt: skip


def agent_pods(cluster: Cluster) -> list[dict[str, Any]]:
    answer = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", SELECTOR, "-o", "json")
    pods: list[dict[str, Any]] = json.loads(answer.stdout)["items"]
    return pods


def agent_pod(cluster: Cluster) -> dict[str, Any]:
    """The DaemonSet's one pod on the node once it is Running and Ready (after a rollout: the new one)."""
    rolled_out(cluster)

    def ready(pods: list[dict[str, Any]]) -> bool:
        live = [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]
        return len(live) == 1 and any(
            c["type"] == "Ready" and c["status"] == "True" for c in live[0]["status"].get("conditions", [])
        )

    pods = until(lambda: agent_pods(cluster), ready, "the DaemonSet's pod Running and Ready", timeout=120)
    (pod,) = (pod for pod in pods if not pod["metadata"].get("deletionTimestamp"))
    return pod


def agent_log(cluster: Cluster, pod: str, previous: bool = False) -> list[dict[str, Any]]:
    """The agent's JSON log lines (`kubectl logs`), other lines left out."""
    args = ["logs", pod, "-n", NAMESPACE, *(["--previous"] if previous else [])]
    lines = []
    for line in cluster.kubectl(*args, check=False).stdout.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def logged(cluster: Cluster, pod: str, text: str, timeout: float = 90) -> dict[str, Any]:
    """The agent's first log line whose message holds ``text``, waited for."""
    lines = until(
        lambda: agent_log(cluster, pod),
        lambda found: any(text in line.get("msg", "") for line in found),
        f"the agent's log line {text!r}",
        timeout,
    )
    return next(line for line in lines if text in line.get("msg", ""))


def log_time(line: dict[str, Any]) -> float:
    """A log line's time as seconds since the epoch."""
    stamp = str(line["time"])
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{fraction or 0}")


def keep_agent_logs(cluster: Cluster, name: str) -> None:
    """Every agent pod's log (the previous container's too) kept as ``logs/<name>-<pod>.log``: the kubelet
    removes the pods' own logs with them."""
    for pod in agent_pods(cluster):
        pod_name = pod["metadata"]["name"]
        for previous in (False, True):
            text = cluster.kubectl("logs", pod_name, "-n", NAMESPACE, *(["--previous"] if previous else []),
                                   check=False).stdout  # fmt: skip
            if text:
                suffix = "-previous" if previous else ""
                (cluster.work / "logs" / f"{name}-{pod_name}{suffix}.log").write_text(text)
