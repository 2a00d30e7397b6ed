"""The node summary: what one node's agent says of its NPUs for a view of the whole cluster (``kubectl
ascend``), published as the ConfigMap ``kube-system/ascend-agent-node-<node>`` (key ``summary.json``) by
:mod:`ascend_agent.cluster.summary`; small (1.0 KiB for 8 free chips, 2.9 KiB for 16 in use), written when
it changes and again every :data:`RENEW_SECONDS`, so that a reader can tell a summary whose agent stopped::

    document = summary_document(inventory, holders, ready=(True, ""), mode="device-plugin")
    summary = NodeSummary.parse(configmap_data, source="kube-system/ascend-agent-node-n1")
    summary.stale(now)      # True once not written for twice the renewal period
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ascend_agent import __version__
from ascend_agent.model import Chip, Health, Holder, Inventory

NAMESPACE = "kube-system"
NAME_PREFIX = "ascend-agent-node-"
DATA_KEY = "summary.json"
# The label every summary carries: ``kubectl ascend`` lists them by it.
LABEL = "ascend-agent/node-summary"
FORMAT = 1
# An unchanged summary is written again this often; one older than twice this is stale.
RENEW_SECONDS = 900.0
_NAME_MAX = 253


def configmap_name(node: str) -> str:
    """The summary's ConfigMap name: the prefix and the node's name, cut with a hash when too long.

    >>> configmap_name("npu-node-1")
    'ascend-agent-node-npu-node-1'
    >>> len(configmap_name("n" * 253))
    253
    """
    name = NAME_PREFIX + node
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{name[: _NAME_MAX - 11].rstrip('.-')}-{digest}"


def summary_document(
    inventory: Inventory,
    holders: Callable[[Chip], Sequence[Holder]],
    ready: tuple[bool, str],
    mode: str,
) -> dict[str, Any]:
    """The summary of ``inventory`` without its write time (compared to tell a change): each chip's health,
    fault class, flap hold and holders, each vNPU's, and whether the agent is ready and why not."""
    return {
        "format": FORMAT,
        "agent": {
            "version": __version__,
            "mode": mode,
            "ready": ready[0],
            "reason": "" if ready[0] else ready[1],
        },
        "chips": [_chip(chip, holders(chip)) for chip in inventory.chips],
        "vnpus": [
            {**_chip(part, holders(part)), "chip": part.chip_device_id, "template": part.vnpu.template}
            for part in inventory.vnpus
            if part.vnpu is not None
        ],
        "problems": list(inventory.problems),
    }


def _chip(chip: Chip, holders: Sequence[Holder]) -> dict[str, Any]:
    return {
        "id": chip.device_id,
        "model": chip.model,
        "health": chip.health.value,
        "reason": chip.reason,
        "faultClass": chip.fault_class.huawei if chip.fault_class is not None else "",
        "flapHeld": chip.held,
        "usedBy": [
            {"namespace": h.namespace, "pod": h.pod, **({"claim": h.claim} if h.claim else {})}
            for h in holders
        ],
    }


def stamped(document: Mapping[str, Any], node: str, now: float) -> str:
    """``document`` as written: with the node's name and the write time (UTC), compact JSON."""
    written = datetime.fromtimestamp(round(now), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps({**document, "node": node, "updated": written}, separators=(",", ":"), sort_keys=True)


class SummaryError(ValueError):
    """A summary that cannot be read; the message names it."""


@dataclass(frozen=True, slots=True)
class ChipSummary:
    id: str
    model: str
    health: str
    reason: str
    fault_class: str
    flap_held: bool
    used_by: tuple[str, ...]  # "namespace/pod" or "namespace/pod (claim c)"
    chip: str = ""  # a vNPU's chip
    template: str = ""  # a vNPU's template

    @property
    def healthy(self) -> bool:
        return self.health == Health.HEALTHY.value


@dataclass(frozen=True, slots=True)
class NodeSummary:
    node: str
    version: str
    mode: str
    ready: bool
    reason: str
    updated: datetime
    chips: tuple[ChipSummary, ...]
    vnpus: tuple[ChipSummary, ...]
    problems: tuple[str, ...]

    @classmethod
    def parse(cls, data: Mapping[str, str] | None, source: str) -> NodeSummary:
        """The summary in a ConfigMap's ``data``; :class:`SummaryError` names ``source`` and what is wrong."""
        text = (data or {}).get(DATA_KEY)
        if text is None:
            raise SummaryError(f"{source} has no {DATA_KEY}")
        try:
            raw = json.loads(text)
            agent = raw["agent"]
            return cls(
                node=str(raw["node"]),
                version=str(agent["version"]),
                mode=str(agent.get("mode", "")),
                ready=bool(agent["ready"]),
                reason=str(agent.get("reason", "")),
                updated=datetime.strptime(raw["updated"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC),
                chips=tuple(_chip_summary(chip) for chip in raw["chips"]),
                vnpus=tuple(_chip_summary(part) for part in raw.get("vnpus", ())),
                problems=tuple(str(problem) for problem in raw.get("problems", ())),
            )
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise SummaryError(
                f"{source}: {DATA_KEY} is not a node summary ({type(exc).__name__}: {exc})"
            ) from None

    def age(self, now: float) -> float:
        """Seconds since it was written."""
        return max(0.0, now - self.updated.timestamp())

    def stale(self, now: float) -> bool:
        """Not written again within twice the renewal period: its agent stopped or cannot reach the API."""
        return self.age(now) > 2 * RENEW_SECONDS


def _chip_summary(raw: Mapping[str, Any]) -> ChipSummary:
    used_by = tuple(
        f"{h['namespace']}/{h['pod']}" + (f" (claim {h['claim']})" if h.get("claim") else "")
        for h in raw.get("usedBy", ())
    )
    return ChipSummary(
        id=str(raw["id"]),
        model=str(raw.get("model", "")),
        health=str(raw["health"]),
        reason=str(raw.get("reason", "")),
        fault_class=str(raw.get("faultClass", "")),
        flap_held=bool(raw.get("flapHeld", False)),
        used_by=used_by,
        chip=str(raw.get("chip", "")),
        template=str(raw.get("template", "")),
    )
