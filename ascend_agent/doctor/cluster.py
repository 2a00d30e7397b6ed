"""The doctor's checks through the Kubernetes API, with the agent's own credentials and client: the agent's
DaemonSet, its pod on this node, and what the API server shows of the node's chips (the mode's)::

    checks = await cluster_checks(settings, daemonset, deviceplugin.MODE, inventory)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ascend_agent.config import DRA_API, Settings
from ascend_agent.doctor.check import API_TIMEOUT as _API_TIMEOUT
from ascend_agent.doctor.check import AgentDaemonSet, Check, Mode
from ascend_agent.doctor.podstate import not_running
from ascend_agent.model import Inventory

if TYPE_CHECKING:
    from lightkube.resources.core_v1 import Pod

    from ascend_agent.cluster.client import KubeApi


async def cluster_checks(
    settings: Settings, ours: AgentDaemonSet, mode: Mode, inventory: Inventory | None
) -> list[Check]:
    """The DaemonSet, its pod on this node, and the node's chips as ``mode`` shows them (capacity, or a DRA
    driver's ResourceSlices), when a Kubernetes API answers (the agent's own credentials and client:
    ``--kubeconfig``, the service account, ``KUBECONFIG``)."""
    from ascend_agent.cluster import find_target, node_name

    node = node_name(settings.node_name)
    target = find_target(str(settings.kubeconfig) if settings.kubeconfig else None)
    if target is None:
        return [
            Check(
                "cluster",
                None,
                "skipped: no Kubernetes API configured (no service account, --kubeconfig or KUBECONFIG)",
                f"kubectl -n {ours.namespace} get ds {ours.name}; {mode.look(node)}",
            )
        ]
    from ascend_agent.cluster.bounded import MIB
    from ascend_agent.cluster.client import ApiUnavailable, ClusterConnectError, KubeApi

    try:
        api = KubeApi.connect(
            target, node, timeout=_API_TIMEOUT, list_limit=settings.api_list_limit_mib * MIB
        )
    except ClusterConnectError as exc:
        return [Check("cluster", None, f"skipped: {exc}")]
    try:
        dra = settings.kubelet_api == DRA_API
        checks = [await _daemonset(api, ours, dra), await _node_pod(api, node, ours, settings.host_root)]
        return [*checks, *await mode.capacity(api, settings, inventory)]
    except ApiUnavailable as exc:
        return [
            Check(
                "cluster",
                False,
                f"the Kubernetes API did not answer: {exc.failure}",
                "check the kubeconfig, the API server and the RBAC of the credentials",
            )
        ]
    finally:
        await api.close()


async def _daemonset(api: KubeApi, ours: AgentDaemonSet, dra: bool) -> Check:
    from lightkube import ApiError
    from lightkube.resources.apps_v1 import DaemonSet

    try:
        daemonset = await api.call(
            "get", "daemonsets", api.client.get(DaemonSet, ours.name, namespace=ours.namespace)
        )
    except ApiError as exc:
        if exc.status.code == 404:
            return Check(
                "daemonset",
                False,
                f"no DaemonSet {ours.name} in {ours.namespace}",
                f"kubectl apply -f examples/{'dra/' if dra else ''}daemonset.yaml",
            )
        raise
    status = daemonset.status
    ready = (status.numberReady if status else 0) or 0
    desired = (status.desiredNumberScheduled if status else 0) or 0
    detail = f"{ours.name}: {ready} of {desired} pods ready"
    if desired == 0:
        return Check("daemonset", False, detail, "no node matches its nodeSelector: label the NPU nodes")
    if ready < desired:
        return Check(
            "daemonset", False, detail, f"kubectl -n {ours.namespace} get pods -o wide | grep {ours.name}"
        )
    return Check("daemonset", True, detail)


async def _node_pod(api: KubeApi, node: str, ours: AgentDaemonSet, host_root: Path) -> Check:
    from lightkube.resources.core_v1 import Pod

    async def pods_here() -> list[Pod]:
        return [
            pod
            async for pod in api.client.list(Pod, namespace=ours.namespace, fields={"spec.nodeName": node})
        ]

    pods = await api.call("list", "pods", pods_here())
    found = [pod for pod in pods if pod.metadata and (pod.metadata.name or "").startswith(f"{ours.name}-")]
    if not found:
        return Check(
            "pod on this node",
            False,
            f"no {ours.name} pod on node {node}",
            f"kubectl -n {ours.namespace} describe ds {ours.name}: "
            "check nodeSelector, tolerations and events",
        )
    # One not going first, then the newest: a rolling update's old pod may still be terminating.
    pod = max(found, key=_judged_first)
    name = pod.metadata.name if pod.metadata else ""
    phase = (pod.status.phase if pod.status else None) or "Unknown"
    detail = f"{name} is {phase}"
    stuck = not_running(pod, host_root)
    if stuck is not None:
        hint = stuck.hint or f"kubectl -n {ours.namespace} describe pod {name}"
        return Check("pod on this node", False, f"{detail}: {stuck.detail}", hint)
    if phase != "Running":
        return Check("pod on this node", False, detail, f"kubectl -n {ours.namespace} describe pod {name}")
    return Check("pod on this node", True, detail)


def _judged_first(pod: Pod) -> tuple[bool, str]:
    meta = pod.metadata
    made = meta.creationTimestamp.isoformat() if meta and meta.creationTimestamp else ""
    return (meta is None or meta.deletionTimestamp is None, made)
