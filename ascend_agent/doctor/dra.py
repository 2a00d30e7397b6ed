"""The doctor's checks of a DRA driver (``kubeletApi: dra``), the :data:`MODE` ``run_checks`` selects in place
of the device plugin's: the registration socket answering GetInfo, ``dra.sock`` serving, the checkpoint of
prepared claims (each with its CDI spec), and with a Kubernetes API the node's ResourceSlices for the driver::

    checks = await kubelet_checks(settings, inventory)
    checks.append(await slices_check(api, settings.dra_driver_name, inventory))
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from grpclib.exceptions import GRPCError, StreamTerminatedError

from ascend_agent import naming
from ascend_agent._proto.dra.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from ascend_agent._proto.pluginregistration import InfoRequest, PluginInfo, RegistrationStub
from ascend_agent.config import Settings
from ascend_agent.doctor.check import DIAL_TIMEOUT as _DIAL_TIMEOUT
from ascend_agent.doctor.check import AgentDaemonSet, Check, Mode
from ascend_agent.doctor.holders import holders_check
from ascend_agent.kubelet.deviceplugin.transport import LocalChannel
from ascend_agent.kubelet.dra.claims import (
    CheckpointError,
    UnusableCheckpoint,
    read_checkpoint,
    spec_file_name,
)
from ascend_agent.kubelet.dra.devices import chip_of, device_name
from ascend_agent.kubelet.dra.paths import DraPaths, other_pods
from ascend_agent.kubelet.dra.plugin import PLUGIN_TYPE
from ascend_agent.model import Inventory

if TYPE_CHECKING:
    from ascend_agent.cluster.client import KubeApi

_AS_ROOT = "run the doctor as root, as the agent runs: it reads the kubelet's directories"
_AGENT_LOGS = "the agent is stuck or gone: check its logs, then restart its pod"


def skipped_device_plugin_checks() -> list[Check]:
    """The device plugin's checks, each skipped with the reason."""
    why = "skipped: the agent is a DRA driver (kubeletApi: dra)"
    return [
        Check("kubelet socket", None, f"{why}; device plugins register on kubelet.sock"),
        Check("plugin socket", None, f"{why}; device plugins serve <resource>.sock"),
    ]


async def kubelet_checks(settings: Settings, inventory: Inventory | None) -> list[Check]:
    """The registration socket, ``dra.sock`` and the checkpoint of prepared claims."""
    paths = pod_paths(settings)
    return [
        await _registration(paths, settings.dra_driver_name),
        await _plugin_socket(paths.socket),
        _checkpoint(paths, settings.dra_driver_name, inventory),
    ]


def failing_devices(driver: str, inventory: Inventory | None) -> list[tuple[str, str]]:
    """(driver, device name) of each Unhealthy or held device: the doctor names the pods holding them."""
    advertised = inventory.advertised if inventory is not None else ()
    return [(driver, device_name(chip)) for chip in advertised if not chip.healthy or chip.held]


def pod_paths(settings: Settings) -> DraPaths:
    """The driver's paths. Outside the agent's pod (no ``$POD_UID``) and with no ``<driver>-reg.sock``: those
    of the newest ``<driver>-<pod uid>-reg.sock``, the socket of the pod a rolling update made last."""
    paths = DraPaths.of(settings)
    if paths.lock is not None or os.path.lexists(paths.registration):
        return paths
    found: list[tuple[float, str]] = []
    for registration, uid in other_pods(paths, settings.dra_driver_name):
        with contextlib.suppress(OSError):
            found.append((registration.lstat().st_mtime, uid))
    return DraPaths.of(settings, pod=max(found)[1]) if found else paths


def _missing_socket(name: str, path: Path) -> Check | None:
    """A failed check when ``path`` is no socket; None when it is."""
    try:
        if path.is_socket():
            return None
        seen = f"{path} is not a socket" if path.exists() else f"{path} does not exist"
    except OSError as exc:
        return Check(name, False, f"cannot look at {path}: {exc.strerror or exc}", _AS_ROOT)
    return Check(
        name,
        False,
        seen,
        "is the agent running in DRA mode, with the kubelet's plugins and plugins_registry directories "
        "mounted? kubectl -n kube-system logs <agent pod>",
    )


async def _registration(paths: DraPaths, driver: str) -> Check:
    """What the kubelet's plugin watcher sees: GetInfo on ``<driver>-reg.sock``."""
    name = "DRA registration socket"
    path = paths.registration
    if (missing := _missing_socket(name, path)) is not None:
        return missing
    channel = LocalChannel(path)
    try:
        with anyio.fail_after(_DIAL_TIMEOUT):
            info: PluginInfo = await RegistrationStub(channel).get_info(InfoRequest())
    except (TimeoutError, OSError, GRPCError, StreamTerminatedError) as exc:
        return Check(name, False, f"{path} does not answer GetInfo: {exc or type(exc).__name__}", _AGENT_LOGS)
    finally:
        channel.close()
    versions = ", ".join(info.supported_versions)
    seen = f"{path}: {info.type} {info.name}, endpoint {info.endpoint}, versions {versions}"
    if (info.type, info.name, info.endpoint) != (PLUGIN_TYPE, driver, str(paths.socket)):
        return Check(
            name,
            False,
            f"{seen}; expected {PLUGIN_TYPE} {driver}, endpoint {paths.socket}",
            "another program serves this socket, or the agent runs with other settings than the doctor: "
            "give the doctor the agent's config file",
        )
    return Check(name, True, seen)


async def _plugin_socket(path: Path) -> Check:
    """``dra.sock`` serving DRAPlugin: an unprepare of no claims, which changes nothing."""
    name = "DRA plugin socket"
    if (missing := _missing_socket(name, path)) is not None:
        return missing
    channel = LocalChannel(path)
    try:
        with anyio.fail_after(_DIAL_TIMEOUT):
            await dra_v1.DraPluginStub(channel).node_unprepare_resources(
                dra_v1.NodeUnprepareResourcesRequest()
            )
    except (TimeoutError, OSError, GRPCError, StreamTerminatedError) as exc:
        return Check(name, False, f"{path} does not answer: {exc or type(exc).__name__}", _AGENT_LOGS)
    finally:
        channel.close()
    return Check(name, True, f"{path} serves DRAPlugin")


def _checkpoint(paths: DraPaths, driver: str, inventory: Inventory | None) -> Check:
    """The prepared claims, as the agent recorded them; a failed check for claims whose CDI spec is gone
    (their containers cannot start) and for claims on Unhealthy chips."""
    name = "prepared claims"
    path = paths.checkpoint
    try:
        exists = os.path.lexists(path)
        if exists and path.is_file():
            path.open("rb").close()  # unreadable to this user: say so, not that the file is bad
        claims = sorted(read_checkpoint(path), key=lambda c: (c.namespace, c.name))
    except OSError as exc:
        return Check(name, False, f"cannot look at {path}: {exc.strerror or exc}", _AS_ROOT)
    except UnusableCheckpoint as exc:
        return Check(
            name,
            False,
            str(exc),
            "the agent keeps such a file aside at its start and prepares the kubelet's claims again: "
            "restart its pod",
        )
    except CheckpointError as exc:
        return Check(name, False, str(exc), _AS_ROOT)
    if not exists:
        return Check(name, True, f"none: no checkpoint {path} yet")
    if not claims:
        return Check(name, True, f"none ({path})")
    listed = "; ".join(
        f"{c.namespace}/{c.name} ({', '.join(d.device_name for d in c.devices) or 'no devices'})"
        for c in claims
    )
    without_spec = [
        f"{c.namespace}/{c.name} ({spec})"
        for c in claims
        if not (spec := paths.cdi_dir / spec_file_name(driver, c.uid)).is_file()
    ]
    if without_spec:
        return Check(
            name,
            False,
            f"{len(claims)} prepared: {listed}; CDI spec missing: {'; '.join(without_spec)}",
            "containers of these claims cannot start (the CDI directory emptied by a reboot?): the agent "
            "writes a claim's spec again when the kubelet prepares it; check that cdiSpecDir is the "
            "directory the container runtime reads",
        )
    failing = {
        device_name(chip): chip.reason or "Unhealthy"
        for chip in (inventory.advertised if inventory is not None else ())
        if not chip.healthy or chip.held
    }
    # A template device of a dynamic chip fails with its chip.
    reasons = {
        d.device_name: failing.get(d.device_name) or failing.get(chip_of(d.device_name))
        for c in claims
        for d in c.devices
    }
    on_failing = [
        f"{c.namespace}/{c.name} on {d.device_name} ({reasons[d.device_name]})"
        for c in claims
        for d in c.devices
        if reasons[d.device_name] and not d.admin_access  # monitoring a failing chip is what it is for
    ]
    if on_failing:
        return Check(
            name,
            False,
            f"{len(claims)} prepared: {listed}; on Unhealthy chips: {'; '.join(on_failing)}",
            "the pods of these claims run on failing chips: delete them (new claims avoid tainted devices)",
        )
    return Check(name, True, f"{len(claims)} prepared: {listed}")


async def slices_check(api: KubeApi, driver: str, inventory: Inventory | None) -> Check:
    """The node's ResourceSlices for ``driver``: one device per chip, the tainted ones named."""
    from ascend_agent.kubelet.dra.slices import ResourceSlice

    name = "resource slices"

    async def listed() -> list[Any]:
        return [
            item
            async for item in api.client.list(
                ResourceSlice, fields={"spec.nodeName": api.node, "spec.driver": driver}
            )
        ]

    slices = [
        dict(item)
        for item in await api.call("list", "resourceslices", listed())
        if (item.get("spec") or {}).get("driver") == driver
        and (item.get("spec") or {}).get("nodeName") == api.node
    ]
    if not slices:
        return Check(
            name,
            False,
            f"no ResourceSlice of driver {driver} for node {api.node}",
            "the agent has not published its chips: see its log and /healthz (kubernetes api)",
        )
    devices: list[dict[str, Any]] = [d for s in slices for d in (s.get("spec") or {}).get("devices") or ()]
    chip_devices = {str(d.get("name")) for d in devices if _OUR_DEVICE.fullmatch(str(d.get("name", "")))}
    tainted = [
        f"{d.get('name')} ({', '.join(str(t.get('value') or t.get('key')) for t in d['taints'])})"
        for d in devices
        if d.get("taints")
    ]
    detail = f"{_plural(slices, 'slice')}, {_plural(chip_devices, 'chip device')}"
    if len(devices) != len(chip_devices):
        detail += f" and {len(devices) - len(chip_devices)} others"
    detail += f"; tainted: {', '.join(tainted)}" if tainted else ", none tainted"
    if inventory is not None:
        # A chip split into vNPUs is published as its vNPUs, not whole.
        chips = {device_name(chip) for chip in inventory.advertised}
        missing, gone = sorted(chips - chip_devices), sorted(chip_devices - chips)
        if missing or gone:
            differ = [f"chips without a device: {', '.join(missing)}"] if missing else []
            differ += [f"devices of no chip here: {', '.join(gone)}"] if gone else []
            return Check(
                name,
                False,
                f"{detail}; {'; '.join(differ)}",
                "the slices are behind the chips: see the agent's log for ResourceSlice write failures",
            )
        detail += f", for {_plural(inventory.chips, 'chip')}"
    if devices and len(tainted) == len(devices):
        return Check(
            name, False, detail, "every device is tainted: no claim can get one; see the checks above"
        )
    return Check(name, True, detail)


# A chip's device (npu-3) or a vNPU's (npu-3-vnpu-130).
_OUR_DEVICE = re.compile(r"npu-\d+(-vnpu-\d+)?")


def _plural(items: Collection[object], word: str) -> str:
    return f"{len(items)} {word}{'' if len(items) == 1 else 's'}"


async def _kubelet_checks(
    settings: Settings, inventory: Inventory | None, daemonset: AgentDaemonSet
) -> tuple[list[Check], list[Check]]:
    failing = failing_devices(settings.dra_driver_name, inventory)
    checks = [*skipped_device_plugin_checks(), *await kubelet_checks(settings, inventory)]
    return checks, [await holders_check(settings, failing)] if failing else []


async def _capacity_checks(api: KubeApi, settings: Settings, inventory: Inventory | None) -> list[Check]:
    return [
        Check("node capacity", None, "skipped: a DRA driver's chips are ResourceSlices"),
        await slices_check(api, settings.dra_driver_name, inventory),
    ]


MODE = Mode(
    daemonset=naming.DRA_DAEMONSET_NAME,
    kubelet=_kubelet_checks,
    capacity=_capacity_checks,
    look=lambda node: f"kubectl get resourceslices --field-selector spec.nodeName={node}",
)
