"""The cluster feature that keeps the node annotation ``ResetInfo`` (the chips a hot reset left to a person,
:mod:`ascend_agent.health.hotreset.resetinfo`) on the agent's Node, with ``--hot-reset`` on::

    annotation = ResetInfoAnnotation()
    annotation.set_reset_info(value)   # the JSON document; the newest one is written, retried with back-off
    await annotation.run(api)

RBAC: nodes patch (as for the labels).
"""

from __future__ import annotations

from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.writer import LatestWriter
from ascend_agent.health.hotreset.resetinfo import ANNOTATION
from ascend_agent.model import Inventory


class ResetInfoAnnotation:
    """Writes the newest ``ResetInfo`` value it was given; nothing until the first."""

    def __init__(self) -> None:
        self._value: str | None = None
        self._writer: LatestWriter[str] | None = None

    def observe(self, inventory: Inventory) -> None:
        return None

    def set_reset_info(self, value: str) -> None:
        self._value = value
        if self._writer is not None:
            self._writer.set(value)

    async def run(self, api: KubeApi) -> None:
        async def write(value: str) -> None:
            patch = {"metadata": {"annotations": {ANNOTATION: value}}}
            await api.call(
                "patch", "nodes", api.client.patch(Node, api.node, patch, patch_type=PatchType.MERGE)
            )

        self._writer = LatestWriter(f"the node annotation {ANNOTATION}", write)
        if self._value is not None:
            self._writer.set(self._value)
        await self._writer.run()
