"""The cluster feature that publishes the node summary (:mod:`ascend_agent.node_summary`) ``kubectl ascend``
reads: the ConfigMap ``kube-system/ascend-agent-node-<node>``, written when the summary changes (looked at
after every reconcile and every :data:`LOOK_INTERVAL` s, as holders change without one) and again every
:data:`~ascend_agent.node_summary.RENEW_SECONDS` s unchanged::

    publisher = SummaryPublisher(lambda: summary_document(...))
    publisher.observe(inventory)     # after each reconcile: look now
    await publisher.run(api)

RBAC: configmaps in kube-system create and patch. One request a write (a merge patch; a create the first
time), none to read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.writer import LatestWriter, api_backoff
from ascend_agent.model import Inventory
from ascend_agent.node_summary import DATA_KEY, LABEL, NAMESPACE, RENEW_SECONDS, configmap_name, stamped

# How often the summary is made again between reconciles (which pod holds a chip changes without one); at
# most one write each time.
LOOK_INTERVAL = 2.0
RETRY_CAP = 600.0


class SummaryPublisher:
    """Keeps the node's summary ConfigMap equal to ``document()``."""

    def __init__(self, document: Callable[[], dict[str, Any]]) -> None:
        self._document = document
        self._look = anyio.Event()

    def observe(self, inventory: Inventory) -> None:
        self._look.set()

    async def run(self, api: KubeApi) -> None:
        name = configmap_name(api.node)

        async def write(document: dict[str, Any]) -> None:
            data = {DATA_KEY: stamped(document, api.node, time.time())}
            patch = {"metadata": {"labels": {LABEL: "1"}}, "data": data}
            made = ConfigMap(
                metadata=ObjectMeta(name=name, namespace=NAMESPACE, labels={LABEL: "1"}), data=data
            )
            for _ in range(2):  # patched; else made; else (made meanwhile) patched again
                try:
                    request = api.client.patch(
                        ConfigMap, name, patch, namespace=NAMESPACE, patch_type=PatchType.MERGE
                    )
                    await api.call("patch", "configmaps", request)
                    return
                except ApiError as exc:
                    if exc.status.code != 404:
                        raise
                try:
                    await api.call("create", "configmaps", api.client.create(made))
                    return
                except ApiError as exc:
                    if exc.status.code != 409:
                        raise
            raise RuntimeError(f"{NAMESPACE}/{name} was deleted and made again while it was written")

        # A summary that cannot be written (its Role missing: 403) is retried at most every RETRY_CAP s: at
        # thousands of nodes the 30 s of the other features' writes would be a load of its own.
        backoff = api_backoff(cap=RETRY_CAP)
        writer = LatestWriter(f"the node summary {NAMESPACE}/{name}", write, backoff)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(writer.run)
            renewed = time.monotonic()
            while True:
                writer.set(self._document())
                with anyio.move_on_after(LOOK_INTERVAL):
                    await self._look.wait()
                self._look = anyio.Event()
                if time.monotonic() - renewed >= RENEW_SECONDS:
                    writer.refresh()
                    renewed = time.monotonic()
