"""The running agent's view of its chips, served read-only as JSON at ``/chips`` on its HTTP endpoint
(``metricsAddress``): what only that process knows, the flap hold, whether npu-smi is down and which chips
are network-unhealthy (a link down past the debounce needs queries over time). ``list`` and
``doctor`` ask it there, as they run a backend of their own that cannot know either::

    document = chip_states(agent.inventory, hold.release_in, hold.reason(), now=time.time())
    view = await ask_agent("127.0.0.1:9410")      # an AgentView, or a line saying why there is none
    status, body = await http_get("0.0.0.0:9410", "/readyz")   # any path; NoAnswer says why not
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
_READ_CHUNK = 64 * 1024
# An HTTP address that listens on every interface is asked on loopback.
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "[::]", "::"})


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
                "network_fault": chip.network_fault,
                "fault_class": chip.fault_class.huawei if chip.fault_class is not None else None,
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
    network_fault: str = ""  # why the chip is network-unhealthy; empty while it is not
    # its fault class by the running agent's table (mindx-dl-fault-config, escalations); None: no code
    fault_class: str | None = None

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


class NoAnswer(Exception):
    """The agent's HTTP address gave no whole answer; the message says why, in a few words."""


async def http_get(address: str, path: str, timeout: float = _TIMEOUT) -> tuple[str, bytes]:
    """(status line, body) of ``GET path`` at the agent's HTTP ``address`` (``metricsAddress``; a wildcard
    host is asked on loopback), read until the agent closes it (HTTP/1.0), at most 4 MiB.
    :class:`NoAnswer` when there is no whole answer."""
    host, _, port = address.rpartition(":")
    host = "127.0.0.1" if host in _WILDCARD_HOSTS else host.strip("[]")
    answer = bytearray()
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
                while chunk := await reader.read(_READ_CHUNK):
                    answer += chunk
                    if len(answer) > _MAX_ANSWER:
                        raise NoAnswer(f"an answer over {_MAX_ANSWER // (1024 * 1024)} MiB")
            finally:
                writer.close()
    except OSError as exc:
        raise NoAnswer(os.strerror(exc.errno).lower() if exc.errno else "no answer") from None
    except TimeoutError:
        raise NoAnswer(f"no whole answer within {timeout:g} s") from None
    except ValueError:
        raise NoAnswer(f"{address} is not HOST:PORT") from None
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].decode("latin-1"), body


async def ask_agent(address: str) -> AgentView | str:
    """The running agent's ``/chips`` at ``address`` (``metricsAddress``), or one line saying why it cannot
    be asked."""
    if not address:
        return "no running agent can be asked: metricsAddress is empty"
    try:
        status, body = await http_get(address, CHIPS_PATH)
    except NoAnswer as exc:
        return f"no running agent answers on {address} ({exc}): the hold and npu-smi's state are unknown"
    if " 200 " not in status + " ":
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
            network_fault=str(row.get("network_fault") or ""),  # an older agent has none
            fault_class=None if row.get("fault_class") is None else str(row["fault_class"]),
        )
        for row in document["chips"]
    }
    return AgentView(address, str(document["npu_smi"]["reason"]), chips)
