"""``ascend-agent list``: the chips as the backend sees them, with the pod holding each and what the running
agent adds (the hold, npu-smi down, network-unhealthy), as rows for ``--json`` or a table::

    inventory, holders, problem, agent = await gather(settings)
    print_table(chip_rows(inventory, holders, settings.replicas, agent))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ascend_agent.backends import discover_once
from ascend_agent.config import DEFAULT_POD_RESOURCES_SOCKET, Settings
from ascend_agent.kubelet.holders import by_chip_once
from ascend_agent.kubelet.podresources import PodResourcesError, list_holders
from ascend_agent.model import Chip, Holder, Holders, Inventory
from ascend_agent.observability.chipstate import AgentView, ask_agent

# `list --volcano` reads the node's pods once; an API server that does not answer costs at most this.
_LIST_API_TIMEOUT = 5.0


def _agent_fields(device: str, agent: AgentView | str) -> dict[str, Any]:
    """What the running agent says of a chip: its health as the kubelet sees it, its fault class by its own
    table (the fault-config map's, with escalations), its hold and why it is network-unhealthy; ``held`` and
    ``network_fault`` are None when no agent could be asked (this process cannot know either)."""
    state = None if isinstance(agent, str) else agent.chips.get(device)
    if state is None:
        return {"held": None, "held_why": "", "held_until": None, "network_fault": None}
    return {
        "health": state.health,
        "reason": state.reason,
        "fault_class": state.fault_class,
        "held": state.held,
        "held_why": state.held_why,
        "held_until": state.held_until,
        "network_fault": state.network_fault,
    }


def _holder_rows(holders: Sequence[Holder]) -> list[dict[str, str]]:
    return [
        {
            "namespace": h.namespace,
            "pod": h.pod,
            "container": h.container,
            **({"claim": h.claim} if h.claim else {}),
        }
        for h in holders
    ]


def _training_row(chip: Chip) -> dict[str, Any]:
    """A chip's device IP, vNIC IP and super-pod identity (A3), None where it has none."""
    super_pod = chip.super_pod
    return {
        "device_ip": chip.device_ip,
        "vnic_ip": chip.vnic_ip,
        "super_pod": None
        if super_pod is None
        else {
            "super_pod_id": super_pod.super_pod_id,
            "server_index": super_pod.server_index,
            "sdid": super_pod.sdid,
            "size": super_pod.size,
        },
    }


def _vnpu_row(part: Chip, holders: list[dict[str, str]]) -> dict[str, Any]:
    assert part.vnpu is not None
    return {
        "id": part.device_id,
        "resource": part.resource,
        "health": part.health.value,
        "reason": part.reason,
        "vnpu_id": part.vnpu.vnpu_id,
        "template": part.vnpu.template,
        "aicore": part.vnpu.aicore,
        "memory_gb": part.vnpu.memory_gb,
        "device": part.device_path,
        "device_ip": part.rank_ip,
        "container_id": part.vnpu.container_id if part.vnpu.in_container else None,
        "holders": holders,
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line per chip; a chip's vNPUs on lines under it, with their template, AI cores and memory."""
    if not rows:
        print("no chips found")
        return
    columns = ("id", "model", "health", "held", "bus_id", "numa_node", "resource", "holder", "reason")
    lines = []
    for row in rows:
        lines.append({**row, "resource": "vNPUs below"} if row["vnpus"] else row)
        for part in row["vnpus"]:
            cores = "?" if part["aicore"] is None else part["aicore"]
            memory = "?" if part["memory_gb"] is None else part["memory_gb"]
            lines.append(
                {
                    "id": f"  {part['id']}",
                    "model": f"{part['template']}: {cores} AI cores, {memory} GB",
                    "health": part["health"],
                    "held": None,
                    "bus_id": None,
                    "numa_node": None,
                    "resource": part["resource"],
                    "holders": part["holders"],
                    "reason": part["reason"],
                }
            )
    cells = [[_cell(row, c) for c in columns] for row in lines]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    for line in [list(columns), *cells]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())


def _cell(row: dict[str, Any], column: str) -> str:
    if column == "held":
        held = row.get("held")
        if held is None:
            return "?" if "held_until" in row else "-"
        return f"until {row['held_until'] or 'quiet'}" if held else "no"
    if column == "holder":
        return (
            ",".join(
                f"{h['namespace']}/{h['pod']}/{h['container']}"
                + (f" (claim {h['claim']})" if "claim" in h else "")
                for h in row["holders"]
            )
            or "-"
        )
    if column == "reason" and row.get("network_fault"):
        return "; ".join(
            [*([row["reason"]] if row["reason"] else []), f"network-unhealthy: {row['network_fault']}"]
        )
    return "-" if row[column] is None else str(row[column])


async def gather(settings: Settings) -> tuple[Inventory, Holders, str | None, AgentView | str]:
    """The chips the backend sees, who holds each (and why that cannot be told), and what the running agent
    says (or why it cannot be asked)."""
    inventory, holders, problem = await _with_holders(settings)
    return inventory, holders, problem, await ask_agent(settings.metrics_address)


async def _with_holders(settings: Settings) -> tuple[Inventory, Holders, str | None]:
    inventory = await discover_once(settings)
    socket = settings.pod_resources_socket
    if socket == DEFAULT_POD_RESOURCES_SOCKET and not socket.exists():
        return inventory, Holders(), None  # not on a node (or not mounted): say nothing unless asked
    try:
        holders = await list_holders(settings.pod_resources_socket)
    except PodResourcesError as exc:
        return inventory, Holders(), f"cannot tell which pod holds which chip: {exc}"
    holders, problem = await by_chip_once(settings, holders, _LIST_API_TIMEOUT)
    return inventory, holders, f"holders by the kubelet's IDs: {problem}" if problem else None


def chip_rows(
    inventory: Inventory,
    holders: Holders,
    replicas: int,
    agent: AgentView | str,
    claim_driver: str | None = None,
) -> list[dict[str, Any]]:
    """One row per chip, its vNPUs and holders in it, and what the running agent says of it. As a DRA driver
    (``claim_driver``, its name) a chip's holders are those of the claims that gave it."""

    def held_by(chip: Chip, replicas: int) -> Sequence[Holder]:
        if claim_driver is not None:
            return holders.of_claimed(claim_driver, chip)
        return holders.of(chip, replicas)

    rows = [
        {
            "id": chip.device_id,
            "resource": chip.resource,
            "health": chip.health.value,
            "reason": chip.reason,
            "model": chip.model,
            "phys_id": chip.phys_id,
            "device": chip.device_path,
            "bus_id": chip.bus_id,
            "numa_node": chip.numa_node,
            "npu_id": chip.npu_id,
            "fault_class": chip.fault_class.huawei if chip.fault_class is not None else None,
            "faults": [
                {
                    "code": fault.code,
                    "text": fault.text,
                    "class": fault.fault_class.huawei if fault.fault_class is not None else None,
                }
                for fault in chip.faults
            ],
            **_training_row(chip),
            "holders": _holder_rows(held_by(chip, replicas)),
            "vnpus": [
                _vnpu_row(part, _holder_rows(held_by(part, 1)))
                for part in inventory.vnpus
                if part.phys_id == chip.phys_id
            ],
        }
        for chip in inventory.chips
    ]
    for row, chip in zip(rows, inventory.chips, strict=True):
        row.update(_agent_fields(chip.device_id, agent))
    return rows
