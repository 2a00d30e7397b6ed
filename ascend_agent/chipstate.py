"""The running agent's view of its chips, served read-only as JSON at ``/chips`` on its HTTP endpoint
(``metricsAddress``): what only that process knows, the flap hold and whether npu-smi is down. ``list`` and
``doctor`` ask it there, as they run a backend of their own that cannot know either::

    document = chip_states(agent.inventory, hold.release_in, hold.reason(), now=time.time())
    view = await ask_agent("127.0.0.1:9410")      # an AgentView, or a line saying why there is none
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ascend_agent.model import Inventory

CHIPS_PATH = "/chips"
_TIMEOUT = 3.0
_MAX_ANSWER = 4 * 1024 * 1024


def chip_states(
    inventory: Inventory, release_in: Callable[[str], float | None], hold_reason: str, now: float
) -> dict[str, Any]:
    """The ``/chips`` document: npu-smi's state, and per chip its health, reason, and the hold (``held_until``
    the UTC time its hold ends if it stays Healthy, null while it is not Healthy yet)."""
    chips = []
    for chip in inventory.chips:
        seconds = release_in(chip.device_id) if chip.held else None
        chips.append(
            {
                "id": chip.device_id,
                "health": chip.health.value,
                "reason": chip.reason,
                "health_unknown": chip.health_unknown,
                "held": chip.held,
                "held_why": hold_reason if chip.held else "",
                "held_until": None if seconds is None else _utc(now + seconds),
            }
        )
    return {"npu_smi": {"down": bool(inventory.outage), "reason": inventory.outage}, "chips": chips}


def _utc(timestamp: float) -> str:
    return datetime.fromtimestamp(round(timestamp), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class ChipState:
    health: str
    reason: str
    health_unknown: bool
    held: bool
    held_why: str
    held_until: str | None

    def hold_text(self) -> str:
        """``held until 2026-12-04T19:50:00Z: <why>``; empty when not held."""
        if not self.held:
            return ""
        until = (
            f"until {self.held_until}"
            if self.held_until
            else "until it has been Healthy for the quiet period"
        )
        return f"held {until}: {self.held_why}"


@dataclass(frozen=True, slots=True)
class AgentView:
    """What the running agent answered at ``/chips``."""

    address: str
    npu_smi_down: str  # why npu-smi counts as down; empty while it answers
    chips: Mapping[str, ChipState]

    def held(self) -> dict[str, ChipState]:
        return {device: state for device, state in self.chips.items() if state.held}


async def ask_agent(address: str) -> AgentView | str:
    """The running agent's ``/chips`` at ``address`` (``metricsAddress``; 0.0.0.0 is asked on loopback), or
    one line saying why it cannot be asked."""
    if not address:
        return "no running agent can be asked: metricsAddress is empty"
    host, _, port = address.rpartition(":")
    host = "127.0.0.1" if host in ("0.0.0.0", "", "[::]") else host.strip("[]")
    try:
        async with asyncio.timeout(_TIMEOUT):
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(f"GET {CHIPS_PATH} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
                answer = await reader.read(_MAX_ANSWER)
            finally:
                writer.close()
    except (OSError, TimeoutError, ValueError) as exc:
        why = os.strerror(exc.errno).lower() if isinstance(exc, OSError) and exc.errno else "no answer"
        return f"no running agent answers on {address} ({why}): the hold and npu-smi's state are unknown"
    head, _, body = answer.partition(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
        return f"the agent on {address} does not serve {CHIPS_PATH}: is it an older version?"
    try:
        return _view(address, json.loads(body))
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"the agent on {address} answered {CHIPS_PATH} with something that is not its chip list"


def _view(address: str, document: Mapping[str, Any]) -> AgentView:
    chips = {
        str(row["id"]): ChipState(
            health=str(row["health"]),
            reason=str(row["reason"]),
            health_unknown=bool(row["health_unknown"]),
            held=bool(row["held"]),
            held_why=str(row["held_why"]),
            held_until=None if row["held_until"] is None else str(row["held_until"]),
        )
        for row in document["chips"]
    }
    return AgentView(address, str(document["npu_smi"]["reason"]), chips)
