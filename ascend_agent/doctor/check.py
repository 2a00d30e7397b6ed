"""What every doctor check is, and how a run is shown: one :class:`Check` per thing looked at, and the
:class:`Mode` each kubelet API (device plugin, DRA driver) fills with its own checks::

    print(render([Check("npu-smi", True, "8 chips")]))     # [     ok] npu-smi: 8 chips
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from ascend_agent import naming

if TYPE_CHECKING:
    from ascend_agent.cluster.client import KubeApi
    from ascend_agent.config import Settings
    from ascend_agent.model import Inventory

DIAL_TIMEOUT = 3.0
API_TIMEOUT = 10.0


DAEMONSET = naming.DAEMONSET_NAME

NAMESPACE = naming.DAEMONSET_NAMESPACE


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


@dataclass(frozen=True, slots=True)
class Mode:
    """The checks of one kubelet API, which ``run_checks`` selects by ``kubeletApi``: ``kubelet`` gives the
    checks of the kubelet's side in their place and those read after the chips' own (the pods on Unhealthy
    chips); ``capacity`` what the API server shows of the node's chips; ``look`` the command to see them."""

    daemonset: str
    kubelet: Callable[
        [Settings, Inventory | None, AgentDaemonSet], Awaitable[tuple[list[Check], list[Check]]]
    ]
    capacity: Callable[[KubeApi, Settings, Inventory | None], Awaitable[list[Check]]]
    look: Callable[[str], str]
