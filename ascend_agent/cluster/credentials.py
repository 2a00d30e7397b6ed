"""Where the agent finds the API server and which Node is its own. No client library is imported here.

    target = find_target(kubeconfig=settings.kubeconfig)   # None: no credentials, the cluster side stays off
    node = node_name(settings.node_name)                    # --node-name, else $NODE_NAME, else the hostname

The order is the one Kubernetes' own node agents use: an explicit ``--kubeconfig`` first, then the pod's
service account (in-cluster), then ``$KUBECONFIG``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """How to reach the API server: the pod's service account, or a kubeconfig file."""

    kind: Literal["in-cluster", "kubeconfig"]
    kubeconfig: Path | None = None

    def describe(self) -> str:
        return "the pod's service account" if self.kind == "in-cluster" else f"kubeconfig {self.kubeconfig}"


def find_target(
    kubeconfig: str | None,
    environ: dict[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> ClusterTarget | None:
    """The credentials to use, or None when there are none (the cluster side then stays off)."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        return ClusterTarget("kubeconfig", Path(kubeconfig))
    if env.get("KUBERNETES_SERVICE_HOST") and (service_account_dir / "token").is_file():
        return ClusterTarget("in-cluster")
    from_env = env.get("KUBECONFIG", "").split(os.pathsep)[0]
    if from_env:
        return ClusterTarget("kubeconfig", Path(from_env))
    return None


def node_name(flag: str | None, environ: dict[str, str] | None = None) -> str:
    """The agent's own Node: ``--node-name``, else ``$NODE_NAME`` (the downward API), else the hostname."""
    env = os.environ if environ is None else environ
    return flag or env.get("NODE_NAME") or socket.gethostname()
