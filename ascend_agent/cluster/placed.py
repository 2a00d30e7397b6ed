"""One pod read from the API server as a rank table needs it
(:class:`~ascend_agent.cluster.ranktable.PlacedPod`), and the agent's Node's address (the ``host_ip`` of the
pods' configuration annotation).

    pod = await read_placed_pod(api, "team-a", "job-worker-0")   # None when there is no such pod
    address = await node_address(api)                            # "" when the Node names none

The pod is read with a list by name (RBAC: pods list, as ``--volcano`` has), the Node with a get (nodes get).
"""

from __future__ import annotations

import functools
import ipaddress

from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.ranktable import PlacedPod


async def read_placed_pod(api: KubeApi, namespace: str, name: str) -> PlacedPod | None:
    """The pod ``namespace/name``, or None when there is none."""
    return await api.call_blocking("list", "pods", functools.partial(_read_in_thread, namespace, name))


def _read_in_thread(namespace: str, name: str, client: Client) -> PlacedPod | None:
    listing = client.list(Pod, namespace=namespace, fields={"metadata.name": name})
    for pod in listing:  # a server that ignores the field selector lists the whole namespace
        meta = pod.metadata
        if meta is None or meta.name != name:
            continue
        return PlacedPod(
            namespace=namespace,
            name=name,
            node=(pod.spec.nodeName if pod.spec else None) or "",
            pod_ip=(pod.status.podIP if pod.status else None) or "",
            annotations=dict(meta.annotations or {}),
            node_selector=dict((pod.spec.nodeSelector if pod.spec else None) or {}),
            uid=meta.uid or "",
            host_ip=(pod.status.hostIP if pod.status else None) or "",
        )
    return None


async def node_address(api: KubeApi, limited: bool = True) -> str:
    """The agent's Node's first ``InternalIP`` that is an IP address, as Huawei's plugin takes it; "" when it
    has none. A Node that is not there is lightkube's ``ApiError`` (404). ``limited=False``: not behind the
    client's rate limit."""
    # In a worker thread, as the pods' patches it is read for: a Node's status can be large.
    node = await api.call_blocking("get", "nodes", functools.partial(_get_node, api.node), limited=limited)
    for address in (node.status.addresses if node.status else None) or []:
        if address.type == "InternalIP" and _is_ip(address.address):
            return address.address
    return ""


def _get_node(name: str, client: Client) -> Node:
    return client.get(Node, name)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
