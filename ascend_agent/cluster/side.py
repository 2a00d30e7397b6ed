"""The cluster side as the agent holds it: the shared client and the features that use it.

    side = ClusterSide(target, node, features=lambda: [NodeLabels(lambda: 1), NodeEvents()])
    tasks.start_soon(side.run)          # loads the client in a thread, then one task per feature
    side.observe(inventory)             # after each reconcile; never blocks, never awaits
    side.event("Warning", reason, subject, message)   # an Event on the Node, kept until the side has loaded
    side.reset_info(value)              # the node annotation ResetInfo (--hot-reset), kept likewise
    side.kubelet_registered()           # the kubelet registered the plugin (again): rewrite what it removes

The client library and the features' modules are imported in a worker thread when :meth:`ClusterSide.run`
starts, so the agent's start (serving and registering with the kubelet) does not wait for those imports.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import anyio

from ascend_agent.backoff import wait_before_retry
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.model import Inventory

if TYPE_CHECKING:
    from ascend_agent.cluster.client import KubeApi
    from ascend_agent.cluster.health import ApiState
    from ascend_agent.config import Settings

log = logging.getLogger("ascend_agent.cluster")


@runtime_checkable
class EventNotes(Protocol):
    """The feature that raises Events on the Node (``NodeEvents``)."""

    def note(self, kind: str, reason: str, subject: str, message: str) -> None: ...


@runtime_checkable
class ResetInfoSink(Protocol):
    """The feature that keeps the node annotation ``ResetInfo`` (``ResetInfoAnnotation``)."""

    def set_reset_info(self, value: str) -> None: ...


@runtime_checkable
class KubeletRegistrations(Protocol):
    """A feature that writes again what a starting kubelet removes (the DRA driver's ResourceSlices)."""

    def kubelet_registered(self) -> None: ...


class Feature(Protocol):
    """One thing the agent keeps in the cluster: node labels, Events, a ConfigMap, a pod watch..."""

    def observe(self, inventory: Inventory) -> None:
        """The chips and their health after a reconcile: remember what to write, wake the own task. Called
        on the event loop: must not block or await."""

    async def run(self, api: KubeApi) -> None:
        """The feature's own task for the agent's lifetime; cancelled when the agent stops."""


async def _guarded(feature: Feature, api: KubeApi) -> None:
    """``feature.run``, started again after back-off if it ever fails: a bug in one cluster feature must not
    end the agent (the kubelet's side shares its task group)."""
    from ascend_agent.cluster.client import ApiUnavailable
    from ascend_agent.cluster.writer import api_backoff

    backoff = api_backoff()
    while True:
        try:
            await feature.run(api)
            return
        except Exception as exc:
            log.exception("Cluster feature %s failed; starting it again", type(feature).__name__)
            failure = exc if isinstance(exc, ApiUnavailable) else None
        await wait_before_retry(backoff, failure)


class ClusterSide:
    """Runs each feature's task and hands each inventory to every feature."""

    def __init__(
        self,
        target: ClusterTarget,
        node: str,
        features: Callable[[], Sequence[Feature]],
        settings: Settings | None = None,
    ) -> None:
        self.target = target
        self.node = node
        # The agent's running settings, replaced by it on a config reload: a feature that follows a setting
        # live (the replicas label) reads it here.
        self.settings = settings
        self._make_features = features
        self.api: KubeApi | None = None
        self.features: tuple[Feature, ...] = ()
        self._latest: Inventory | None = None
        self._failed: str | None = None
        self._loaded: anyio.Event | None = None  # made by the first wait_loaded, set by run
        self._events: list[tuple[str, str, str, str]] = []  # raised before the features loaded
        self._reset_info: str | None = None  # the newest ResetInfo, kept until the features loaded

    def observe(self, inventory: Inventory) -> None:
        """Hand ``inventory`` to every feature. Called in the agent's reconcile: a feature that fails here is
        logged, never the end of the reconcile (the kubelet's side runs there too)."""
        self._latest = inventory
        for feature in self.features:
            try:
                feature.observe(inventory)
            except Exception:
                log.exception("Cluster feature %s failed on the new inventory", type(feature).__name__)

    def event(self, kind: str, reason: str, subject: str, message: str) -> None:
        """An Event on the Node (``kind`` Normal or Warning), raised by the Events feature: at once when the
        side has loaded, else once it has. Never blocks."""
        self._events.append((kind, reason, subject, message))
        self._hand_events()

    def reset_info(self, value: str) -> None:
        """The node annotation ``ResetInfo`` (``--hot-reset``), written by its feature: at once when the side
        has loaded, else once it has. Never blocks."""
        self._reset_info = value
        self._hand_reset_info()

    def kubelet_registered(self) -> None:
        """The kubelet registered the agent's plugin (again: it may have restarted); told to the features that
        write again what a starting kubelet removes. Before the features loaded there is nothing to tell: they
        write everything once loaded. Never blocks."""
        for feature in self.features:
            if isinstance(feature, KubeletRegistrations):
                feature.kubelet_registered()

    def _hand_reset_info(self) -> None:
        if self._reset_info is None:
            return
        for feature in self.features:
            if isinstance(feature, ResetInfoSink):
                feature.set_reset_info(self._reset_info)

    def _hand_events(self) -> None:
        notes = [feature for feature in self.features if isinstance(feature, EventNotes)]
        if not notes:
            return
        events, self._events = self._events, []
        for event in events:
            for feature in notes:
                feature.note(*event)

    def state(self) -> ApiState:
        if self.api is not None:
            return self.api.health.state()
        from ascend_agent.cluster.health import ApiState

        return ApiState(None, f"off: {self._failed}" if self._failed else "starting")

    async def wait_loaded(self) -> None:
        """Return once :meth:`run` has loaded the features, or given up (a client that cannot be made loads
        none: :meth:`state` says why); the caller bounds the wait."""
        if self.api is not None or self._failed is not None:
            return
        if self._loaded is None:
            self._loaded = anyio.Event()
        await self._loaded.wait()

    def _load(self) -> tuple[KubeApi, tuple[Feature, ...]]:
        from ascend_agent.cluster.bounded import DEFAULT_LIST_LIMIT, MIB
        from ascend_agent.cluster.client import KubeApi

        settings = self.settings
        limit = settings.api_list_limit_mib * MIB if settings is not None else DEFAULT_LIST_LIMIT
        qps, burst = (settings.api_qps, settings.api_burst) if settings is not None else (0.0, 1)
        api = KubeApi.connect(self.target, self.node, list_limit=limit, qps=qps, burst=burst)
        return api, tuple(self._make_features())

    async def run(self) -> None:
        from ascend_agent.cluster.client import ClusterConnectError

        try:
            api, features = await anyio.to_thread.run_sync(self._load)
        except ClusterConnectError as exc:
            self._failed = str(exc)
            log.error("Cluster side off: %s", exc)
            if self._loaded is not None:
                self._loaded.set()
            return
        self.api, self.features = api, features
        # The client library's modules and models stay until the agent exits: a full collection that walked
        # them took 39 ms on the bench machine under load (the agent's own modules alone: 7 ms); frozen, they
        # are not walked again.
        gc.freeze()
        if self._loaded is not None:
            self._loaded.set()
        log.info(
            "Cluster side on: %s, node %s, API server %s",
            self.target.describe(),
            self.node,
            api.health.server,
        )
        if self._latest is not None:
            self.observe(self._latest)
        self._hand_events()
        self._hand_reset_info()
        try:
            async with anyio.create_task_group() as tasks:
                for feature in features:
                    tasks.start_soon(_guarded, feature, api, name=f"cluster {type(feature).__name__}")
                await anyio.sleep_forever()  # the client stays open for what asks through it
        finally:
            await api.close()
