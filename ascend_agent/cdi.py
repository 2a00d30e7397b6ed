"""A CDI (Container Device Interface) spec for the node's chips, kept in step with them.

With ``--cdi-spec-dir /var/run/cdi`` the agent writes ``huawei.com-npu.yaml`` there: one CDI device per chip,
named by its device ID, with its device node (in ``ascend-runtime`` mode, which hands over no device nodes,
``ASCEND_CLAIMED_NPU_<n>=<n>`` instead: CDI refuses a device without edits); the management devices and
driver mounts are spec-wide edits. Allocate then names the chips as ``huawei.com/npu=Ascend910-2`` in
``cdi_devices``, and a CDI-aware runtime applies the edits itself::

    spec = build_spec(inventory.chips, inventory.container)
    await write_spec(Path("/var/run/cdi"), spec)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from ascend_agent.backoff import Backoff
from ascend_agent.container import container_spec
from ascend_agent.files import replace_file
from ascend_agent.model import Chip, ContainerBase, ContainerSpec, Inventory
from ascend_agent.naming import CDI_KIND

CDI_VERSION = "0.6.0"
SPEC_FILE = "huawei.com-npu.yaml"
# A failed write is tried again after these many seconds, doubling up to the cap, until it works.
_RETRY_START = 1.0
_RETRY_CAP = 60.0

log = logging.getLogger(__name__)


def build_spec(chips: Sequence[Chip], container: ContainerBase) -> dict[str, Any]:
    """The CDI spec document for ``chips``, each handed over with what ``container`` adds."""
    devices = []
    shared: ContainerSpec | None = None
    for chip in sorted(chips, key=lambda c: c.phys_id):
        spec = container_spec([chip], container)
        devices.append({"name": chip.device_id, "containerEdits": chip_edits(chip, spec)})
        shared = shared or spec
    edits = shared_edits(shared, {chip.device_path for chip in chips}) if shared is not None else {}
    document: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices}
    if edits:
        document["containerEdits"] = edits
    return document


def shared_edits(spec: ContainerSpec, chip_paths: set[str]) -> dict[str, Any]:
    """The CDI edits of ``spec`` that are not one chip's: its other device nodes and its mounts (either left
    out when there are none)::

        shared_edits(spec, {"/dev/davinci0"})  # {"deviceNodes": [{"path": "/dev/davinci_manager", ...}]}
    """
    edits: dict[str, Any] = {}
    nodes = [
        _node(n.host_path, n.container_path, n.permissions)
        for n in spec.devices
        if n.host_path not in chip_paths
    ]
    if nodes:
        edits["deviceNodes"] = nodes
    if spec.mounts:
        edits["mounts"] = [
            {
                "hostPath": mount.host_path,
                "containerPath": mount.container_path,
                "options": ["ro", "nosuid", "nodev", "bind"]
                if mount.read_only
                else ["nosuid", "nodev", "bind"],
            }
            for mount in spec.mounts
        ]
    return edits


def chip_edits(chip: Chip, spec: ContainerSpec) -> dict[str, Any]:
    """One chip's CDI edits: its device node from ``spec``; in ``ascend-runtime`` mode, where the runtime
    adds the device nodes itself, an environment variable naming the chip, because CDI refuses a device
    without edits ("invalid device, empty device edits")::

        chip_edits(chip, container_spec([chip], base))  # {"deviceNodes": [{"path": "/dev/davinci3", ...}]}
    """
    nodes = [
        _node(n.host_path, n.container_path, n.permissions)
        for n in spec.devices
        if n.host_path == chip.device_path
    ]
    if nodes:
        return {"deviceNodes": nodes}
    return {"env": [f"ASCEND_CLAIMED_NPU_{chip.phys_id}={chip.phys_id}"]}


def _node(host_path: str, container_path: str, permissions: str) -> dict[str, str]:
    node = {"path": container_path, "permissions": permissions}
    if host_path != container_path:
        node["hostPath"] = host_path
    return node


async def write_spec(directory: Path, document: dict[str, Any]) -> Path:
    """Write the spec atomically (a temporary file in the same directory, then rename); the path written."""
    import yaml  # only an agent with --cdi-spec-dir writes YAML

    return await asyncio.to_thread(_write, directory, yaml.safe_dump(document, sort_keys=False))


def _write(directory: Path, text: str) -> Path:
    target = directory / SPEC_FILE
    replace_file(target, text)  # container runtimes read it: 0755 directory, 0644 file
    return target


def remove_spec(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (directory / SPEC_FILE).unlink()


class SpecWriter:
    """The node's CDI spec kept in step with the chips: written when it changes, and after a failed write
    tried again after a back-off (1 s doubling to 60 s) that the reconcile loop waits for
    (:meth:`seconds_to_retry`); a full or read-only spec directory may be fixed meanwhile::

        writer = SpecWriter()
        await writer.write(Path("/var/run/cdi"), inventory)     # after each reconcile
        writer.problem                  # "cannot write the CDI spec in /var/run/cdi: ..." while it fails

    The spec stays when the agent stops: containers that restart while the agent is down resolve their CDI
    devices from it."""

    def __init__(self) -> None:
        self.problem = ""
        self._document: dict[str, Any] | None = None
        self._backoff = Backoff(_RETRY_START, _RETRY_CAP, jitter=False)
        self._retry_at = math.inf

    async def write(self, directory: Path | None, inventory: Inventory) -> None:
        """Write the spec of ``inventory``'s chips and vNPUs in ``directory`` (None: none) if it changed."""
        if directory is None or not inventory.chips:
            # No chips at all (npu-smi failing at start, say) must not empty the spec containers rely on.
            return
        document = build_spec((*inventory.chips, *inventory.vnpus), inventory.container)
        if document == self._document:
            return
        try:
            path = await write_spec(directory, document)
        except OSError as exc:
            problem = f"cannot write the CDI spec in {directory}: {exc.strerror or exc}"
            if problem != self.problem:
                log.error("%s; retrying with back-off", problem[0].upper() + problem[1:])
            self.problem = problem
            if self._retry_at <= anyio.current_time() or self._retry_at == math.inf:
                self._retry_at = anyio.current_time() + self._backoff.next()
            return
        self.problem = ""
        self._backoff.reset()
        self._retry_at = math.inf
        self._document = document
        log.info("Wrote CDI spec %s with %d devices", path, len(document["devices"]))

    def seconds_to_retry(self) -> float:
        """Seconds until a failed write is tried again; infinity when none failed."""
        return max(0.0, self._retry_at - anyio.current_time())

    def moved(self, old: Path | None) -> None:
        """The spec directory changed: the spec in ``old`` is removed, and the next write writes it anew."""
        if old is not None:
            remove_spec(old)
        self.problem = ""
        self._document = None
