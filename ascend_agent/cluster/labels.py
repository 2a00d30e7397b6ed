"""Node labels: what a nodeSelector or Volcano needs to find this node's chips, patched on the agent's own
Node with only the agent's keys (other labels untouched, stale keys of its own removed).

Labels change only from chips the agent has seen: while it knows of none (npu-smi failing at start, the
device files not there yet) the node keeps the labels it has. ``accelerator`` is never removed: it is what
the shipped DaemonSet's ``nodeSelector`` places the agent by, and a node without it loses the agent for good.

    >>> chips = tuple(Chip.make(i, "910B3", numa_node=i // 4, hbm_mb=65536) for i in range(8))
    >>> labels = node_labels(Inventory(chips, driver_version="25.0.rc1.1"), replicas=1)
    >>> labels["accelerator"], labels[CHIP_NAME], labels[CHIP_MEMORY]
    ('huawei-Ascend910', '910B3', '64G')
    >>> [labels[NPU_PREFIX + key] for key in ("count", "topology", "numa-nodes", "memory")]
    ['8', 'full-mesh', '2', '65536']
    >>> sanitise("Ascend 910B (x)")
    'Ascend-910B--x'
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from ascend_agent.allocation import Layout, topology_for
from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.writer import LatestWriter
from ascend_agent.model import Chip, Generation, Inventory

log = logging.getLogger("ascend_agent.cluster")

# Huawei's keys (their device plugin sets them; manifests and Volcano select on them) and GFD-style ones.
ACCELERATOR = "accelerator"
CHIP_NAME = "node.kubernetes.io/npu.chip.name"
DRIVER_VERSION = "huawei.com/driver.version"
CHIP_MEMORY = "mind-cluster/npu-chip-memory"
NPU_PREFIX = "huawei.com/npu."
_OWN_KEYS = frozenset({ACCELERATOR, CHIP_NAME, DRIVER_VERSION, CHIP_MEMORY})
# The shipped DaemonSet's nodeSelector (README, install): set from a chip model the agent has seen where the
# node has none, never changed or removed, or the DaemonSet controller would take the agent off the node.
_PLACING = frozenset({ACCELERATOR})

_ACCELERATORS = {
    Generation.ASCEND910A: "huawei-Ascend910",
    Generation.ASCEND910B: "huawei-Ascend910",
    Generation.ASCEND910A3: "huawei-Ascend910",
    Generation.ASCEND310P: "huawei-Ascend310P",
    Generation.ASCEND310B: "huawei-Ascend310",
    Generation.ASCEND310: "huawei-Ascend310",
    Generation.ASCEND950: "huawei-npu",
}
_TOPOLOGIES = {
    Layout.RINGS: "hccs-ring",
    Layout.MESH: "full-mesh",
    Layout.MODULES: "a3-module",
    Layout.FLAT: "none",
}
_MAX_VALUE = 63
_INVALID = re.compile(r"[^A-Za-z0-9._-]")
_VALID = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


def is_own_key(key: str) -> bool:
    return key in _OWN_KEYS or key.startswith(NPU_PREFIX)


def sanitise(value: str) -> str:
    """``value`` made a valid label value: other characters become ``-``, at most 63 characters, starting and
    ending with a letter or digit; empty when nothing is left."""
    cleaned = _INVALID.sub("-", value)[:_MAX_VALUE]
    return cleaned.strip("._-")


def node_labels(inventory: Inventory, replicas: int) -> dict[str, str]:
    """The agent's labels for these chips, values not yet sanitised. No chips: no labels."""
    chips = inventory.chips
    if not chips:
        return {}
    main = _most_common_model(chips)
    labels = {
        ACCELERATOR: _ACCELERATORS[main.generation],
        CHIP_NAME: main.model,
        f"{NPU_PREFIX}count": str(len(chips)),
        f"{NPU_PREFIX}product": f"Ascend{main.model}",
        f"{NPU_PREFIX}family": main.generation.value,
        f"{NPU_PREFIX}replicas": str(replicas),
        f"{NPU_PREFIX}topology": _TOPOLOGIES[topology_for(chips).layout],
    }
    if inventory.driver_version:
        labels[DRIVER_VERSION] = inventory.driver_version
    if main.hbm_mb:
        labels[CHIP_MEMORY] = f"{round(main.hbm_mb / 1024)}G"
        labels[f"{NPU_PREFIX}memory"] = str(main.hbm_mb)
    numa = {chip.numa_node for chip in chips if chip.numa_node is not None}
    if numa:
        labels[f"{NPU_PREFIX}numa-nodes"] = str(len(numa))
    labels.update(super_pod_labels(inventory))
    return labels


def super_pod_labels(inventory: Inventory) -> dict[str, str]:
    """``huawei.com/npu.super-pod-id`` and ``.server-index`` of an A3 node in a super pod; none elsewhere, nor
    for the driver's "none" (-1), which is no label value.

    >>> from ascend_agent.model import SuperPod
    >>> chip = Chip.make(0, "910_9392", super_pod=SuperPod(sdid=1, size=384, super_pod_id=0, server_index=40))
    >>> super_pod_labels(Inventory((chip,)))
    {'huawei.com/npu.super-pod-id': '0', 'huawei.com/npu.server-index': '40'}
    """
    super_pod = inventory.super_pod
    if super_pod is None:
        return {}
    values = {"super-pod-id": super_pod.super_pod_id, "server-index": super_pod.server_index}
    return {f"{NPU_PREFIX}{key}": str(value) for key, value in values.items() if value >= 0}


def _most_common_model(chips: tuple[Chip, ...]) -> Chip:
    model, _ = Counter(chip.model for chip in chips).most_common(1)[0]
    return next(chip for chip in chips if chip.model == model)


class NodeLabels:
    """The cluster feature that keeps the agent's labels on its Node (RBAC: nodes get, patch)."""

    def __init__(self, replicas: Callable[[], int]) -> None:
        self._replicas = replicas  # the running setting, read at each observe: a config reload changes it
        self._writer: LatestWriter[dict[str, str]] | None = None
        self._pending: dict[str, str] | None = None
        self._skipped: set[tuple[str, str]] = set()
        self._unknown = False  # the last inventory had no chips: said once, until chips are seen again

    def observe(self, inventory: Inventory) -> None:
        if not inventory.chips:
            # No chips is what an npu-smi outage or a driver not loaded yet looks like: nothing to go by.
            if not self._unknown:
                self._unknown = True
                log.info("Node labels kept as they are: the agent sees no chips")
            return
        self._unknown = False
        labels = self._valid(node_labels(inventory, self._replicas()))
        if self._writer is None:
            self._pending = labels
        else:
            self._writer.set(labels)

    def _valid(self, labels: dict[str, str]) -> dict[str, str]:
        valid = {}
        for key, value in labels.items():
            cleaned = sanitise(value)
            if cleaned and _VALID.match(cleaned):
                valid[key] = cleaned
            elif (key, value) not in self._skipped:
                self._skipped.add((key, value))
                log.warning("Node label %s not set: %r cannot be made a valid label value", key, value)
        return valid

    async def run(self, api: KubeApi) -> None:
        async def apply(labels: dict[str, str]) -> None:
            await _patch_labels(api, labels)

        self._writer = LatestWriter("node labels", apply)
        if self._pending is not None:
            self._writer.set(self._pending)
        await self._writer.run()


async def _patch_labels(api: KubeApi, labels: dict[str, str]) -> None:
    """One GET to see what is there, one merge patch for what differs (keys set to null are removed)."""
    node = await api.call("get", "nodes", api.client.get(Node, api.node), answers=frozenset())
    current = (node.metadata.labels if node.metadata else None) or {}
    patch: dict[str, Any] = {
        key: value
        for key, value in labels.items()
        if current.get(key) != value and not (key in _PLACING and key in current)
    }
    patch.update(
        {key: None for key in current if is_own_key(key) and key not in labels and key not in _PLACING}
    )
    for key in sorted(_PLACING & labels.keys()):
        if key in current and current[key] != labels[key]:
            log.info(
                "Node label %s=%s kept though the chips say %s: the DaemonSet is placed by it (change it by "
                "hand, with the DaemonSet's nodeSelector)",
                key, current[key], labels[key],
            )  # fmt: skip
    if not patch:
        return
    await api.call(
        "patch",
        "nodes",
        api.client.patch(Node, api.node, {"metadata": {"labels": patch}}, patch_type=PatchType.MERGE),
    )
    log.info(
        "Node %s labels: %s",
        api.node,
        ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in sorted(patch.items())),
    )
