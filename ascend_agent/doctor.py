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
from collections.abc import AsyncGenerator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from grpclib.exceptions import GRPCError, StreamTerminatedError

from ascend_agent import naming
from ascend_agent._proto.v1beta1 import DevicePluginStub, ListAndWatchResponse
from ascend_agent.backends import discover_once
from ascend_agent.backends.npusmi import NpuSmiError, physical_ids, query_info
from ascend_agent.backends.training import trains
from ascend_agent.chipstate import NoAnswer, ask_agent, http_get
from ascend_agent.config import DRA_API, ConfigError, Settings
from ascend_agent.deviceplugin.kubelet import KUBELET_SOCKET
from ascend_agent.deviceplugin.transport import LocalChannel
from ascend_agent.model import Generation, Inventory

if TYPE_CHECKING:
    from ascend_agent.cluster.client import KubeApi

_DIAL_TIMEOUT = 3.0
_API_TIMEOUT = 10.0
DAEMONSET = naming.DAEMONSET_NAME
NAMESPACE = naming.DAEMONSET_NAMESPACE
_CHIP_NODE = re.compile(r"^davinci(\d+)$")


@dataclass(frozen=True, slots=True)
class AgentDaemonSet:
    """Which DaemonSet runs the agent (``doctor --daemonset-name/--daemonset-namespace``); an empty name: the
    one of the example manifest for the mode (``ascend-dra-driver`` for a DRA driver)."""

    name: str = ""
    namespace: str = NAMESPACE


@dataclass(frozen=True, slots=True)
class Check:
    check: str
    ok: bool | None  # None: skipped
    detail: str
    hint: str = ""


async def run_checks(settings: Settings, daemonset: AgentDaemonSet | None = None) -> list[Check]:
    """Every check, in the order a person should read them."""
    daemonset = daemonset or AgentDaemonSet()
    dra = settings.kubelet_api == DRA_API
    if not daemonset.name:
        daemonset = replace(daemonset, name=naming.DRA_DAEMONSET_NAME if dra else DAEMONSET)
    dev_root = settings.effective_dev_root
    nodes = _chip_nodes(dev_root)
    checks = [_device_files(dev_root, nodes), _driver(settings)]
    chips, npu_smi = await _npu_smi(settings)
    checks.append(npu_smi)
    checks.append(_match(nodes, chips, dev_root))
    # npu-smi already failed on devfs: asking the backend would run it (and wait out its timeout) again.
    inventory = await _discover(settings) if settings.backend != "devfs" or npu_smi.ok is True else None
    if settings.backend == "devfs":
        checks.append(_advertised(nodes, inventory))
    unhealthy: list[tuple[str, str]] = []
    if dra:
        from ascend_agent.dra.doctor import failing_devices, kubelet_checks, skipped_device_plugin_checks

        checks.extend(skipped_device_plugin_checks())
        checks.extend(await kubelet_checks(settings, inventory))
        unhealthy.extend(failing_devices(settings.dra_driver_name, inventory))
    else:
        checks.append(_kubelet(settings.kubelet_dir))
        checks.extend(await _our_sockets(settings, inventory, unhealthy, daemonset))
    if inventory is not None and inventory.vnpus:
        checks.append(_vnpus(inventory))
    # The fake backend's chips have addresses only with fakeTraining.
    if inventory is not None and (settings.backend == "devfs" or settings.fake_training):
        checks.extend(_device_ips(inventory))
    if unhealthy:
        checks.append(await _holders(settings, unhealthy))
    checks.append(await _readiness(settings.metrics_address))
    checks.extend(await _agent_chips(settings.metrics_address))
    checks.append(await _kubernetes_api(settings.metrics_address))
    checks.extend(await _cluster(settings, daemonset, inventory if dra else None))
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


_AS_ROOT = "run the doctor as root, as the agent runs: it reads the kubelet's directories and opens the chips"


def _is_socket(path: Path) -> bool | OSError:
    """Whether ``path`` is a socket; the error when it cannot be looked at (a directory only root reads)."""
    try:
        return path.is_socket()
    except OSError as exc:
        return exc


async def _discover(settings: Settings) -> Inventory | None:
    """What the agent with these settings would find; None when the settings do not make a backend."""
    try:
        return await discover_once(settings)
    except ConfigError:
        return None


def _advertised(nodes: set[int], inventory: Inventory | None) -> Check:
    """Every device file should become an advertised chip: a name npu-smi redacts (``xxx``) or a row it
    leaves out keeps a chip from the kubelet although the files and npu-smi look fine."""
    name = "chips advertised"
    if inventory is None:
        return Check(name, None, "skipped: the backend could not be asked")
    advertised = {chip.phys_id for chip in inventory.chips}
    left = sorted(nodes - advertised)
    if left:
        files = ", ".join(f"davinci{n}" for n in left)
        why = "; ".join(inventory.problems)
        return Check(
            name,
            False,
            f"{len(left)} of {len(nodes)} device files would not be advertised ({files})"
            + (f": {why}" if why else ": npu-smi does not list them"),
            "run npu-smi info on the host: every chip must be listed; where npu-smi hides chip names, "
            "set model: in the config file",
        )
    healthy = sum(chip.healthy for chip in inventory.chips)
    return Check(name, True, f"{len(advertised)} chips would be advertised, {healthy} of them Healthy")


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


def _vnpus(inventory: Inventory) -> Check:
    """Why a chip resource shows fewer devices than the node has chips: chips split into vNPUs.

    >>> from ascend_agent.model import Chip, VNpu
    >>> chips = tuple(Chip.make(i, "310P3") for i in range(8))
    >>> _vnpus(Inventory(chips=chips, vnpus=(chips[0].slice(VNpu(100, "vir02")),))).detail
    'chip 0 is split into vNPUs, so huawei.com/Ascend310P shows 7, not 8; huawei.com/Ascend310P-2c: 1'
    """
    split = {part.phys_id for part in inventory.vnpus}
    parts = []
    for resource in sorted({chip.resource for chip in inventory.chips}):
        chips = [chip for chip in inventory.chips if chip.resource == resource]
        ids = sorted(chip.phys_id for chip in chips if chip.phys_id in split)
        if ids:
            which = f"chip {ids[0]} is" if len(ids) == 1 else f"chips {', '.join(map(str, ids))} are"
            parts.append(
                f"{which} split into vNPUs, so {resource} shows {len(chips) - len(ids)}, not {len(chips)}"
            )
    counts: dict[str, int] = {}
    for part in inventory.vnpus:
        counts[part.resource] = counts.get(part.resource, 0) + 1
    parts += [f"{resource}: {count}" for resource, count in sorted(counts.items())]
    return Check("vNPUs", True, "; ".join(parts))


def _device_ips(inventory: Inventory) -> list[Check]:
    """On a node whose model trains, every chip needs a device IP for the rank table of a distributed job:
    failed when some chips have one and others not; when none has one (an inference node, or hccn_tool
    missing) it says so without failing, since no pod waits for it.

    >>> from ascend_agent.model import Chip
    >>> chips = (Chip.make(0, "910B3", device_ip="10.10.0.10"), Chip.make(1, "910B3"))
    >>> print(_device_ips(Inventory(chips))[0].detail)
    1 of 2 chips have no device IP: Ascend910-1
    """
    chips = [chip for chip in inventory.chips if trains(chip.generation)]
    if not chips:
        return []
    name = "device IPs"
    lacking = [chip for chip in chips if chip.device_ip is None]
    if len(lacking) == len(chips):
        return [
            Check(
                name,
                None,
                f"no chip has a device IP ({', '.join(chip.device_id for chip in lacking)}): fine for "
                "inference; distributed training needs them: look with hccn_tool -i "
                f"{lacking[0].phys_id} -ip -g on the host (or pass --hccn-tool where the agent cannot find "
                "it)",
            )
        ]
    if lacking:
        return [
            Check(
                name,
                False,
                f"{len(lacking)} of {len(chips)} chips have no device IP: "
                + ", ".join(chip.device_id for chip in lacking),
                "a distributed training job cannot build its rank table on these chips: look with "
                f"hccn_tool -i {lacking[0].phys_id} -ip -g on the host and set the address with hccn_tool "
                "-ip -s (or pass --hccn-tool where the agent cannot find it)",
            )
        ]
    shown = ", ".join(f"{chip.device_id} {chip.device_ip}" for chip in chips)
    return [Check(name, True, f"every chip has one: {shown}")]


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


async def _holders(settings: Settings, unhealthy: list[tuple[str, str]]) -> Check:
    """The pods whose containers hold the Unhealthy devices: the ones to move off this node."""
    from ascend_agent.podresources import PodResourcesError, list_holders

    name = "pods on Unhealthy chips"
    try:
        holders = await list_holders(settings.pod_resources_socket)
    except PodResourcesError as exc:
        return Check(name, None, f"skipped: {exc}")
    if settings.volcano:
        from ascend_agent.cluster import on_mounted_chips

        holders, problem = await on_mounted_chips(settings, holders, _API_TIMEOUT)
        if problem:
            return Check(name, None, f"skipped: {problem}")
    # As a DRA driver, (driver, device name) of the claims' devices; else (resource, device ID).
    by = holders.by_claimed if settings.kubelet_api == DRA_API else holders.by_device
    held = [
        f"{device} held by {', '.join(map(str, by[(resource, device)]))}"
        for resource, device in unhealthy
        if by.get((resource, device))
    ]
    if not held:
        return Check(name, True, f"none: no pod holds {', '.join(device for _, device in unhealthy)}")
    return Check(
        name,
        False,
        "; ".join(held),
        "these pods run on failing chips: delete them (their controllers place them again on Healthy chips)",
    )


async def _get(address: str, path: str) -> tuple[str, str] | str:
    """(status line, body) of ``GET path`` on the agent's HTTP address; a string saying why not."""
    try:
        status, body = await http_get(address, path, _DIAL_TIMEOUT)
    except NoAnswer as exc:
        return f"nothing answers on {address}: {exc}"
    return status, body.decode("latin-1")


async def _agent_chips(address: str) -> list[Check]:
    """What only the running agent knows: chips it holds Unhealthy for flapping, and npu-smi down."""
    held_name, down_name = "held chips (agent)", "npu-smi (agent)"
    view = await ask_agent(address)
    if isinstance(view, str):
        return [Check(held_name, None, f"unknown: {view}"), Check(down_name, None, f"unknown: {view}")]
    held = view.held()
    checks = [
        Check(
            held_name,
            False,
            "; ".join(f"{device} {state.hold_text()}" for device, state in sorted(held.items())),
            "they come back by themselves once Healthy for flapQuiet s; the agent's log says why they "
            "flapped (is held Unhealthy)",
        )
        if held
        else Check(held_name, True, "none")
    ]
    if view.npu_smi_down:
        checks.append(
            Check(
                down_name,
                False,
                view.npu_smi_down,
                "run npu-smi info on the host; the chips come back by themselves once it answers",
            )
        )
    else:
        checks.append(Check(down_name, True, "answers"))
    return checks


async def _kubernetes_api(address: str) -> Check:
    """The agent's own view of the API server (the /healthz detail): what its cluster side writes through."""
    name = "kubernetes api (agent)"
    if not address:
        return Check(name, None, "skipped: --metrics-address is empty")
    answer = await _get(address, "/healthz")
    if isinstance(answer, str):
        return Check(name, None, f"skipped: {answer}")
    detail = next((line for line in answer[1].splitlines() if line.startswith("kubernetes api: ")), "")
    if not detail:
        return Check(name, None, "skipped: the agent's cluster side is off (--no-cluster, or no credentials)")
    state = detail.removeprefix("kubernetes api: ")
    if state.endswith(": up"):
        return Check(name, True, state)
    if state == "starting" or state.endswith(": no request yet"):
        return Check(name, None, state)
    return Check(
        name,
        False,
        state,
        "node labels and Events wait (the device plugin works without them): for 403, grant the verb in the "
        "agent's ClusterRole; else check the API server and the agent's network",
    )


async def _readiness(address: str) -> Check:
    if not address:
        return Check("agent readiness", None, "skipped: --metrics-address is empty")
    answer = await _get(address, "/readyz")
    if isinstance(answer, str):
        return Check("agent readiness", False, answer, "is the agent running with this --metrics-address?")
    status, body = answer
    if " 200 " in status + " ":
        return Check("agent readiness", True, f"{address}/readyz: ready")
    return Check("agent readiness", False, f"{address}/readyz: {body.strip()}", "see the agent's log for why")


async def _cluster(settings: Settings, ours: AgentDaemonSet, dra_inventory: Inventory | None) -> list[Check]:
    """The DaemonSet, its pod on this node, and the node's NPU capacity (in DRA mode its ResourceSlices
    instead), when a Kubernetes API answers (the agent's own credentials and client: ``--kubeconfig``, the
    service account, ``KUBECONFIG``)."""
    from ascend_agent.cluster import find_target, node_name

    dra = settings.kubelet_api == DRA_API
    node = node_name(settings.node_name)
    target = find_target(str(settings.kubeconfig) if settings.kubeconfig else None)
    if target is None:
        look = (
            f"kubectl get resourceslices --field-selector spec.nodeName={node}"
            if dra
            else f"kubectl describe node {node} | grep huawei.com"
        )
        return [
            Check(
                "cluster",
                None,
                "skipped: no Kubernetes API configured (no service account, --kubeconfig or KUBECONFIG)",
                f"kubectl -n {ours.namespace} get ds {ours.name}; {look}",
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
        checks = [await _daemonset(api, ours, dra), await _node_pod(api, node, ours)]
        if dra:
            from ascend_agent.dra.doctor import slices_check

            checks.append(Check("node capacity", None, "skipped: a DRA driver's chips are ResourceSlices"))
            checks.append(await slices_check(api, settings.dra_driver_name, dra_inventory))
        else:
            checks.append(await _capacity(api, node))
        return checks
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


async def _node_pod(api: KubeApi, node: str, ours: AgentDaemonSet) -> Check:
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
    pod = found[0]
    name = pod.metadata.name if pod.metadata else ""
    phase = (pod.status.phase if pod.status else None) or "Unknown"
    detail = f"{name} is {phase}"
    if phase != "Running":
        return Check("pod on this node", False, detail, f"kubectl -n {ours.namespace} describe pod {name}")
    return Check("pod on this node", True, detail)


async def _capacity(api: KubeApi, node: str) -> Check:
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
