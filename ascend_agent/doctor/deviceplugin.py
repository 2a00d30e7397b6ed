"""The doctor's checks of the device plugins (``kubeletApi: deviceplugin``): ``kubelet.sock``, each
resource's plugin socket asked as the kubelet asks it (ListAndWatch), the pods on Unhealthy chips, and the
node's ``huawei.com/*`` capacity::

    MODE.kubelet(settings, inventory, daemonset)   # (checks in the kubelet's place, checks after the chips')
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import TYPE_CHECKING, cast

from grpclib.exceptions import GRPCError, StreamTerminatedError

from ascend_agent import naming
from ascend_agent._proto.v1beta1 import DevicePluginStub, ListAndWatchResponse
from ascend_agent.config import Settings
from ascend_agent.doctor.check import DAEMONSET, AgentDaemonSet, Check, Mode
from ascend_agent.doctor.check import DIAL_TIMEOUT as _DIAL_TIMEOUT
from ascend_agent.doctor.holders import holders_check
from ascend_agent.kubelet.deviceplugin.kubelet import KUBELET_SOCKET
from ascend_agent.kubelet.deviceplugin.transport import LocalChannel
from ascend_agent.model import Generation, Inventory

if TYPE_CHECKING:
    from ascend_agent.cluster.client import KubeApi


_AS_ROOT = "run the doctor as root, as the agent runs: it reads the kubelet's directories and opens the chips"


def _is_socket(path: Path) -> bool | OSError:
    """Whether ``path`` is a socket; the error when it cannot be looked at (a directory only root reads)."""
    try:
        return path.is_socket()
    except OSError as exc:
        return exc


def _kubelet(kubelet_dir: Path) -> Check:
    path = kubelet_dir / KUBELET_SOCKET
    found = _is_socket(path)
    if isinstance(found, OSError):
        return Check("kubelet socket", False, f"cannot look at {path}: {found.strerror or found}", _AS_ROOT)
    if found:
        return Check("kubelet socket", True, f"{path}")
    return Check(
        "kubelet socket",
        False,
        f"{path} does not exist",
        "is the kubelet running on this node, and is its device-plugins directory mounted into the agent?",
    )


def _expected_sockets(settings: Settings, inventory: Inventory | None) -> list[str]:
    """The socket names of the resources this configuration serves: those of the chips found; else (no
    chips, or npu-smi failing) every name Huawei's naming can give, and under ``model`` naming the sockets of
    that shape that are there."""
    advertised = (
        inventory.by_advertised_resource(settings.replicas, settings.rename_shared)
        if inventory is not None
        else {}
    )
    names = {naming.socket_name(resource) for resource in advertised}
    if not names:
        names = {naming.socket_name(naming.resource_name(generation.family)) for generation in Generation}
        if settings.resource_naming == "model":
            names.update(path.name for path in settings.endpoint_dir.glob("Ascend*.sock"))
    return sorted(names)


async def _our_sockets(
    settings: Settings,
    inventory: Inventory | None,
    unhealthy: list[tuple[str, str]],
    daemonset: AgentDaemonSet,
) -> list[Check]:
    """One check per plugin socket; the (resource, device ID) of each Unhealthy device go to ``unhealthy``."""
    directory = settings.endpoint_dir
    try:
        names = _expected_sockets(settings, inventory)
        found = [directory / name for name in names if (directory / name).is_socket()]
    except OSError as exc:
        return [Check("plugin socket", False, f"cannot look in {directory}: {exc.strerror or exc}", _AS_ROOT)]
    if not found:
        return [
            Check(
                "plugin socket",
                False,
                f"no {', '.join(names)} in {directory}",
                "is the agent running? "
                f"kubectl -n {daemonset.namespace} get pods -l app.kubernetes.io/name=ascend-agent, "
                f"then kubectl -n {daemonset.namespace} logs <pod>",
            )
        ]
    return [await _ask(path, unhealthy) for path in found]


async def _ask(path: Path, unhealthy: list[tuple[str, str]]) -> Check:
    """What the kubelet sees: the first ListAndWatch message from the socket."""
    channel = LocalChannel(path)
    # The generated stub is typed as an iterator; it is an async generator, closed to end the stream.
    updates = cast(AsyncGenerator[ListAndWatchResponse, None], DevicePluginStub(channel).list_and_watch())
    try:
        async with asyncio.timeout(_DIAL_TIMEOUT):
            first: ListAndWatchResponse | None = await anext(updates, None)
    except (TimeoutError, OSError, GRPCError, StreamTerminatedError) as exc:
        return Check(
            f"plugin socket {path.name}",
            False,
            f"{path} does not answer: {exc or type(exc).__name__}",
            "the agent is stuck or gone: check its logs, then restart its pod",
        )
    finally:
        with contextlib.suppress(Exception):
            await updates.aclose()
        channel.close()
    devices = first.devices if first is not None else []
    healthy = sum(device.health == "Healthy" for device in devices)
    resource = naming.resource_name(path.name.removesuffix(".sock"))
    unhealthy.extend((resource, device.id) for device in devices if device.health != "Healthy")
    return Check(
        f"plugin socket {path.name}",
        True,
        f"answers: {len(devices)} devices, {healthy} Healthy, {len(devices) - healthy} Unhealthy",
    )


async def _kubelet_checks(
    settings: Settings, inventory: Inventory | None, daemonset: AgentDaemonSet
) -> tuple[list[Check], list[Check]]:
    unhealthy: list[tuple[str, str]] = []
    checks = [_kubelet(settings.kubelet_dir), *await _our_sockets(settings, inventory, unhealthy, daemonset)]
    return checks, [await holders_check(settings, unhealthy)] if unhealthy else []


async def _capacity_checks(api: KubeApi, settings: Settings, inventory: Inventory | None) -> list[Check]:
    return [await _node_capacity(api, api.node)]


async def _node_capacity(api: KubeApi, node: str) -> Check:
    from lightkube.resources.core_v1 import Node

    status = (await api.call("get", "nodes", api.client.get(Node, node), answers=frozenset())).status
    capacity = {
        k: v for k, v in ((status.capacity if status else None) or {}).items() if k.startswith("huawei.com/")
    }
    allocatable = (status.allocatable if status else None) or {}
    if not capacity:
        return Check(
            "node capacity",
            False,
            f"node {node} has no huawei.com/* capacity",
            "the agent has not registered with this node's kubelet: see its log and /readyz",
        )
    parts = [
        f"{name} capacity {value}, allocatable {allocatable.get(name, '0')}"
        for name, value in capacity.items()
    ]
    if all(str(allocatable.get(name, "0")) == "0" for name in capacity):
        return Check(
            "node capacity", False, "; ".join(parts), "every chip is Unhealthy: see the checks above"
        )
    return Check("node capacity", True, "; ".join(parts))


MODE = Mode(
    daemonset=DAEMONSET,
    kubelet=_kubelet_checks,
    capacity=_capacity_checks,
    look=lambda node: f"kubectl describe node {node} | grep huawei.com",
)
