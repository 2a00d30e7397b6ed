"""``ascend-agent doctor``: the node-local checks behind "my NPU pod stays Pending", in reading order.

Each check says ok or failed, what it saw, and when failed the next step::

    checks = await run_checks(settings)
    print(render(checks))

One set of checks: the node's chips (:mod:`.node`), the kubelet's side of the mode ``kubeletApi`` selects
(:mod:`.deviceplugin` or :mod:`.dra`, each a :class:`~.check.Mode`), the running agent over its HTTP
endpoint (:mod:`.agent`) and what the API server shows (:mod:`.cluster`).
"""

from __future__ import annotations

from dataclasses import replace

from ascend_agent.config import DRA_API, Settings
from ascend_agent.doctor import agent, cluster, deviceplugin, dra, node
from ascend_agent.doctor.check import AgentDaemonSet, Check, as_json, render

__all__ = ["AgentDaemonSet", "Check", "as_json", "render", "run_checks"]


async def run_checks(settings: Settings, daemonset: AgentDaemonSet | None = None) -> list[Check]:
    """Every check, in the order a person should read them."""
    mode = dra.MODE if settings.kubelet_api == DRA_API else deviceplugin.MODE
    daemonset = daemonset or AgentDaemonSet()
    if not daemonset.name:
        daemonset = replace(daemonset, name=mode.daemonset)
    checks, inventory = await node.hardware_checks(settings)
    kubelet, after_chips = await mode.kubelet(settings, inventory, daemonset)
    checks.extend(kubelet)
    checks.extend(node.chip_checks(settings, inventory))
    checks.extend(after_chips)
    checks.extend(await agent.agent_checks(settings.metrics_address))
    checks.extend(await cluster.cluster_checks(settings, daemonset, mode, inventory))
    return checks
