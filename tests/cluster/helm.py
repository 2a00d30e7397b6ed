"""The Helm chart installed, upgraded and uninstalled as an operator does it, with Helm's own engine
(helm-sdkpy, as charts/check.py uses it) against the test cluster's API server with the admin's kubeconfig;
the release is kept where ``helm`` keeps it (a Secret in its namespace)::

    result = install(cluster, {"config": {"hotReset": "idle"}})
    assert result.error is None, result.error      # else Helm's message, on one line
    result = upgrade(cluster, {"volcano": {"enabled": True}})
    uninstall(cluster)

helm-sdkpy needs Python >= 3.12, which the tests' .venv (3.11) is not: each action runs this file as a
script under .venv-helm's interpreter (`make helm-lint` and `make e2e` make it), in the cluster's network
namespace, with the values on stdin and one JSON line on stdout. Only the standard library is imported at the
top, so that either interpreter can load it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.cluster.harness import Cluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ascend-agent"
HELM_PYTHON = ROOT / ".venv-helm" / "bin" / "python"
RELEASE = "ascend-agent"
NAMESPACE = "kube-system"
# Seconds an action may take, Helm's own wait included (uninstall waits for the objects to be gone).
ACTION_TIMEOUT = 120


@dataclass(frozen=True)
class HelmResult:
    """What an action did: ``error`` is Helm's message on one line (None when it succeeded); ``manifest``
    the objects of the release it installed or upgraded to."""

    error: str | None
    manifest: list[dict[str, Any]] = field(default_factory=list)


def install(
    cluster: Cluster, values: dict[str, Any], release: str = RELEASE, namespace: str = NAMESPACE
) -> HelmResult:
    """``helm install RELEASE charts/ascend-agent -n NAMESPACE`` with ``values`` over the chart's own."""
    return _run(cluster, "install", release, namespace, values)


def upgrade(
    cluster: Cluster,
    values: dict[str, Any],
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    install: bool = False,
) -> HelmResult:
    """``helm upgrade [--install]``: ``values`` over the chart's own (not over the release's last ones)."""
    return _run(cluster, "upgrade-install" if install else "upgrade", release, namespace, values)


def uninstall(cluster: Cluster, release: str = RELEASE, namespace: str = NAMESPACE) -> HelmResult:
    """``helm uninstall --wait``: returns once the release's objects are gone."""
    return _run(cluster, "uninstall", release, namespace, {})


def _run(cluster: Cluster, action: str, release: str, namespace: str, values: dict[str, Any]) -> HelmResult:
    if not HELM_PYTHON.exists():
        raise AssertionError(f"{HELM_PYTHON} is missing: `make helm-lint` (or `make e2e`) makes it")
    # Helm's caches and configuration under the cluster's work directory, not the user's home.
    helm_home = cluster.work / "helm"
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(helm_home / "cache"),
        "HELM_CONFIG_HOME": str(helm_home / "config"),
        "HELM_DATA_HOME": str(helm_home / "data"),
        "HELM_DRIVER": "secret",
    }
    argv = [str(HELM_PYTHON), str(Path(__file__)), action, release, namespace, str(cluster.admin_kubeconfig)]
    answer = subprocess.run(
        cluster.in_netns(argv),
        input=json.dumps(values),
        capture_output=True,
        text=True,
        timeout=ACTION_TIMEOUT + 60,
        env=env,
        check=False,
    )
    if answer.returncode != 0 or not answer.stdout.strip():
        raise AssertionError(f"helm {action} exited {answer.returncode}: {answer.stderr.strip()[-2000:]}")
    outcome = json.loads(answer.stdout.strip().splitlines()[-1])
    import yaml  # the tests' environment has it; the script's side never needs it

    manifest = [doc for doc in yaml.safe_load_all(outcome["manifest"]) if doc]
    return HelmResult(outcome["error"], manifest)


# -- the script, under .venv-helm's interpreter --------------------------------------------------------------


async def _act(action: str, release: str, namespace: str, kubeconfig: str, values: dict[str, Any]) -> str:
    """The release's manifest after ``action``; helm_sdkpy.HelmError when Helm refuses."""
    import helm_sdkpy

    config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig)
    if action == "install":
        done = await helm_sdkpy.Install(config).run(
            release, str(CHART), values=values, wait=False, timeout=ACTION_TIMEOUT
        )
    elif action in ("upgrade", "upgrade-install"):
        done = await helm_sdkpy.Upgrade(config).run(
            release,
            str(CHART),
            values=values,
            install=action == "upgrade-install",
            wait=False,
            timeout=ACTION_TIMEOUT,
        )
    elif action == "uninstall":
        await helm_sdkpy.Uninstall(config).run(release, wait=True, timeout=ACTION_TIMEOUT)
        return ""
    else:
        raise ValueError(f"unknown action {action!r}")
    return str(done.get("manifest", ""))


def main(argv: list[str]) -> int:
    import asyncio

    import helm_sdkpy

    action, release, namespace, kubeconfig = argv
    values = json.loads(sys.stdin.read() or "{}")
    try:
        manifest, error = asyncio.run(_act(action, release, namespace, kubeconfig, values)), None
    except helm_sdkpy.HelmError as refused:
        manifest, error = "", " ".join(str(refused).split())
    print(json.dumps({"error": error, "manifest": manifest}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
