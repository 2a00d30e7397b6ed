"""The node's pods as ``--volcano`` reads them: listed page by page and decoded on a worker thread (only
this node's pods are decoded whole; a pod that does not decode is left out with one line), and the watch's
pods turned into :class:`~ascend_agent.cluster.volcano_marks.PodView`::

    pods = await node_pods(api)                # the node's pods that have not ended
    pods, version, unreadable = await list_node_pods(api)
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple

import msgspec
from lightkube import ALL_NS, Client
from lightkube.core.resource import NamespacedResourceG
from lightkube.models.core_v1 import PodSpec, PodStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.volcano_marks import PodView
from ascend_agent.echo import cut

log = logging.getLogger("ascend_agent.cluster")

# Pods per page of a list.
LIST_CHUNK = 500
# The most of the node's pods kept (that have not ended): a node runs a few hundred at most (the kubelet's
# default --max-pods is 110). Past it a pod is not kept: an API server that sends more is broken or hostile.
MAX_PODS = 1000


async def node_pods(api: KubeApi) -> list[PodView]:
    """The pods bound to the agent's node, read once."""
    listed = await list_node_pods(api)
    for pod, problem in listed.unreadable.items():
        log.warning("Pod %s is ignored: %s", pod, problem)
    return listed.pods


class Listed(NamedTuple):
    pods: list[PodView]  # bound to the node, not ended; at most MAX_PODS
    version: str | None  # the list's resourceVersion
    unreadable: dict[str, str]  # namespace/name -> why the pod could not be decoded (at most MAX_PODS)
    past: int = 0  # pods of the node left out past MAX_PODS


async def list_node_pods(api: KubeApi, limited: bool = True) -> Listed:
    """The pods bound to the agent's node that have not ended, the list's resourceVersion, and the pods that
    could not be decoded (left out: one pod's data never makes the list fail). Read and
    decoded in a worker thread, a page of :data:`LIST_CHUNK` pods at a time: an answer of many pods (an API
    server that ignores the field selector sends every pod of the cluster) does not hold up Allocate. At most
    :data:`MAX_PODS` pods are kept; ``past`` counts those left out. ``limited=False`` for a list Allocate
    waits on: it never waits for the client's rate limit."""
    return await api.call_blocking(
        "list", "pods", functools.partial(_list_in_thread, api.node), limited=limited
    )


class _ListedPod(NamespacedResourceG, msgspec.Struct, kw_only=True):
    """A pod of a list, its parts kept as the JSON they came as: the list is split into pods in one quick
    pass (an API server that ignores the field selector sends every pod of the cluster: 37 MB for 100,000,
    which decoded whole held the interpreter for about a second), and only this node's pods are decoded,
    one at a time."""

    _api_info = Pod._api_info
    metadata: msgspec.Raw = msgspec.Raw(b"null")
    spec: msgspec.Raw = msgspec.Raw(b"null")
    status: msgspec.Raw = msgspec.Raw(b"null")


class _Node(msgspec.Struct):
    nodeName: str | None = None


def _pod_on(node: str, listed: _ListedPod) -> Pod | None:
    """The listed pod, decoded, when it is bound to ``node``."""
    if msgspec.json.decode(listed.spec, type=_Node | None) != _Node(node):
        return None
    return Pod(
        metadata=msgspec.json.decode(listed.metadata, type=ObjectMeta | None),
        spec=msgspec.json.decode(listed.spec, type=PodSpec),
        status=msgspec.json.decode(listed.status, type=PodStatus | None),
    )


def _list_in_thread(node: str, client: Client) -> Listed:
    listing = client.list(_ListedPod, namespace=ALL_NS, fields={"spec.nodeName": node}, chunk_size=LIST_CHUNK)
    found: list[PodView] = []
    unreadable: dict[str, str] = {}
    past = 0
    for listed in listing:
        try:
            pod = _pod_on(node, listed)
        except msgspec.DecodeError as exc:  # the pod's own data (ValidationError is one too)
            if len(unreadable) < MAX_PODS:
                unreadable[_name_of(listed)] = cut(f"{type(exc).__name__}: {exc}", 200)
            continue
        if pod is None:
            continue
        if len(found) >= MAX_PODS:
            past += 1
        elif (view := view_of(pod)) is not None and not view.ended:
            found.append(view)
    try:
        version: str | None = listing.resourceVersion
    except Exception:  # an answer without one: the watch starts from now
        version = None
    return Listed(found, version, unreadable, past)


class _Name(msgspec.Struct):
    namespace: str = ""
    name: str = ""


def _name_of(listed: _ListedPod) -> str:
    """``namespace/name`` of a listed pod, as far as its metadata can be read."""
    try:
        meta = msgspec.json.decode(listed.metadata, type=_Name)
    except msgspec.DecodeError:
        return "without readable metadata"
    return f"{cut(meta.namespace)}/{cut(meta.name)}"


def view_of(pod: Pod) -> PodView | None:
    """What the choice needs of ``pod``; None, with one line, for a pod that cannot be read."""
    try:
        return PodView.of(pod)
    except Exception as exc:  # the pod's own data: never an error of Allocate
        meta = pod.metadata
        name = "without metadata" if meta is None else f"{cut(meta.namespace or '')}/{cut(meta.name or '')}"
        log.warning("Pod %s is ignored: %s: %s", name, type(exc).__name__, cut(str(exc), 200))
        return None


def bound_to(node: str, pod: Pod) -> bool:
    """Bound to this node (an API server that ignores the field selector lists every pod)."""
    return pod.spec is not None and pod.spec.nodeName == node
