"""Why the agent's own pod is not running, from what the node and the pod say: a hostPath volume whose path
the node lacks (the kubelet's ``hostPath type check failed``, which holds the pod in ContainerCreating), and
the container's waiting reason (an image not on the node, a crash loop). Pure: the caller reads the pod
through the API and hands over the host's root (``/host`` inside the pod, ``/`` on the node)::

    stuck = not_running(pod, Path("/"))
    stuck.detail   # "volume ascend-driver: /usr/local/Ascend/driver is not on this node (a directory)"
    stuck.hint     # "make /usr/local/Ascend/driver on this node, or point the chart's host.driverDir at it"
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightkube.resources.core_v1 import Pod

# The chart's volumes (charts/ascend-agent, examples/daemonset.yaml) and the value that names each path.
CHART_VALUES = {
    "ascend-driver": "host.driverDir",
    "dcmi": "host.dcmiDir",
    "npu-smi": "host.npuSmi",
    "ascend-install-info": "host.installInfo",
    "cdi": "host.cdiDir",
    "device-plugins": "config.kubeletDir",
    "pod-resources": "cluster.podResourcesDir",
    "kubelet-plugins": "dra.pluginsDir",
    "plugins-registry": "config.pluginsRegistryDir (dra.pluginsRegistryDir with dra.enabled)",
}
# hostPath types whose path the kubelet requires to be there already, and what it must be.
_REQUIRED = {"Directory": ("a directory", stat.S_ISDIR), "File": ("a file", stat.S_ISREG)}
_IMAGE_REASONS = ("ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName")


@dataclass(frozen=True, slots=True)
class NotRunning:
    detail: str
    hint: str


def missing_host_paths(pod: Pod, host_root: Path) -> list[NotRunning]:
    """Each hostPath volume of ``pod`` that must exist (type Directory or File) and is not there, or not of
    that kind, under ``host_root``."""
    found = []
    for volume in (pod.spec.volumes if pod.spec else None) or []:
        host_path = volume.hostPath
        if host_path is None or host_path.type not in _REQUIRED:
            continue
        kind, is_kind = _REQUIRED[host_path.type]
        try:
            mode = os.stat(host_root / host_path.path.lstrip("/")).st_mode
        except OSError:
            mode = None
        if mode is not None and is_kind(mode):
            continue
        value = CHART_VALUES.get(volume.name)
        where = f"point the chart's {value} at it" if value else "correct the DaemonSet's hostPath"
        state = "is not on this node" if mode is None else f"is not {kind}"
        found.append(
            NotRunning(
                f"volume {volume.name}: {host_path.path} {state} ({kind})",
                f"make {host_path.path} on this node, or {where}",
            )
        )
    return found


def not_running(pod: Pod, host_root: Path) -> NotRunning | None:
    """What keeps the agent's container from running: while the pod is still being created (its volumes are
    mounted before anything starts), a missing hostPath; then the container's waiting reason; None when
    neither says. A pod that runs is never judged by its paths: a doctor inside it sees only the host paths
    it mounts under ``host_root``."""
    statuses = (pod.status.containerStatuses if pod.status else None) or []
    creating = (pod.status.phase if pod.status else None) in (None, "Pending") and all(
        status.state is None or (status.state.waiting and status.state.waiting.reason == "ContainerCreating")
        for status in statuses
    )
    missing = missing_host_paths(pod, host_root) if creating else []
    if missing:
        return NotRunning("; ".join(m.detail for m in missing), missing[0].hint)
    for status in statuses:
        waiting = status.state.waiting if status.state else None
        if waiting is None or not waiting.reason:
            continue
        message = " ".join((waiting.message or "").split())[:300]
        if waiting.reason in _IMAGE_REASONS:
            return NotRunning(
                f"container {status.name} waits: {waiting.reason} ({status.image})",
                f"import {status.image} into the node's containerd (ctr -n k8s.io images import) or set "
                "the chart's image.repository, image.tag and image.pullPolicy",
            )
        if waiting.reason == "CrashLoopBackOff":
            where = f"-n {pod.metadata.namespace} {pod.metadata.name}" if pod.metadata else "<pod>"
            return NotRunning(
                f"container {status.name} restarts (CrashLoopBackOff, {status.restartCount} restarts)",
                f"its last lines say why: kubectl logs --previous {where}",
            )
        if waiting.reason != "ContainerCreating":
            return NotRunning(f"container {status.name} waits: {waiting.reason}: {message}", "")
    return None
