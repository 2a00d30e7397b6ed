"""The reconciler: events wake it; it discovers the chips, derives what each resource must advertise, and
publishes that to one :class:`~ascend_agent.deviceplugin.lifecycle.ResourcePlugin` per resource.

Everything runs in one anyio task group: the inotify watcher, the health timer, the HTTP endpoint and every
resource's lifecycle, so no task outlives the agent::

    agent = Agent(settings, backend, source)
    async with anyio.create_task_group() as tg:
        tg.start_soon(agent.run)
        ...
        tg.cancel_scope.cancel()      # SIGTERM: every plugin stops serving and removes its sockets
"""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from ascend_agent import cdi, naming
from ascend_agent.allocation import preferred, topology_for
from ascend_agent.backends import Backend, VnpuLayoutBackend, backend_for
from ascend_agent.backoff import Backoff
from ascend_agent.chipstate import CHIPS_PATH, chip_states
from ascend_agent.config import (
    DRA_API,
    PLUGIN_WATCHER_REGISTRATION,
    ConfigError,
    EffectiveSettings,
    Settings,
    SettingsSource,
)
from ascend_agent.deviceplugin.kubelet import KUBELET_SOCKET
from ascend_agent.deviceplugin.lifecycle import ResourcePlugin
from ascend_agent.flaphold import ChipHold
from ascend_agent.grading import FaultGrading
from ascend_agent.handed_out import HandedOut
from ascend_agent.hotreset import HotReset
from ascend_agent.kubelet_dirs import waiting_reason
from ascend_agent.kubelet_view import MountedChips
from ascend_agent.model import Chip, Health, Inventory
from ascend_agent.observability import (
    CHIP_TRAINING,
    DEVICE_HEALTH,
    DEVICES,
    KUBELET_RESTARTS,
    VNPU_AICORES,
    VNPU_MEMORY,
    configure_logging,
    label_devices_with_holders,
    log_fields,
    serve_http,
    serve_json,
)
from ascend_agent.podresources import Holders, PodHolders, holder_labels
from ascend_agent.separation import ManualSeparation
from ascend_agent.vnpu_layout import ChipPlan, HeldDevices, Layout, LayoutRefused, dynamic_entries
from ascend_agent.watch import Change, Watcher, WatchEvent

if TYPE_CHECKING:
    from ascend_agent.cluster import VolcanoRemapper
    from ascend_agent.cluster.side import ClusterSide
    from ascend_agent.dra import DraDriver

log = logging.getLogger(__name__)

_KUBELET_TAG = "kubelet"
_ENDPOINTS_TAG = "endpoints"
_BACKEND_TAG = "backend"
_CONFIG_TAG = "config"
# At most one config reload per this many seconds: a burst of SIGHUPs makes two, not one per signal.
_RELOAD_SPACING = 1.0
# Writing the CDI spec is tried again after these many seconds, doubling up to the cap, until it works.
_CDI_RETRY_START = 1.0
_CDI_RETRY_CAP = 60.0
# The cluster side starts this long after the agent at the latest, registered or not.
_CLUSTER_START_WAIT = 2.0
# The cluster side is set up once, at start.
_CLUSTER_SETTINGS = ("cluster", "kubeconfig", "node_name", "api_list_limit_mib", "volcano_scheduler_name")
# Device plugin or DRA driver, and the DRA driver's settings: chosen once, at start.
_KUBELET_API_SETTINGS = (
    "kubelet_api",
    "dra_driver_name",
    "dra_taint_effect",
    "dra_fault_taints",
    "dra_cleanup",
)
# The hot reset's limits, applied by it live (hotReset itself starts a new backend, which reads more then).
_HOT_RESET_SETTINGS = ("hot_reset_idle", "hot_reset_timeout", "hot_reset_recover", "hot_reset_limit",
                       "hot_reset_window")  # fmt: skip
# Settings the agent applies itself; a change to any other one means a new backend.
_AGENT_SETTINGS = frozenset(
    {
        "kubelet_dir",
        "registration",
        "plugins_registry_dir",
        "plugin_dir",
        "replicas",
        "rename_shared",
        "fail_requests_greater_than_one",
        "flap_threshold",
        "flap_window",
        "flap_quiet",
        "fault_policy",
        "serve_timeout",
        "cdi_spec_dir",
        "metrics_address",
        "log_level",
        "log_format",
        "vnpu",
        *_HOT_RESET_SETTINGS,
        *_CLUSTER_SETTINGS,
        "pod_resources_socket",
        *_KUBELET_API_SETTINGS,
    }
)
# Seconds between tries to serve the HTTP endpoint on an address another process holds.
_HTTP_RETRY_FIRST = 1.0
_HTTP_RETRY_MOST = 10.0
# Settings that decide where and how each resource is served: a change re-serves every resource.
_SERVING_SETTINGS = frozenset({"kubelet_dir", "registration", "plugins_registry_dir", "plugin_dir"})


class _Shown(enum.Enum):
    """Whose health a chip shows: its own, the flap hold's, or none known (npu-smi down)."""

    OWN = "own"
    HELD = "held"
    UNKNOWN = "unknown"


@dataclass(slots=True)
class _Running:
    plugin: ResourcePlugin
    scope: anyio.CancelScope


class Agent:
    """Keeps one ResourcePlugin per resource with chips, published with what the backend reports."""

    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        source: SettingsSource | None = None,
        cluster: ClusterSide | None = None,
        separation: ManualSeparation | None = None,
        mounted: MountedChips | None = None,
        held_devices: HeldDevices | None = None,
        grading: FaultGrading | None = None,
    ) -> None:
        """``held_devices`` says which device IDs containers hold now, None while that is unknown: by
        default the kubelet's PodResources view (:attr:`holders`) and what Allocate handed over that it has
        not shown freed yet (:attr:`handed_out`). The vNPU layout never destroys a held vNPU nor splits a
        chip held whole."""
        self.settings = settings
        self.cluster = cluster
        # Chips an admin separates in the device-info ConfigMap: the cluster side sets them, Unhealthy here.
        self.separation = separation or ManualSeparation()
        self.separation.on_change = self.wake
        # The fault table grading each chip's codes: built in, or the cluster side's mindx-dl-fault-config.
        self.grading = grading or FaultGrading.builtin(settings.fault_policy)
        self.grading.on_change = self.wake
        # --volcano: (resource, the kubelet's IDs per container) -> the chips Volcano chose.
        self.device_ids_for: VolcanoRemapper | None = None
        # --volcano: the kubelet's view of which pod holds which chip, by the chips really mounted.
        self.follow_mounted: Callable[[Holders], Holders] | None = None
        self._registered = anyio.Event()
        self.holders = PodHolders(
            settings.pod_resources_socket, backend.health_interval or settings.health_interval
        )
        # --volcano: the chips each pod got under the kubelet's IDs; the kubelet sees their health there.
        self.mounted = mounted
        if mounted is not None:
            mounted.on_change = self._wake_if_any_unhealthy
            mounted.kubelet_holders = lambda: self.holders.holders
            self.holders.on_change = self._wake_if_any_unhealthy
        # What Allocate handed over, held until PodResources shows it freed (the vNPU layout reads it).
        self.handed_out = HandedOut()
        self.holders.on_answer = self._observe_holders
        self.held_devices: HeldDevices = held_devices or self._held_by_pods
        self._vnpu_pending = False
        self._vnpu_refused: tuple[str, ...] = ()
        self._vnpu_ignored: Layout | None = None
        self.backend = backend
        self._source = source
        self._plugins: dict[str, _Running] = {}
        self._wakeup = anyio.Event()
        self._reload = False
        self._last_reload = -math.inf
        self._cdi_problem = ""
        self._cdi_backoff = Backoff(_CDI_RETRY_START, _CDI_RETRY_CAP, jitter=False)
        self._cdi_retrying = False
        self._known_chips: set[str] = set()
        self._health: dict[str, tuple[Health, _Shown, str]] = {}
        self._problems: tuple[str, ...] = ()
        self.inventory = Inventory()
        self._cdi_document: dict[str, Any] | None = None
        self._tasks: TaskGroup | None = None
        self._standby: str | None = None
        self._missing: Path | None = None
        self._hold = ChipHold(settings.flap_threshold, settings.flap_window, settings.flap_quiet)
        self.resets = HotReset(
            settings,
            resetter=lambda: self.backend,
            held=self._held_by_pods,
            refresh_holders=self.holders.refresh,
            wake=self.wake,
            note=cluster.event if cluster is not None else None,
            manual_resets=cluster.reset_info if cluster is not None else None,
        )
        self._watching: list[anyio.CancelScope] = []
        self._http_scope = anyio.CancelScope()
        self._dra: DraDriver | None = None
        if settings.kubelet_api == DRA_API:  # the DRA driver in place of the device plugins
            from ascend_agent.dra import DraDriver

            self._dra = DraDriver.open(settings, cluster)
            self._dra.plugin.on_registered = self._registered.set

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
        return self._dra is not None and self._dra.side_by_side

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
        hold = self._hold
        return chip_states(self.inventory, hold.release_in, hold.reason(), now=time.time())

    def _serving(self) -> tuple[bool, str]:
        if self._dra is not None:
            return self._dra.status()
        if not self._plugins:
            return False, "; ".join(self.inventory.problems) or "no chips found"
        reasons = [
            reason for ready, reason in (r.plugin.status() for r in self._plugins.values()) if not ready
        ]
        if self._cdi_problem:  # Allocate would name CDI devices that no spec defines
            reasons.append(self._cdi_problem)
        return (False, "; ".join(sorted(reasons))) if reasons else (True, "")

    def health_detail(self) -> str:
        """What ``/healthz`` adds to ``ok``: the Kubernetes API state while the cluster side is on."""
        return "" if self.cluster is None else f"kubernetes api: {self.cluster.state().detail}"

    async def run(self, http: asyncio.Server | None = None) -> None:
        """Reconcile on every wake-up until cancelled; then every plugin stops serving."""
        self._standby = None
        try:
            async with anyio.create_task_group() as tasks:
                self._tasks = tasks
                if http is not None:
                    self._serve_http(http)
                elif self.settings.metrics_address:
                    self._serve_http_when_free(self.settings.metrics_address)
                if self.cluster is not None:
                    tasks.start_soon(self._run_cluster, name="cluster")
                if self._dra is not None:
                    tasks.start_soon(self._dra.run, name="dra")
                label_devices_with_holders(self._holder_of, claims=self._dra is not None)
                serve_json(CHIPS_PATH, self.chip_states)
                tasks.start_soon(self.holders.run, name="pod resources")
                tasks.start_soon(self.resets.run, name="hot reset")
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
                        await self.apply_vnpu_layout(fresh=True)
                    await self.reconcile()
                    # A held chip comes back once quiet, with no event to say so: look again then.
                    with anyio.move_on_after(self._hold.seconds_to_release()):
                        await self._wakeup.wait()
        finally:
            self._tasks = None
            with anyio.CancelScope(shield=True):
                await self.backend.close()

    # the tasks it owns ------------------------------------------------------------------------------------
    def _start_watching(self) -> None:
        """(Re)start the inotify watches and the health timer for the current settings and backend."""
        assert self._tasks is not None
        for old in self._watching:
            old.cancel()
        self._watching = [anyio.CancelScope(), anyio.CancelScope()]
        watcher = Watcher()
        watcher.watch(self.settings.kubelet_dir, _KUBELET_TAG, lambda name: name.endswith(".sock"))
        endpoints = {self.settings.endpoint_dir}
        if self.settings.registration == PLUGIN_WATCHER_REGISTRATION:
            endpoints.add(self.settings.effective_plugins_registry_dir)
        if self._dra is not None:
            endpoints.update(self._dra.socket_dirs)
        for directory in sorted(endpoints - {self.settings.kubelet_dir}):
            watcher.watch(directory, _ENDPOINTS_TAG, lambda name: name.endswith(".sock"))
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
            for running in self._plugins.values():
                running.plugin.poke()
            if self._dra is not None:
                self._dra.poke()
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
                    if self._vnpu_pending:  # a vNPU the layout would destroy may be free now
                        await self.apply_vnpu_layout(fresh=True, quiet=True)
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

    def _serve_http_when_free(self, address: str) -> None:
        """Serve the HTTP endpoint on ``address`` once nothing else holds it (the agent that stopped before
        this one took over, say): the kubelet path never waits for it."""
        assert self._tasks is not None
        self._http_scope.cancel()
        scope = self._http_scope = anyio.CancelScope()

        async def retry() -> None:
            delay = 0.0
            with scope:
                while True:
                    await anyio.sleep(delay)
                    try:
                        server = await serve_http(address, self.ready, self.health_detail)
                    except OSError as exc:
                        if exc.errno != errno.EADDRINUSE:
                            log.error("Cannot serve /metrics on %s: %s", address, exc.strerror or exc)
                            return
                        delay = min(max(2 * delay, _HTTP_RETRY_FIRST), _HTTP_RETRY_MOST)
                        continue
                    log.info("Serving /metrics, /healthz and /readyz on %s", address)
                    break
            if not scope.cancel_called:
                self._serve_http(server)
            else:
                server.close()

        self._tasks.start_soon(retry, name="http retry")

    async def _run_cluster(self) -> None:
        """The cluster side, once the kubelet registered a resource (loading the client library meanwhile
        would delay that registration) or after a few seconds without."""
        assert self.cluster is not None
        with anyio.move_on_after(_CLUSTER_START_WAIT):
            await self._registered.wait()
        await self.cluster.run()

    def _serve_http(self, server: asyncio.Server) -> None:
        assert self._tasks is not None
        self._http_scope.cancel()
        scope = self._http_scope = anyio.CancelScope()

        async def hold() -> None:
            with scope:
                try:
                    await anyio.sleep_forever()
                finally:
                    server.close()

        self._tasks.start_soon(hold, name="http")

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
        changed = sorted(
            f.name for f in fields(Settings) if getattr(settings, f.name) != getattr(self.settings, f.name)
        )
        if set(changed) - _AGENT_SETTINGS:
            try:
                backend = backend_for(settings)
                await backend.start()
            except ConfigError as exc:
                log.error("Config not applied, keeping the running settings: %s", exc)
                return
            await self.backend.close()
            self.backend = backend
            await backend.query()
        configure_logging(settings.log_level, settings.log_format)
        self._hold.configure(settings.flap_threshold, settings.flap_window, settings.flap_quiet)
        self.resets.configure(settings)
        self.grading.configure(dict(settings.fault_policy))
        if settings.metrics_address != self.settings.metrics_address and not await self._move_http(
            settings.metrics_address
        ):
            settings = replace(settings, metrics_address=self.settings.metrics_address)
        for running in self._plugins.values():
            running.plugin.set_serve_timeout(settings.serve_timeout)
        if settings.cdi_spec_dir != self.settings.cdi_spec_dir and self.settings.cdi_spec_dir is not None:
            cdi.remove_spec(self.settings.cdi_spec_dir)
            self._cdi_problem = ""
            self._cdi_document = None
        if set(changed) & set(_CLUSTER_SETTINGS):
            log.warning(
                "%s changed: the cluster side takes it at the next start",
                ", ".join(sorted(set(changed) & set(_CLUSTER_SETTINGS))),
            )
        self.holders.socket = settings.pod_resources_socket
        if set(changed) & set(_KUBELET_API_SETTINGS):
            log.warning(
                "%s changed: device plugin or DRA driver, and the driver's settings, apply at the next start",
                ", ".join(sorted(set(changed) & set(_KUBELET_API_SETTINGS))),
            )
        if dynamic_entries(settings.vnpu) != dynamic_entries(self.settings.vnpu):
            log.warning(
                "vnpu: which chips are dynamic changes when the backend starts again (the next start)"
            )
        if set(changed) & _SERVING_SETTINGS:
            for resource in list(self._plugins):
                self._stop_plugin(resource)
        if settings.effective_plugin_dir != self.settings.effective_plugin_dir:
            log.warning(
                "pluginDir changed: the instance lock stays in %s until the agent restarts",
                self.settings.effective_plugin_dir,
            )
        self.settings = settings
        if self.cluster is not None:
            self.cluster.settings = settings
        self._start_watching()
        log.info("Config applied: %s changed", ", ".join(changed))
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

    async def _move_http(self, address: str) -> bool:
        """Serve the HTTP endpoint on ``address`` instead; False (and the old one kept) when it cannot."""
        if not address:
            self._http_scope.cancel()
            log.info("Stopped serving /metrics, /healthz and /readyz")
            return True
        try:
            server = await serve_http(address, self.ready, self.health_detail)
        except OSError as exc:
            log.error(
                "Cannot serve /metrics on %s, keeping the old address: %s", address, exc.strerror or exc
            )
            return False
        self._serve_http(server)
        log.info("Serving /metrics, /healthz and /readyz on %s", address)
        return True

    # vNPUs ------------------------------------------------------------------------------------------------
    def _allocated(self, resource: str, device_ids: Sequence[str]) -> None:
        self.handed_out.record(resource, device_ids)
        self.holders.poke()

    def _by_chip(self, holders: Holders) -> Holders:
        """PodResources' holders by the devices really handed over: with ``--volcano`` the chips mounted,
        not the kubelet's IDs (what Allocate recorded in :attr:`handed_out` too)."""
        return self.follow_mounted(holders) if self.follow_mounted is not None else holders

    def _observe_holders(self, holders: Holders, asked_at: float) -> None:
        self.handed_out.observe(self._by_chip(holders).by_device.keys(), asked_at)

    def _held_by_pods(self) -> frozenset[str] | None:
        """The device IDs pods hold, as PodResources last said, and what Allocate handed over that it has
        not shown freed yet; None while PodResources does not answer."""
        if self.holders.error is not None:
            return None
        listed = frozenset(device_id for _, device_id in self._by_chip(self.holders.holders).by_device)
        return listed | self.handed_out.device_ids()

    async def apply_vnpu_layout(self, *, fresh: bool = False, quiet: bool = False) -> tuple[ChipPlan, ...]:
        """Make the chips hold the ``vnpu:`` layout (at start, on reload, and each health interval while a
        vNPU it would destroy is held or a chip's vNPUs could not be read); with ``fresh``, npu-smi is asked
        for the vNPUs again first even without a layout (SIGHUP). A refused layout is logged once and
        nothing runs (at start, ``process.run_agent`` refuses it before: exit status 2); ``quiet`` leaves out
        the line that says nothing needed to run."""
        backend = self.backend
        layout = self.settings.vnpu
        if not isinstance(backend, VnpuLayoutBackend):
            if layout is not None and layout != self._vnpu_ignored:
                log.warning(
                    "vnpu: the %s backend does not create vNPUs, so the vnpu: layout is ignored (the fake "
                    "backend splits chips with --fake-vnpus 0:vir02,0:vir02)",
                    self.settings.backend,
                )
            self._vnpu_ignored = layout
            return ()
        if fresh:
            backend.forget_vnpus()
        if layout is None:
            self._vnpu_pending = False
            return ()
        try:
            plans = await backend.apply_vnpu_layout(layout, self.held_devices, run=True)
        except LayoutRefused as exc:
            plans = ()
            refused: tuple[str, ...] = (str(exc),)
        else:
            refused = tuple(plan.refused for plan in plans if plan.refused)
        if refused != self._vnpu_refused:
            for line in refused:
                log.error("%s", line)
            self._vnpu_refused = refused
        # A chip npu-smi could not read is asked again at the next health interval; a layout the chips
        # cannot hold waits for a reload.
        by_layout = any(plan.refused and not plan.unread for plan in plans)
        self._vnpu_pending = not by_layout and any(
            plan.in_use or plan.waiting or plan.unread for plan in plans
        )
        commands = sum(len(plan.commands()) for plan in plans)
        if commands:
            log.info("vnpu: layout applied with %d npu-smi commands", commands)
            self.wake()
        elif not refused and not quiet:
            log.info("vnpu: every chip holds its layout; nothing to run")
        return plans

    # reconciling ------------------------------------------------------------------------------------------
    async def reconcile(self) -> None:
        """Discover, then make the plugins and what they advertise match."""
        inventory = self.grading.apply(await self.backend.discover())
        self.resets.observe(inventory, self.separation.ids)
        inventory = replace(inventory, chips=self._hold.apply(inventory.chips))
        # The admin's separation over the chips' own health, the flap hold included.
        inventory = self.separation.apply(inventory)
        inventory = self.resets.apply(inventory)
        inventory = replace(inventory, vnpus=_follow_chips(inventory.chips, inventory.vnpus))
        self.inventory = inventory
        self._report(inventory)
        if self._dra is not None:
            self._dra.publish(inventory, self.backend)
            if self.cluster is not None:
                self.cluster.observe(inventory)
            return
        settings = self.settings
        desired = inventory.by_advertised_resource(settings.replicas, settings.rename_shared)
        self._count(desired)
        _count_vnpus(inventory.vnpus)
        container = replace(inventory.container, cdi=self.settings.cdi_spec_dir is not None)
        for resource in [r for r in self._plugins if r not in desired]:
            log.info("No more chips for %s; stopping its server", resource)
            self._stop_plugin(resource)
        for resource, chips in desired.items():
            running = self._plugins.get(resource) or self._start_plugin(resource)
            # A vNPU is isolated by the driver and handed out once: replicas share whole chips only.
            replicas = 1 if any(chip.vnpu is not None for chip in chips) else settings.replicas
            # failRequestsGreaterThanOne: a container gets one replica of a shared chip at most.
            most = 1 if replicas > 1 and settings.fail_requests_greater_than_one else None
            devices = {
                device_id: chip
                for chip in chips
                for device_id in naming.replica_ids(chip.device_id, replicas)
            }
            running.plugin.publish(
                devices,
                partial(preferred, topology_for(chips, replicas)),
                container,
                most_per_container=most,
                listed=self._listed(resource, devices),
            )
        if self.cluster is not None:
            self.cluster.observe(inventory)
        await self._write_cdi(inventory)

    def _listed(self, resource: str, devices: dict[str, Chip]) -> dict[str, Chip] | None:
        """--volcano: each of the kubelet's IDs with the health of the chip really mounted under it (a chip's
        replicas are not told apart: only whole chips)."""
        if self.mounted is None or self.settings.replicas != 1:
            return None
        return self.mounted.listed(resource, devices, self.holders.holders, self.holders.error is None)

    def _start_plugin(self, resource: str) -> _Running:
        assert self._tasks is not None
        running = self._plugins[resource] = _Running(
            ResourcePlugin(resource, self.settings), anyio.CancelScope()
        )

        async def run() -> None:
            with running.scope:
                await running.plugin.run()

        self._tasks.start_soon(run, name=f"plugin {resource}")
        running.plugin.service.on_allocated = partial(self._allocated, resource)
        if self.device_ids_for is not None:
            running.plugin.service.remap_ids = partial(self.device_ids_for, resource)
        running.plugin.on_registered = self._registered.set
        return running

    def _stop_plugin(self, resource: str) -> None:
        self._plugins.pop(resource).scope.cancel()

    async def _write_cdi(self, inventory: Inventory) -> None:
        """Keep the CDI spec in step with the chips. It stays when the agent stops: containers that restart
        while the agent is down resolve their CDI devices from it."""
        directory = self.settings.cdi_spec_dir
        if directory is None or not inventory.chips:
            # No chips at all (npu-smi failing at start, say) must not empty the spec containers rely on.
            return
        document = cdi.build_spec((*inventory.chips, *inventory.vnpus), inventory.container)
        if document == self._cdi_document:
            return
        try:
            path = await cdi.write_spec(directory, document)
        except OSError as exc:
            problem = f"cannot write the CDI spec in {directory}: {exc.strerror or exc}"
            if problem != self._cdi_problem:
                log.error("%s; retrying with back-off", problem[0].upper() + problem[1:])
            self._cdi_problem = problem
            self._retry_cdi()
            return
        self._cdi_problem = ""
        self._cdi_backoff.reset()
        self._cdi_document = document
        log.info("Wrote CDI spec %s with %d devices", path, len(document["devices"]))

    def _retry_cdi(self) -> None:
        """Reconcile again after the back-off: a full or read-only spec directory may be fixed meanwhile."""
        if self._cdi_retrying or self._tasks is None:
            return
        self._cdi_retrying = True
        delay = self._cdi_backoff.next()

        async def retry() -> None:
            await anyio.sleep(delay)
            self._cdi_retrying = False
            self.wake()

        self._tasks.start_soon(retry, name="cdi retry")

    def _report(self, inventory: Inventory) -> None:
        for chip in (*inventory.chips, *inventory.vnpus):
            if chip.device_path not in self._known_chips:
                self._known_chips.add(chip.device_path)
                log.info(
                    "Found device %s",
                    chip.device_path,
                    extra=log_fields(device=chip.device_id, path=chip.device_path),
                )
            before = self._health.get(chip.device_id)
            # A held chip's own flips and a chip whose health is unknown (npu-smi down) are not logged per
            # change: the hold and the outage are logged once each where they start and end.
            shown = _Shown.HELD if chip.held else _Shown.UNKNOWN if chip.health_unknown else _Shown.OWN
            now = (chip.health, shown, chip.reason if shown is _Shown.OWN else "")
            if before == now:
                continue
            self._health[chip.device_id] = now
            if shown is not _Shown.OWN:
                continue
            if chip.health is Health.UNHEALTHY:
                reason = chip.reason or "no reason reported"
                log.warning(
                    "%s is Unhealthy: %s",
                    chip.device_id,
                    reason,
                    extra=log_fields(resource=chip.resource, device=chip.device_id, reason=reason),
                )
            elif before is not None and before[1] is not _Shown.UNKNOWN:
                log.info(
                    "%s is Healthy again",
                    chip.device_id,
                    extra=log_fields(resource=chip.resource, device=chip.device_id),
                )
        if inventory.problems != self._problems:
            for problem in inventory.problems:
                if problem not in self._problems:
                    log.warning("%s", problem)
            self._problems = inventory.problems

    def _holder_of(self, device: str) -> tuple[str, ...]:
        """The (namespace, pod, container) holding a chip or a vNPU, for its metrics, and as a DRA driver the
        claim; comma-joined when its replicas (or several claims) are held by several."""
        inventory = self.inventory
        chip = next((c for c in (*inventory.chips, *inventory.vnpus) if c.device_id == device), None)
        found = self._by_chip(self.holders.holders)
        if self._dra is not None:
            holders = found.of_claimed(self.settings.dra_driver_name, chip) if chip is not None else ()
            return holder_labels(holders, claims=True)
        replicas = 1 if chip is not None and chip.vnpu is not None else self.settings.replicas
        return holder_labels(found.of(chip, replicas) if chip is not None else ())

    def _count(self, desired: dict[str, tuple[Chip, ...]]) -> None:
        DEVICES.clear()
        DEVICE_HEALTH.clear()
        for resource, chips in desired.items():
            for health in Health:
                DEVICES.labels(resource=resource, health=health.value).set(
                    sum(c.health is health for c in chips)
                )
            for chip in chips:
                DEVICE_HEALTH.labels(resource=resource, device=chip.device_id).set(chip.healthy)
        _training_info(chip for chips in desired.values() for chip in chips)


def _training_info(chips: Iterable[Chip]) -> None:
    """``ascend_agent_chip_training_info`` for every chip that has a device IP, vNIC IP or super pod."""
    CHIP_TRAINING.clear()
    for chip in chips:
        pod = chip.super_pod
        if chip.vnpu is not None or (chip.device_ip is None and chip.vnic_ip is None and pod is None):
            continue
        CHIP_TRAINING.labels(
            device=chip.device_id,
            device_ip=chip.device_ip or "",
            vnic_ip=chip.vnic_ip or "",
            super_pod_id="" if pod is None else str(pod.super_pod_id),
            server_index="" if pod is None else str(pod.server_index),
            sdid="" if pod is None else str(pod.sdid),
        ).set(1)


def _follow_chips(chips: Sequence[Chip], parts: Sequence[Chip]) -> tuple[Chip, ...]:
    """The vNPUs of a chip the agent itself made Unhealthy (the flap hold, the admin's separation) are
    Unhealthy with it, held when it is held; they carry its fault class."""
    by_phys = {chip.phys_id: chip for chip in chips}
    followed = []
    for part in parts:
        chip = by_phys.get(part.phys_id)
        if chip is not None and part.fault_class != chip.fault_class:
            part = replace(part, fault_class=chip.fault_class)
        if chip is not None and chip.held:
            part = replace(part, held=True).with_health(Health.UNHEALTHY, chip.reason)
        elif chip is not None and not chip.healthy and part.healthy:
            part = part.with_health(Health.UNHEALTHY, chip.reason)
        followed.append(part)
    return tuple(followed)


def _count_vnpus(parts: Sequence[Chip]) -> None:
    VNPU_AICORES.clear()
    VNPU_MEMORY.clear()
    for part in parts:
        assert part.vnpu is not None
        labels = {"device": part.device_id, "chip": part.chip_device_id, "template": part.vnpu.template}
        if part.vnpu.aicore is not None:
            VNPU_AICORES.labels(**labels).set(part.vnpu.aicore)
        if part.vnpu.memory_gb is not None:
            VNPU_MEMORY.labels(**labels).set(part.vnpu.memory_gb * 1024**3)


def nothing_held() -> frozenset[str]:
    """No device is held by a container, as far as the agent knows without the kubelet's view."""
    return frozenset()


def log_configuration(effective: EffectiveSettings) -> None:
    log.info("Configuration: %s", effective, extra=log_fields(settings=effective.as_fields()))
