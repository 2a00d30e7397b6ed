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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ascend_agent.container import container_spec
from ascend_agent.files import replace_file
from ascend_agent.model import Chip, ContainerBase, ContainerSpec
from ascend_agent.naming import CDI_KIND

CDI_VERSION = "0.6.0"
SPEC_FILE = "huawei.com-npu.yaml"


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
