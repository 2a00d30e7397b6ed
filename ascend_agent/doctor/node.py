"""The doctor's checks of the node itself: the device files, the driver, npu-smi and what the backend
finds; then the chips' vNPUs and training addresses::

    checks, inventory = await hardware_checks(settings)     # inventory: None when npu-smi failed on devfs
    checks += chip_checks(settings, inventory)
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ascend_agent.backends import discover_once
from ascend_agent.backends.npusmi import NpuSmiError, physical_ids
from ascend_agent.backends.tool import query_info
from ascend_agent.config import ConfigError, Settings
from ascend_agent.doctor.check import Check
from ascend_agent.model import Inventory

if TYPE_CHECKING:
    pass


_CHIP_NODE = re.compile(r"^davinci(\d+)$")


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


# What to mount where npu-smi gives no next step of its own (not found, exit status, garbage).
MOUNT_NPU_SMI = (
    "mount the host's npu-smi (/usr/local/bin/npu-smi), its driver and libraries (/usr/local/Ascend/driver, "
    "/usr/local/dcmi) and /dev into the agent's container and run it privileged, or pass --npu-smi"
)


async def _npu_smi(settings: Settings) -> tuple[list[int], Check, NpuSmiError | None]:
    executable = settings.effective_npu_smi
    try:
        table = await query_info(executable, settings.npu_smi_timeout)
    except NpuSmiError as exc:
        return [], Check("npu-smi reports chips", False, exc.cause, exc.next_step or MOUNT_NPU_SMI), exc
    ids = list(physical_ids(table.chips))
    health = {row.health for row in table.chips}
    names = ", ".join(sorted({row.name for row in table.chips}))
    detail = f"{len(ids)} chips ({names}), health {', '.join(sorted(health))}"
    return ids, Check("npu-smi reports chips", True, detail), None


def _unconfirmed(settings: Settings, nodes: set[int], failed: NpuSmiError) -> Check:
    """What the kubelet gets of the device files while npu-smi does not answer: no chip at all without
    ``model:``; with it, every chip Unhealthy (nothing confirms its health) unless
    ``healthyWithoutNpuSmi``."""
    name, mount = "chips advertised", failed.next_step or MOUNT_NPU_SMI
    if not nodes:
        return Check(name, None, "skipped: no device files")
    if settings.model is None:
        return Check(
            name,
            False,
            f"none of {len(nodes)} device files: npu-smi does not answer, so the chip model is unknown",
            f"{mount}; or set model: in the config file",
        )
    if settings.healthy_without_npu_smi:
        return Check(
            name,
            True,
            f"{len(nodes)} chips ({settings.model}) Healthy from their device files alone "
            "(healthyWithoutNpuSmi): npu-smi does not answer, so no chip fault is seen",
        )
    return Check(
        name,
        False,
        f"{len(nodes)} chips ({settings.model}), every one Unhealthy: npu-smi does not answer, so nothing "
        f"confirms their health ({failed.cause})",
        f"{mount}; or, to run on the device files alone, set healthyWithoutNpuSmi: true",
    )


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
    chips = [chip for chip in inventory.chips if chip.generation.trains]
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


async def hardware_checks(settings: Settings) -> tuple[list[Check], Inventory | None]:
    """The device files, the driver, npu-smi and (devfs) what is advertised; the backend's inventory, None
    when npu-smi already failed on devfs (asking the backend would run it, and wait its timeout, again)."""
    dev_root = settings.effective_dev_root
    nodes = _chip_nodes(dev_root)
    checks = [_device_files(dev_root, nodes), _driver(settings)]
    chips, npu_smi, failed = await _npu_smi(settings)
    checks.append(npu_smi)
    checks.append(_match(nodes, chips, dev_root))
    inventory = await _discover(settings) if settings.backend != "devfs" or failed is None else None
    if settings.backend == "devfs":
        if failed is None:
            checks.append(_advertised(nodes, inventory))
        else:
            checks.append(_unconfirmed(settings, nodes, failed))
    return checks, inventory


def chip_checks(settings: Settings, inventory: Inventory | None) -> list[Check]:
    """The chips' vNPUs and device IPs (the fake backend's chips have addresses only with fakeTraining)."""
    checks = []
    if inventory is not None and inventory.vnpus:
        checks.append(_vnpus(inventory))
    if inventory is not None and (settings.backend == "devfs" or settings.fake_training):
        checks.extend(_device_ips(inventory))
    return checks
