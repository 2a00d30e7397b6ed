"""The reconciler: events wake it; it discovers the chips, derives what the kubelet must be told, and applies
the difference: to one :class:`~ascend_agent.kubelet.deviceplugin.plugins.DevicePlugins` set (a plugin per
resource), or to the DRA driver in its place, to the cluster side and to the CDI spec.

``process.run_agent`` builds the parts and hands them in; everything runs in one anyio task group (the
inotify watches, the health timer, the HTTP endpoint, the plugins, the cluster side), so no task outlives the
agent::

    agent = Agent(settings, backend, source, cluster=side, holdings=holdings, plugins=plugins)
    async with anyio.create_task_group() as tg:
        tg.start_soon(agent.run)
        ...
        tg.cancel_scope.cancel()      # SIGTERM: every plugin stops serving and removes its sockets
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from ascend_agent import cdi
from ascend_agent.backends import Backend, Successor, backend_for
from ascend_agent.backends.vnpu_keeper import VnpuLayoutKeeper
from ascend_agent.cluster.credentials import node_name
from ascend_agent.config import PLUGIN_WATCHER_REGISTRATION, ConfigError, Settings, SettingsSource
from ascend_agent.health.grading import FaultGrading
from ascend_agent.health.pipeline import HealthPipeline
from ascend_agent.health.separation import ManualSeparation
from ascend_agent.kubelet.deviceplugin.kubelet import KUBELET_SOCKET
from ascend_agent.kubelet.deviceplugin.plugins import DevicePlugins
from ascend_agent.kubelet.deviceplugin.transport import is_socket_name
from ascend_agent.kubelet.dirs import waiting_reason
from ascend_agent.kubelet.handed_out import HANDED_OUT_FILE
from ascend_agent.kubelet.holders import Holdings
from ascend_agent.kubelet.podresources import PodHolders
from ascend_agent.live_settings import SettingsChange, log_configuration
from ascend_agent.model import Inventory
from ascend_agent.observability import (
    KUBELET_RESTARTS,
    configure_logging,
    label_devices_with_holders,
    label_series_with_node,
    serve_json,
)
from ascend_agent.observability.chipstate import CHIPS_PATH, chip_states
from ascend_agent.observability.endpoint import HttpEndpoint
from ascend_agent.observability.npu_exporter import use_npu_exporter_names
from ascend_agent.observability.report import InventoryReport, chip_series
from ascend_agent.watch import Change, Watcher, WatchEvent

if TYPE_CHECKING:
    from ascend_agent.cluster.side import ClusterSide
    from ascend_agent.health.hotreset.manager import HotReset
    from ascend_agent.kubelet.dra import DraDriver
    from ascend_agent.kubelet.mounted import MountedChips

log = logging.getLogger(__name__)

_KUBELET_TAG = "kubelet"
_ENDPOINTS_TAG = "endpoints"
_BACKEND_TAG = "backend"
_CONFIG_TAG = "config"
# At most one config reload per this many seconds: a burst of SIGHUPs makes two, not one per signal.
_RELOAD_SPACING = 1.0
# The cluster side starts this long after the agent at the latest, registered or not.
_CLUSTER_START_WAIT = 2.0


class Agent:
    """Keeps the kubelet's view of the chips (device plugins or the DRA driver) as the backend reports."""

    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        source: SettingsSource | None = None,
        *,
        cluster: ClusterSide | None = None,
        separation: ManualSeparation | None = None,
        holdings: Holdings | None = None,
        plugins: DevicePlugins | None = None,
        dra: DraDriver | None = None,
        mounted: MountedChips | None = None,
        vnpu: VnpuLayoutKeeper | None = None,
        grading: FaultGrading | None = None,
        make_resets: Callable[[Settings], HotReset] | None = None,
    ) -> None:
        """The parts default to what a device-plugin agent without a cluster side needs. ``dra`` serves in
        place of ``plugins``; ``mounted`` (``--volcano``) wakes the agent when the chips the pods got
        changed; ``make_resets`` makes the hot reset once ``hotReset`` is on (none by default)."""
        self.settings = settings
        self.backend = backend
        # Before the HTTP endpoint opens: every scrape names the node.
        label_series_with_node(node_name(settings.node_name))
        use_npu_exporter_names(settings.npu_exporter_metrics)
        self.cluster = cluster
        self.health = HealthPipeline(
            settings, grading=grading, separation=separation, make_resets=make_resets, wake=self.wake
        )
        self.separation = self.health.separation
        self.holdings = holdings or Holdings(
            PodHolders(settings.pod_resources_socket, backend.health_interval or settings.health_interval)
        )
        self.plugins = plugins or DevicePlugins(settings, on_allocated=self.holdings.allocated)
        self.dra = dra
        self.vnpu = vnpu or VnpuLayoutKeeper(self.holdings.held_devices)
        self.vnpu.on_ran = self.wake
        if mounted is not None:  # which chip each of the kubelet's IDs shows changed
            mounted.on_change = self._wake_if_any_unhealthy
            self.holdings.pods.on_change = self._wake_if_any_unhealthy
        self._registered = anyio.Event()
        self.plugins.on_registered = self._registered.set
        if dra is not None:
            dra.plugin.on_registered = self._registered.set
        self.endpoint = HttpEndpoint(settings.metrics_address, self.ready, self.health_detail)
        self.report = InventoryReport(
            self.holdings.by_chip,
            lambda: self.settings.replicas,
            claim_driver=settings.dra_driver_name if dra is not None else None,
        )
        self.cdi = cdi.SpecWriter()
        self._source = source
        self._wakeup = anyio.Event()
        self._reload = False
        self._last_reload = -math.inf
        self._tasks: TaskGroup | None = None
        self._standby: str | None = None
        self._missing: Path | None = None
        self._watching: list[anyio.CancelScope] = []

    @property
    def inventory(self) -> Inventory:
        """The last inventory reconciled."""
        return self.report.last

    def wake(self) -> None:
        """Ask for a reconcile soon; any number of calls before it runs make one reconcile."""
        self._wakeup.set()

    def _wake_if_any_unhealthy(self) -> None:
        """--volcano: which chip each ID shows changed. While every chip is Healthy every ID shows Healthy
        whatever the mapping, so nothing the kubelet sees changes and a reconcile per Allocate is saved; the
        next health change reconciles with the mapping of then."""
        if any(not chip.healthy for chip in self.inventory.chips):
            self.wake()

    def reload(self) -> None:
        """Re-read the config file and apply it (SIGHUP, or the file changed)."""
        self._reload = True
        self.wake()

    @property
    def side_by_side(self) -> bool:
        """Whether this agent serves beside another instance instead of waiting for it to stop: a DRA driver
        that knows its pod's UID (a rolling update's two pods each serve sockets of their own)."""
        return self.dra is not None and self.dra.side_by_side

    def standby(self, holder: str) -> None:
        """Another agent holds the node: until it stops, this one is ready as a standby, so that a rolling
        update with ``maxSurge`` (which waits for the new pod to be ready) lets the old pod go."""
        self._standby = holder

    def waiting_for(self, directory: Path | None) -> None:
        """The kubelet's ``directory`` is missing and waited for (None: no more): ``/readyz`` says so."""
        self._missing = directory

    def ready(self) -> tuple[bool, str]:
        """``/readyz``: every resource with chips registered, and its kubelet stream open, and npu-smi not
        down; or standing by."""
        if self._missing is not None:
            return False, waiting_reason(self._missing)
        if self._standby is not None:
            return True, f"standby: the ascend-agent with pid {self._standby} holds this node until it stops"
        ready, reason = self._serving()
        outage = self.inventory.outage
        if outage:
            return False, f"{outage}; {reason}" if reason and not ready else outage
        return ready, reason

    def chip_states(self) -> dict[str, Any]:
        """``/chips``: each chip's health and hold, and npu-smi's state, as only this process knows them."""
        hold = self.health.hold
        return chip_states(self.inventory, hold.release_in, hold.reason(), now=time.time())

    def _serving(self) -> tuple[bool, str]:
        if self.dra is not None:
            return self.dra.status()
        if not self.plugins.serving:
            return False, "; ".join(self.inventory.problems) or "no chips found"
        reasons = self.plugins.status()
        if self.cdi.problem:  # Allocate would name CDI devices that no spec defines
            reasons.append(self.cdi.problem)
        return (False, "; ".join(sorted(reasons))) if reasons else (True, "")

    def health_detail(self) -> str:
        """What ``/healthz`` adds to ``ok``: the Kubernetes API state while the cluster side is on."""
        return "" if self.cluster is None else f"kubernetes api: {self.cluster.state().detail}"

    async def run(self) -> None:
        """Reconcile on every wake-up until cancelled; then every plugin stops serving."""
        self._standby = None
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                await tasks.start(self.endpoint.run, name="http")
                if self.dra is None:  # read before the first Allocate, written after each
                    where = self.settings.effective_plugin_dir / HANDED_OUT_FILE
                    await tasks.start(self.holdings.handed_out.keep, where, name="handed out")
                await tasks.start(self.plugins.run, name="plugins")
                if self.cluster is not None:
                    tasks.start_soon(self._run_cluster, name="cluster")
                if self.dra is not None:
                    tasks.start_soon(self.dra.run, name="dra")
                label_devices_with_holders(self.report.holder_of, claims=self.dra is not None)
                serve_json(CHIPS_PATH, self.chip_states)
                tasks.start_soon(self.holdings.pods.run, name="pod resources")
                if self.health.resets is not None:
                    tasks.start_soon(self.health.resets.run, name="hot reset")
                await self.backend.query()
                self._start_watching()
                while True:
                    self._wakeup = anyio.Event()
                    if self._reload:
                        # Reloads asked for in a burst (SIGHUPs in a loop) make one more, after the spacing.
                        await anyio.sleep(
                            max(0.0, self._last_reload + _RELOAD_SPACING - anyio.current_time())
                        )
                        self._reload = False
                        self._last_reload = anyio.current_time()
                        await self._apply_config()
                        await self.vnpu.apply(self.backend, self.settings, fresh=True)
                    await self.reconcile()
                    # A held chip comes back once quiet, and a failed CDI write is tried again, with no event
                    # to say so: look again then.
                    with anyio.move_on_after(self._next_look()):
                        await self._wakeup.wait()
        finally:
            self._tasks = None
            with anyio.CancelScope(shield=True):
                await self.backend.close()

    def _next_look(self) -> float | None:
        times = (self.health.hold.seconds_to_release(), self.cdi.seconds_to_retry())
        return min((s for s in times if s is not None and s != math.inf), default=None)

    # events in ---------------------------------------------------------------------------------------------
    def _start_watching(self) -> None:
        """(Re)start the inotify watches and the health timer for the current settings and backend."""
        assert self._tasks is not None
        for old in self._watching:
            old.cancel()
        self._watching = [anyio.CancelScope(), anyio.CancelScope()]
        watcher = Watcher()
        watcher.watch(self.settings.kubelet_dir, _KUBELET_TAG, is_socket_name)
        endpoints = {self.settings.endpoint_dir}
        if self.settings.registration == PLUGIN_WATCHER_REGISTRATION:
            endpoints.add(self.settings.effective_plugins_registry_dir)
        if self.dra is not None:
            endpoints.update(self.dra.socket_dirs)
        for directory in sorted(endpoints - {self.settings.kubelet_dir}):
            watcher.watch(directory, _ENDPOINTS_TAG, is_socket_name)
        for directory, accept in self.backend.watch_paths():
            watcher.watch(directory, _BACKEND_TAG, accept)
        if self._source is not None and self._source.config_file is not None:
            watcher.watch_file(self._source.config_file, _CONFIG_TAG)
        self._tasks.start_soon(self._follow, watcher, self._watching[0], name="watch")
        interval = self.backend.health_interval
        if interval is not None:
            self._tasks.start_soon(self._health_timer, interval, self._watching[1], name="health")

    async def _follow(self, watcher: Watcher, scope: anyio.CancelScope) -> None:
        with scope:
            try:
                while True:
                    for event in await watcher.next_batch():
                        self._on_event(event)
            finally:
                watcher.close()

    def _on_event(self, event: WatchEvent) -> None:
        log.debug("inotify: %s %s %s", event.tag, event.name, event.change.value)
        if event.tag in (_KUBELET_TAG, _ENDPOINTS_TAG):
            if event.tag == _KUBELET_TAG and event.name == KUBELET_SOCKET and event.change is Change.CREATED:
                KUBELET_RESTARTS.inc()
            self.plugins.poke()
            if self.dra is not None:
                self.dra.poke()
        elif event.tag == _CONFIG_TAG:
            if event.change is not Change.DELETED:
                self.reload()
        else:
            self.wake()

    async def _health_timer(self, interval: float, scope: anyio.CancelScope) -> None:
        """The one timer: hardware health has no event source. It runs beside the reconcile loop, so a slow
        npu-smi never delays a re-registration, and it outlives any error of one query."""
        with scope:
            while True:
                await anyio.sleep(interval)
                try:
                    changed = await self.backend.query()
                    if self.vnpu.pending:  # a vNPU the layout would destroy may be free now
                        await self.vnpu.apply(self.backend, self.settings, fresh=True, quiet=True)
                except Exception as exc:  # a backend bug must not end health checking for good
                    log.error(
                        "Health query failed unexpectedly (%s: %s); trying again in %g s",
                        type(exc).__name__,
                        exc,
                        interval,
                    )
                    continue
                if changed:
                    self.wake()

    async def _run_cluster(self) -> None:
        """The cluster side, once the kubelet registered a resource (loading the client library meanwhile
        would delay that registration) or after a few seconds without."""
        assert self.cluster is not None
        with anyio.move_on_after(_CLUSTER_START_WAIT):
            await self._registered.wait()
        await self.cluster.run()

    # configuration ----------------------------------------------------------------------------------------
    async def _apply_config(self) -> None:
        assert self._source is not None
        try:
            effective = self._source.load_effective()
        except ConfigError as exc:
            log.error("Config not applied, keeping the running settings: %s", exc)
            return
        settings = effective.settings
        if settings == self.settings:
            log.info("Config re-read: nothing changed")
            return
        change = SettingsChange(self.settings, settings)
        if change.new_backend:
            try:
                backend = backend_for(settings)
                await backend.start()
            except ConfigError as exc:
                log.error("Config not applied, keeping the running settings: %s", exc)
                return
            if isinstance(backend, Successor):
                backend.take_over(self.backend)
            await self.backend.close()
            self.backend = backend
            await backend.query()
        configure_logging(settings.log_level, settings.log_format)
        made = self.health.configure(settings)
        if made is not None and self._tasks is not None:  # hotReset turned on by this reload
            self._tasks.start_soon(made.run, name="hot reset")
        if settings.metrics_address != self.settings.metrics_address and not await self.endpoint.move(
            settings.metrics_address
        ):
            settings = replace(settings, metrics_address=self.settings.metrics_address)
        self.plugins.configure(settings, serve_again=change.serve_again)
        if settings.cdi_spec_dir != self.settings.cdi_spec_dir:
            self.cdi.moved(self.settings.cdi_spec_dir)
        self.holdings.pods.socket = settings.pod_resources_socket
        change.warn()
        self.settings = settings
        label_series_with_node(node_name(settings.node_name))
        use_npu_exporter_names(settings.npu_exporter_metrics)
        if self.cluster is not None:
            self.cluster.settings = settings
        self._start_watching()
        log.info("Config applied: %s changed", ", ".join(change.changed))
        log_configuration(replace(effective, settings=settings))
        self._reload_if_edited_since(effective.settings)

    def _reload_if_edited_since(self, loaded: Settings) -> None:
        """The file watch was made again after the file was read: an edit in between was in no event (two
        quick edits, the first restarting the backend). Read the file again and reload if it changed."""
        assert self._source is not None
        try:
            edited = self._source.load() != loaded
        except ConfigError:  # the reload says what is wrong with it
            edited = True
        if edited:
            self.reload()

    # reconciling ------------------------------------------------------------------------------------------
    async def reconcile(self) -> None:
        """Discover, then make what the kubelet, the cluster side and the CDI spec are told match."""
        inventory = self.health.apply(await self.backend.discover())
        self.report.inventory(inventory)
        chip_series(inventory)
        if self.dra is not None:
            # The device gauges under the driver's name: a DRA node's chips on the same boards and alerts.
            self.report.count({self.settings.dra_driver_name: inventory.chips}, inventory.vnpus)
            self.dra.publish(inventory, self.backend)
            if self.cluster is not None:
                self.cluster.observe(inventory)
            return
        desired = inventory.by_advertised_resource(self.settings.replicas, self.settings.rename_shared)
        self.report.count(desired, inventory.vnpus)
        self.plugins.publish(
            desired, replace(inventory.container, cdi=self.settings.cdi_spec_dir is not None)
        )
        if self.cluster is not None:
            self.cluster.observe(inventory)
        await self.cdi.write(self.settings.cdi_spec_dir, inventory)
