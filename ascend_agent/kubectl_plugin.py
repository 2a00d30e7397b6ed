"""``kubectl ascend``: the NPUs of the whole cluster from the API alone, as the agents' node summaries
(:mod:`ascend_agent.node_summary`) say. Installed as the executable ``kubectl-ascend``, which kubectl runs for
``kubectl ascend``::

    kubectl ascend                      # a line per node, then the totals
    kubectl ascend -o wide              # a line per chip and vNPU: health, fault class, who uses it
    kubectl ascend --node npu-3 --unhealthy
    kubectl ascend -o json

Exit status 0; 1 when there is nothing to show or the API cannot be asked (one line on stderr says why).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ascend_agent.node_summary import (
    DATA_KEY,
    LABEL,
    NAMESPACE,
    RENEW_SECONDS,
    ChipSummary,
    NodeSummary,
    SummaryError,
    configmap_name,
)

_TIMEOUT = 15.0


class PluginError(Exception):
    """What stops the plugin, as the one line it prints."""


@dataclass(frozen=True, slots=True)
class Totals:
    nodes: int
    chips: int
    healthy: int
    in_use: int
    free: int

    @classmethod
    def of(cls, summaries: Sequence[NodeSummary]) -> Totals:
        chips = [(chip, in_use(summary, chip)) for summary in summaries for chip in summary.chips]
        return cls(
            nodes=len(summaries),
            chips=len(chips),
            healthy=sum(chip.healthy for chip, _ in chips),
            in_use=sum(used for _, used in chips),
            free=sum(chip.healthy and not used for chip, used in chips),
        )

    def line(self) -> str:
        """``16 chips on 2 nodes: 15 healthy, 3 in use, 12 free``."""
        return (
            f"{self.chips} chips on {self.nodes} node{'' if self.nodes == 1 else 's'}: "
            f"{self.healthy} healthy, {self.in_use} in use, {self.free} free"
        )


def in_use(summary: NodeSummary, chip: ChipSummary) -> bool:
    """Whether a container holds the chip, or one of the vNPUs carved from it."""
    return bool(chip.used_by) or any(part.used_by for part in summary.vnpus if part.chip == chip.id)


def _age(seconds: float) -> str:
    """``45s``, ``12m``, ``3h``, ``2d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _updated(summary: NodeSummary, now: float) -> str:
    age = _age(summary.age(now)) + " ago"
    return f"{age} (stale)" if summary.stale(now) else age


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)  # fmt: skip


def node_table(summaries: Sequence[NodeSummary], now: float) -> str:
    """A line per node: its agent, chips, and which are not Healthy (with their fault class)."""
    rows = [["NODE", "AGENT", "READY", "CHIPS", "HEALTHY", "IN USE", "FREE", "NOT HEALTHY", "UPDATED"]]
    for summary in summaries:
        totals = Totals.of([summary])
        sick = ", ".join(
            f"{chip.id}" + (f" ({chip.fault_class})" if chip.fault_class else "")
            for chip in summary.chips
            if not chip.healthy
        )
        rows.append([
            summary.node, summary.version, "yes" if summary.ready else f"no: {summary.reason}",
            str(totals.chips), str(totals.healthy), str(totals.in_use), str(totals.free), sick or "-",
            _updated(summary, now),
        ])  # fmt: skip
    return _table(rows)


def chip_table(summaries: Sequence[NodeSummary], unhealthy: bool) -> str:
    """A line per chip and vNPU: model, health, fault class, flap hold, who uses it."""
    rows = [["NODE", "DEVICE", "MODEL", "HEALTH", "FAULT CLASS", "FLAP HOLD", "USED BY", "REASON"]]
    for summary in summaries:
        for chip in (*summary.chips, *summary.vnpus):
            if unhealthy and chip.healthy:
                continue
            rows.append([
                summary.node, _device(chip), chip.model, chip.health, chip.fault_class or "-",
                "held" if chip.flap_held else "-", ", ".join(chip.used_by) or "-", chip.reason or "-",
            ])  # fmt: skip
    return _table(rows)


def _device(chip: ChipSummary) -> str:
    return f"{chip.id} ({chip.template} of {chip.chip})" if chip.chip else chip.id


def as_json(summaries: Sequence[NodeSummary], totals: Totals, now: float) -> dict[str, Any]:
    """The nodes shown, and the totals of every node (as the table's last line)."""
    return {
        "nodes": [
            {
                "node": s.node,
                "agent": {"version": s.version, "mode": s.mode, "ready": s.ready, "reason": s.reason},
                "updated": s.updated.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "ageSeconds": round(s.age(now)),
                "stale": s.stale(now),
                "chips": [_chip_json(chip) for chip in s.chips],
                "vnpus": [_chip_json(part) for part in s.vnpus],
                "problems": list(s.problems),
            }
            for s in summaries
        ],
        "totals": {
            "nodes": totals.nodes,
            "chips": totals.chips,
            "healthy": totals.healthy,
            "inUse": totals.in_use,
            "free": totals.free,
        },
    }


def _chip_json(chip: ChipSummary) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "id": chip.id, "model": chip.model, "health": chip.health, "reason": chip.reason,
        "faultClass": chip.fault_class, "flapHeld": chip.flap_held, "usedBy": list(chip.used_by),
    }  # fmt: skip
    if chip.chip:
        shown |= {"chip": chip.chip, "template": chip.template}
    return shown


def render(summaries: Sequence[NodeSummary], output: str, unhealthy: bool, now: float) -> str:
    """What the plugin prints for ``summaries`` (sorted by node)."""
    if output == "json":
        shown = [s for s in summaries if not unhealthy or any(not c.healthy for c in (*s.chips, *s.vnpus))]
        return json.dumps(as_json(shown, Totals.of(summaries), now), indent=2)
    stale = [
        f"{s.node}: summary last written {_age(s.age(now))} ago (renewed every {_age(RENEW_SECONDS)}): "
        "its agent has stopped or cannot reach the API server; kubectl -n kube-system get pods -o wide "
        "shows its pod"
        for s in summaries
        if s.stale(now)
    ]
    if output == "wide":
        body = chip_table(summaries, unhealthy)
    else:
        shown = [s for s in summaries if not unhealthy or any(not c.healthy for c in s.chips)]
        body = node_table(shown, now) if shown else "No node has a chip that is not Healthy."
    return "\n".join([body, "", Totals.of(summaries).line(), *stale])


def _kubeconfig(given: str | None) -> str | None:
    """The kubeconfig as kubectl finds it: the flag, ``$KUBECONFIG`` (its first file), ``~/.kube/config``;
    None inside a pod with a service account and none of them."""
    if given:
        return given
    from_env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    if from_env:
        return from_env
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


async def read_summaries(
    kubeconfig: str | None, namespace: str, node: str | None, context: str | None = None
) -> list[NodeSummary]:
    """The node summaries in ``namespace`` (one node's with ``node``), read through the API (the kubeconfig's
    ``context``, else its current one)."""
    from lightkube import ApiError
    from lightkube.resources.core_v1 import ConfigMap

    from ascend_agent.cluster.client import ApiUnavailable, ClusterConnectError, KubeApi, listed_with_version
    from ascend_agent.cluster.credentials import find_target

    target = find_target(kubeconfig)
    if target is None:
        raise PluginError(
            "no Kubernetes API configured: give --kubeconfig, set KUBECONFIG or write ~/.kube/config"
        )
    try:
        api = KubeApi.connect(target, node or "", timeout=_TIMEOUT, context=context)
    except ClusterConnectError as exc:
        raise PluginError(str(exc)) from None
    try:
        if node is not None:
            name = configmap_name(node)
            try:
                found = [
                    await api.call("get", "configmaps", api.client.get(ConfigMap, name, namespace=namespace))
                ]
            except ApiError as exc:
                if exc.status.code != 404:
                    raise PluginError(f"reading {namespace}/{name}: {exc.status.code} {exc}") from None
                raise PluginError(
                    f"node {node} has no ascend-agent summary ({namespace}/{name}): no agent runs there, "
                    "or it runs with nodeSummary: false or without the cluster side; kubectl get node "
                    f"{node} shows whether the node exists"
                ) from None
        else:
            found, _ = await api.call(
                "list",
                "configmaps",
                listed_with_version(
                    api.client, ConfigMap, namespace=namespace, labels={LABEL: "1"}, chunk_size=500
                ),
            )
    except ApiUnavailable as exc:
        raise PluginError(f"the Kubernetes API did not answer: {exc.failure}") from None
    finally:
        await api.close()
    if not found:
        raise PluginError(
            f"no ascend-agent node summaries in {namespace}: the agent is not installed (helm install "
            "ascend-agent ./ascend-agent-<version>.tgz -n kube-system), or runs with nodeSummary: false or "
            "without the cluster side"
        )
    summaries = []
    for configmap in found:
        if configmap.metadata is None or LABEL not in (configmap.metadata.labels or {}):
            continue  # a server that ignored the selector
        source = f"{namespace}/{configmap.metadata.name}"
        try:
            summaries.append(NodeSummary.parse(configmap.data, source))
        except SummaryError as exc:
            print(f"kubectl-ascend: skipped {exc}", file=sys.stderr)
    return sorted(summaries, key=lambda summary: summary.node)


def _arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="kubectl ascend",
        description="The Ascend NPUs of the cluster, as each node's ascend-agent publishes them "
        f"(ConfigMaps labelled {LABEL} in {NAMESPACE}, key {DATA_KEY}).",
    )
    parser.add_argument("--node", help="one node only, a line per chip")
    parser.add_argument("--unhealthy", action="store_true", help="only what is not Healthy")
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "wide", "json"),
        default="table",
        help="table: a line per node (default); wide: a line per chip and vNPU; json",
    )
    parser.add_argument("--kubeconfig", help="the kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", help="the kubeconfig's context to use (default: its current one)")
    parser.add_argument(
        "-n", "--namespace", default=NAMESPACE, help=f"where the summaries are (default {NAMESPACE})"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The plugin: prints the view, or one line saying why there is none; the exit status."""
    arguments = _arguments(sys.argv[1:] if argv is None else argv)
    logging.disable(logging.CRITICAL)  # the client's own log lines: the plugin says what failed, once
    output = "wide" if arguments.node is not None and arguments.output == "table" else arguments.output
    try:
        summaries = asyncio.run(
            read_summaries(
                _kubeconfig(arguments.kubeconfig), arguments.namespace, arguments.node, arguments.context
            )
        )
    except PluginError as exc:
        print(f"kubectl-ascend: {exc}", file=sys.stderr)
        return 1
    if not summaries:
        print(f"kubectl-ascend: no readable node summary in {arguments.namespace}", file=sys.stderr)
        return 1
    print(render(summaries, output, arguments.unhealthy, time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
