"""``ascend-agent doctor``: the node-local checks behind "my NPU pod stays Pending", in reading order.

Each check says ok or failed, what it saw, and when failed the next step::

    checks = await run_checks(settings)
    print(render(checks))
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
from collections.abc import AsyncGenerator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from grpclib.exceptions import GRPCError, StreamTerminatedError

from ascend_agent import naming
from ascend_agent._proto.v1beta1 import DevicePluginStub, ListAndWatchResponse
from ascend_agent.backends.npusmi import NpuSmiError, physical_ids, query_info
from ascend_agent.config import ConfigError, Settings
from ascend_agent.deviceplugin.kubelet import KUBELET_SOCKET
from ascend_agent.deviceplugin.transport import LocalChannel
from ascend_agent.model import Generation

_DIAL_TIMEOUT = 3.0
_API_TIMEOUT = 10.0
DAEMONSET = "ascend-device-plugin-daemonset"
NAMESPACE = "kube-system"
_CHIP_NODE = re.compile(r"^davinci(\d+)$")


@dataclass(frozen=True, slots=True)
class Check:
    check: str
    ok: bool | None  # None: skipped
    detail: str
    hint: str = ""


async def run_checks(settings: Settings) -> list[Check]:
    """Every check, in the order a person should read them."""
    dev_root = settings.effective_dev_root
    nodes = _chip_nodes(dev_root)
    checks = [_device_files(dev_root, nodes), _driver(settings)]
    chips, npu_smi = await _npu_smi(settings)
    checks.append(npu_smi)
    checks.append(_match(nodes, chips, dev_root))
    checks.append(_kubelet(settings.kubelet_dir))
    # npu-smi already failed on devfs: asking the backend would run it (and wait out its timeout) again.
    discover = settings.backend != "devfs" or npu_smi.ok is True
    checks.extend(await _our_sockets(settings, discover))
    checks.append(await _readiness(settings.metrics_address))
    checks.extend(await _cluster(os.environ.get("NODE_NAME") or socket.gethostname()))
    return checks


def _chip_nodes(dev_root: Path) -> set[int]:
    try:
        return {int(m.group(1)) for m in map(_CHIP_NODE.match, os.listdir(dev_root)) if m}
    except OSError:
        return set()


def _device_files(dev_root: Path, nodes: set[int]) -> Check:
    if nodes:
        manager = (dev_root / "davinci_manager").exists() or (dev_root / "davinci_manager_docker").exists()
        listed = ", ".join(f"davinci{n}" for n in sorted(nodes))
        if not manager:
            return Check(
                "device files",
                False,
                f"{listed} under {dev_root}, but no davinci_manager",
                "the driver is only partly loaded: reload the Ascend driver (or reboot) and check dmesg",
            )
        return Check("device files", True, f"{listed} and davinci_manager under {dev_root}")
    return Check(
        "device files",
        False,
        f"no /dev/davinci* under {dev_root}",
        "install or repair the Ascend driver and firmware on this node (nothing in Kubernetes can create "
        "these files), then run npu-smi info on the host",
    )


def _driver(settings: Settings) -> Check:
    path = settings.host_root / "usr/local/Ascend/driver/version.info"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return Check(
            "driver installed",
            False,
            f"{path} not found",
            "install the Ascend driver package (npu-driver) for this node's chips",
        )
    version = next(
        (line.split("=", 1)[1].strip() for line in text.splitlines() if line.startswith("Version=")), ""
    )
    return Check("driver installed", True, f"version {version or 'unknown'} ({path})")


async def _npu_smi(settings: Settings) -> tuple[list[int], Check]:
    executable = settings.effective_npu_smi
    try:
        table = await query_info(executable, settings.npu_smi_timeout)
    except NpuSmiError as exc:
        return [], Check(
            "npu-smi reports chips",
            False,
            exc.cause,
            exc.next_step
            or "check that npu-smi runs on the host (it needs the driver's libraries) or pass --npu-smi",
        )
    ids = list(physical_ids(table.chips))
    health = {row.health for row in table.chips}
    names = ", ".join(sorted({row.name for row in table.chips}))
    detail = f"{len(ids)} chips ({names}), health {', '.join(sorted(health))}"
    return ids, Check("npu-smi reports chips", True, detail)


def _match(nodes: set[int], chips: Sequence[int], dev_root: Path) -> Check:
    if not chips:
        return Check("chips match device files", None, "skipped: npu-smi reported no chips")
    missing = sorted(set(chips) - nodes)
    unknown = sorted(nodes - set(chips))
    if missing:
        return Check(
            "chips match device files",
            False,
            f"npu-smi reports chips {missing} without {dev_root}/davinci<N>",
            "those chips are Unhealthy: check dmesg for the device, reload the driver, "
            "or mount /dev into the agent",
        )
    detail = f"{len(chips)} chips, each with its device file"
    if unknown:
        detail += f"; device files npu-smi does not report: {unknown}"
    return Check("chips match device files", True, detail)


def _kubelet(kubelet_dir: Path) -> Check:
    path = kubelet_dir / KUBELET_SOCKET
    if path.is_socket():
        return Check("kubelet socket", True, f"{path}")
    return Check(
        "kubelet socket",
        False,
        f"{path} does not exist",
        "is the kubelet running on this node, and is its device-plugins directory mounted into the agent?",
    )


async def _expected_sockets(settings: Settings, discover: bool) -> list[str]:
    """The socket names of the resources this configuration serves: those of the chips found; else (no
    chips, or npu-smi failing) every name Huawei's naming can give, and under ``model`` naming the sockets of
    that shape that are there."""
    from ascend_agent.agent import discover_once

    resources: set[str] = set()
    if discover:
        with contextlib.suppress(ConfigError):
            resources = set((await discover_once(settings)).by_resource())
    names = {naming.socket_name(resource) for resource in resources}
    if not names:
        names = {naming.socket_name(naming.resource_name(generation.family)) for generation in Generation}
        if settings.resource_naming == "model":
            names.update(path.name for path in settings.endpoint_dir.glob("Ascend*.sock"))
    return sorted(names)


async def _our_sockets(settings: Settings, discover: bool) -> list[Check]:
    directory = settings.endpoint_dir
    names = await _expected_sockets(settings, discover)
    found = [directory / name for name in names if (directory / name).is_socket()]
    if not found:
        return [
            Check(
                "plugin socket",
                False,
                f"no {', '.join(names)} in {directory}",
                "is the agent running? "
                "kubectl -n kube-system get pods -l app.kubernetes.io/name=ascend-agent, "
                "then kubectl -n kube-system logs <pod>",
            )
        ]
    return [await _ask(path) for path in found]


async def _ask(path: Path) -> Check:
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
    return Check(
        f"plugin socket {path.name}",
        True,
        f"answers: {len(devices)} devices, {healthy} Healthy, {len(devices) - healthy} Unhealthy",
    )


async def _readiness(address: str) -> Check:
    if not address:
        return Check("agent readiness", None, "skipped: --metrics-address is empty")
    host, _, port = address.rpartition(":")
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host.strip("[]")
    try:
        async with asyncio.timeout(_DIAL_TIMEOUT):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /readyz HTTP/1.0\r\n\r\n")
            answer = (await reader.read()).decode("latin-1")
            writer.close()
    except (OSError, TimeoutError) as exc:
        return Check(
            "agent readiness",
            False,
            f"nothing answers on {address}: {exc.strerror if isinstance(exc, OSError) else 'timeout'}",
            "is the agent running with this --metrics-address?",
        )
    status, _, body = answer.partition("\r\n\r\n")
    if " 200 " in status.split("\r\n")[0] + " ":
        return Check("agent readiness", True, f"{address}/readyz: ready")
    return Check("agent readiness", False, f"{address}/readyz: {body.strip()}", "see the agent's log for why")


async def _cluster(node: str) -> list[Check]:
    """The DaemonSet, its pod on this node, and the node's NPU capacity, when a Kubernetes API answers."""
    try:
        from kubernetes_asyncio import client, config
    except ImportError:
        return [
            Check(
                "cluster",
                None,
                "skipped: kubernetes-asyncio is not installed (pip install 'ascend-agent[cluster]')",
                f"kubectl -n {NAMESPACE} get ds {DAEMONSET}; kubectl describe node {node} | grep huawei.com",
            )
        ]
    try:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            await config.load_kube_config()
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        return [Check("cluster", None, f"skipped: no Kubernetes API configured ({exc})")]
    try:
        async with asyncio.timeout(_API_TIMEOUT), client.ApiClient() as api:
            return [
                await _daemonset(client.AppsV1Api(api)),
                await _node_pod(client.CoreV1Api(api), node),
                await _capacity(client.CoreV1Api(api), node),
            ]
    except (TimeoutError, OSError, client.ApiException) as exc:
        reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
        return [
            Check("cluster", False, f"the Kubernetes API did not answer: {reason}", "check the kubeconfig")
        ]


async def _daemonset(apps: Any) -> Check:
    from kubernetes_asyncio.client import ApiException

    try:
        daemonset = await apps.read_namespaced_daemon_set(DAEMONSET, NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return Check(
                "daemonset",
                False,
                f"no DaemonSet {DAEMONSET} in {NAMESPACE}",
                "kubectl apply -f examples/daemonset.yaml",
            )
        raise
    status = daemonset.status
    ready, desired = status.number_ready or 0, status.desired_number_scheduled or 0
    detail = f"{DAEMONSET}: {ready} of {desired} pods ready"
    if desired == 0:
        return Check("daemonset", False, detail, "no node matches its nodeSelector: label the NPU nodes")
    if ready < desired:
        return Check(
            "daemonset", False, detail, f"kubectl -n {NAMESPACE} get pods -o wide | grep {DAEMONSET}"
        )
    return Check("daemonset", True, detail)


async def _node_pod(core: Any, node: str) -> Check:
    pods = await core.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}")
    ours = [pod for pod in pods.items if (pod.metadata.name or "").startswith(f"{DAEMONSET}-")]
    if not ours:
        return Check(
            "pod on this node",
            False,
            f"no {DAEMONSET} pod on node {node}",
            f"kubectl -n {NAMESPACE} describe ds {DAEMONSET}: check nodeSelector, tolerations and events",
        )
    pod = ours[0]
    phase = pod.status.phase if pod.status else "Unknown"
    detail = f"{pod.metadata.name} is {phase}"
    if phase != "Running":
        return Check(
            "pod on this node", False, detail, f"kubectl -n {NAMESPACE} describe pod {pod.metadata.name}"
        )
    return Check("pod on this node", True, detail)


async def _capacity(core: Any, node: str) -> Check:
    status = (await core.read_node(node)).status
    capacity = {k: v for k, v in (status.capacity or {}).items() if k.startswith("huawei.com/")}
    allocatable = status.allocatable or {}
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


def render(checks: Sequence[Check]) -> str:
    """Human-readable lines: ``[ok]``, ``[FAILED]`` or ``[skipped]``, what was seen, and the next step."""
    lines = []
    for check in checks:
        mark = {True: "ok", False: "FAILED", None: "skipped"}[check.ok]
        lines.append(f"[{mark:>7}] {check.check}: {check.detail}")
        if check.ok is False and check.hint:
            lines.append(f"          next: {check.hint}")
    return "\n".join(lines)


def as_json(checks: Sequence[Check]) -> str:
    return json.dumps([asdict(check) for check in checks], indent=2)
