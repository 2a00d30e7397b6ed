"""The cluster side as the agent holds it: the shared client and the features that use it.

side = ClusterSide(api, [NodeLabels(), NodeEvents()])
tasks.start_soon(side.run)          # one task per feature, beside the kubelet's tasks
side.observe(inventory)             # after each reconcile; never blocks, never awaits
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import anyio

from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.health import ApiState
from ascend_agent.model import Inventory


class Feature(Protocol):
    """One thing the agent keeps in the cluster: node labels, Events, a ConfigMap, a pod watch..."""

    def observe(self, inventory: Inventory) -> None:
        """The chips and their health after a reconcile: remember what to write, wake the own task. Called
        on the event loop: must not block or await."""

    async def run(self, api: KubeApi) -> None:
        """The feature's own task for the agent's lifetime; cancelled when the agent stops."""


class ClusterSide:
    """Runs each feature's task and hands each inventory to every feature."""

    def __init__(self, api: KubeApi, features: Sequence[Feature]) -> None:
        self.api = api
        self.features = tuple(features)

    def observe(self, inventory: Inventory) -> None:
        for feature in self.features:
            feature.observe(inventory)

    def state(self) -> ApiState:
        return self.api.health.state()

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tasks:
                for feature in self.features:
                    tasks.start_soon(feature.run, self.api, name=f"cluster {type(feature).__name__}")
                await anyio.sleep_forever()  # the client stays open for what asks through it
        finally:
            await self.api.close()
