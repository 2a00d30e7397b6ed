"""The supervisor: one reconcile loop fed by events.

Events (file changes, the health timer, a stream that ended, a signal) only *wake* the agent. Each
wake-up derives the desired state (devices per resource, which servers must exist, which must register)
and applies the difference, so two wake-ups in a row do no extra work::

    agent = Agent(settings, backend)
    await agent.run(stop_event)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any

from ascend_agent import __version__, cdi
from ascend_agent.allocation import advertised_ids, preferred, topology_for
from ascend_agent.backends import Backend, load_backend
from ascend_agent.config import ConfigError, Settings, SettingsSource
from ascend_agent.kubelet import KUBELET_SOCKET, RegistrationError, register, socket_identity, socket_name
from ascend_agent.model import Chip, ContainerSpec, Health, Inventory
from ascend_agent.observability import DEVICES, KUBELET_RESTARTS, REGISTRATIONS, configure_logging, serve_http
from ascend_agent.plugin import PluginServer
from ascend_agent.watch import Change, Watcher, WatchEvent

log = logging.getLogger(__name__)

BACKOFF_START = 0.1
BACKOFF_CAP = 5.0
# After the last ListAndWatch stream of a resource ends, wait this long for the kubelet to open a new one
# (it does so right after a registration it asked for) before registering again. Streams that keep ending
# soon after each other double the wait, so a kubelet that drops every stream cannot drive a loop.
STREAM_GRACE = 0.5
STREAM_GRACE_CAP = 60.0
_STREAK_WINDOW = 30.0

_KUBELET_TAG = "kubelet"
_BACKEND_TAG = "backend"
_CONFIG_TAG = "config"
# Settings the agent applies itself; a change to any other one means a new backend.
_AGENT_ONLY_SETTINGS = frozenset({"kubelet_dir", "log_level", "log_format", "metrics_address"})


@dataclass
class _Resource:
    """What the agent keeps per resource: its server, its registration, and the chips it advertises."""

    server: PluginServer
    chips: tuple[Chip, ...] = ()
    registered: bool = False
    registered_with: tuple[int, int] | None = None
    registering: asyncio.Task[None] | None = None
    retry_now: asyncio.Event = field(default_factory=asyncio.Event)
    grace: asyncio.TimerHandle | None = None
    lost_streak: int = 0
    last_lost: float = float("-inf")


class Agent:
    """Keeps one PluginServer per resource serving, published and registered."""

    def __init__(self, settings: Settings, backend: Backend, source: SettingsSource | None = None) -> None:
        self.settings = settings
        self.backend = backend
        self._source = source
        self._resources: dict[str, _Resource] = {}
        self._wakeup = asyncio.Event()
        self._reload = False
        self._known_chips: set[str] = set()
        self._problems: tuple[str, ...] = ()
        self._watcher: Watcher | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.inventory = Inventory()
        self._spec_fingerprint: ContainerSpec | None = None
        self._cdi_document: dict[str, Any] | None = None

    def wake(self) -> None:
        """Ask for a reconcile soon; any number of calls before it runs make one reconcile."""
        self._wakeup.set()

    def reload(self) -> None:
        """Re-read the config file and apply it (SIGHUP, or the file changed)."""
        self._reload = True
        self.wake()

    def ready(self) -> tuple[bool, str]:
        """Ready once every resource with chips is registered; else why not (for ``/readyz``)."""
        if not self._resources:
            return False, "; ".join(self.inventory.problems) or "no chips found"
        waiting = sorted(resource for resource, state in self._resources.items() if not state.registered)
        if waiting:
            return False, f"not registered with the kubelet: {', '.join(waiting)}"
        return True, ""

    def kubelet_appeared(self) -> None:
        """``kubelet.sock`` may be there now: registrations waiting in back-off try again at once."""
        for state in self._resources.values():
            state.retry_now.set()
        self.wake()

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile on every wake-up until ``stop`` is set, then stop every server and remove its socket."""
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await self.backend.query()
            self._start_watching()
            while not stop.is_set():
                self._wakeup.clear()
                if self._reload:
                    self._reload = False
                    await self._apply_config()
                await self.reconcile()
                woken = asyncio.ensure_future(self._wakeup.wait())
                await asyncio.wait({woken, stopping}, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
        finally:
            stopping.cancel()
            await self.shutdown()

    def _start_watching(self) -> None:
        """(Re)create the inotify watches and the health timer for the current settings and backend."""
        self._stop_watching()
        watcher = self._watcher = Watcher()
        watcher.watch(self.settings.kubelet_dir, _KUBELET_TAG, lambda name: name.endswith(".sock"))
        for directory, accept in self.backend.watch_paths():
            watcher.watch(directory, _BACKEND_TAG, accept)
        if self._source is not None and self._source.config_file is not None:
            watcher.watch_file(self._source.config_file, _CONFIG_TAG)
        self._spawn(self._follow(watcher), "watch")
        interval = self.backend.health_interval
        if interval is not None:
            self._spawn(self._health(interval), "health")

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stop_watching(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    async def _follow(self, watcher: Watcher) -> None:
        while True:
            for event in await watcher.next_batch():
                self._on_event(event)

    def _on_event(self, event: WatchEvent) -> None:
        log.debug("inotify: %s %s %s", event.tag, event.name, event.change.value)
        if event.tag == _KUBELET_TAG:
            if event.name == KUBELET_SOCKET and event.change is Change.CREATED:
                KUBELET_RESTARTS.inc()
                self.kubelet_appeared()
            elif event.change is Change.APPEARED:
                self.kubelet_appeared()
            elif event.change is Change.DELETED:
                self.wake()
        elif event.tag == _CONFIG_TAG:
            if event.change is not Change.DELETED:
                self.reload()
        else:
            self.wake()

    async def _health(self, interval: float) -> None:
        """The one timer: hardware health has no event source. The query runs beside the reconcile loop,
        so a slow or hanging npu-smi never delays a re-registration."""
        while True:
            await asyncio.sleep(interval)
            if await self.backend.query():
                self.wake()

    async def _apply_config(self) -> None:
        assert self._source is not None
        try:
            settings = self._source.load()
        except ConfigError as exc:
            log.error("Config not applied, keeping the running settings: %s", exc)
            return
        if settings == self.settings:
            log.info("Config re-read: nothing changed")
            return
        configure_logging(settings.log_level, settings.log_format)
        changed = sorted(
            f.name for f in fields(Settings) if getattr(settings, f.name) != getattr(self.settings, f.name)
        )
        if set(changed) - _AGENT_ONLY_SETTINGS:
            try:
                backend = _backend(settings)
                await backend.start()
            except ConfigError as exc:
                log.error("Config not applied, keeping the running settings: %s", exc)
                return
            await self.backend.close()
            self.backend = backend
            await backend.query()
            self._spec_fingerprint = None
        if settings.kubelet_dir != self.settings.kubelet_dir:
            for resource in list(self._resources):
                await self._drop(resource)
        self.settings = settings
        self._start_watching()
        log.info("Config applied: %s changed", ", ".join(changed))

    async def reconcile(self) -> None:
        """Discover, then make the servers, the published lists and the registrations match."""
        inventory = await self.backend.discover()
        self.inventory = inventory
        self._report(inventory)
        desired = inventory.by_resource()
        DEVICES.clear()
        for resource, chips in desired.items():
            for health in Health:
                DEVICES.labels(resource=resource, health=health.value).set(
                    sum(c.health is health for c in chips)
                )
        for resource in [r for r in self._resources if r not in desired]:
            log.info("No more chips for %s; stopping its server", resource)
            await self._drop(resource)
        for resource, chips in desired.items():
            state = self._resources.get(resource)
            if state is None:
                state = self._resources[resource] = _Resource(self._new_server(resource))
            state.chips = chips
            self._publish(state)
            if not state.server.serving or not state.server.socket_is_ours():
                await self._serve(resource, state)
            elif self._kubelet_identity() != state.registered_with:
                self._ensure_registering(resource, state)
        await self._refresh_container_specs(inventory)

    def _publish(self, state: _Resource) -> None:
        """Advertise the chips (each ``replicas`` times) with a topology-aware preference over them."""
        replicas = self.settings.replicas
        devices = {
            device_id: chip for chip in state.chips for device_id in advertised_ids(chip.device_id, replicas)
        }
        topology = topology_for(state.chips, replicas)
        state.server.publish(devices, partial(preferred, topology))

    async def _refresh_container_specs(self, inventory: Inventory) -> None:
        """When what containers get changes (a management device, a driver path, the mode), forget the cached
        Allocate answers and rewrite the CDI spec."""
        fingerprint = self.backend.container_spec(inventory.chips)
        if fingerprint != self._spec_fingerprint:
            self._spec_fingerprint = fingerprint
            for state in self._resources.values():
                state.server.spec_for = self._spec_for
        directory = self.settings.cdi_spec_dir
        if directory is None:
            return
        document = cdi.build_spec(inventory.chips, self.backend.container_spec)
        if document != self._cdi_document:
            try:
                path = await cdi.write_spec(directory, document)
            except OSError as exc:
                log.error("Cannot write the CDI spec in %s: %s", directory, exc.strerror or exc)
                return
            self._cdi_document = document
            log.info("Wrote CDI spec %s with %d devices", path, len(document["devices"]))

    def _spec_for(self, chips: Sequence[Chip]) -> ContainerSpec:
        spec = self.backend.container_spec(chips)
        if self.settings.cdi_spec_dir is None:
            return spec
        ordered = sorted(chips, key=lambda chip: chip.phys_id)
        return replace(spec, cdi_devices=tuple(cdi.device_name(chip) for chip in ordered))

    def _report(self, inventory: Inventory) -> None:
        for chip in inventory.chips:
            if chip.device_path not in self._known_chips:
                self._known_chips.add(chip.device_path)
                log.info("Found device %s", chip.device_path)
        if inventory.problems != self._problems:
            for problem in inventory.problems:
                if problem not in self._problems:
                    log.warning("%s", problem)
            self._problems = inventory.problems

    def _new_server(self, resource: str) -> PluginServer:
        return PluginServer(
            resource,
            self.settings.kubelet_dir / socket_name(resource),
            self._spec_for,
            on_streams_changed=self._streams_changed,
        )

    async def _serve(self, resource: str, state: _Resource) -> None:
        """(Re)start the server on a fresh socket, check it answers, then register."""
        if state.server.serving:
            log.info("Socket %s is gone; serving %s again", state.server.socket_path, resource)
            await state.server.stop()
        try:
            await state.server.start()
            await state.server.check()
        except (OSError, TimeoutError) as exc:
            log.error("Cannot serve %s on %s: %s", resource, state.server.socket_path, exc)
            await state.server.stop()
            return
        state.registered, state.registered_with = False, None
        self._ensure_registering(resource, state)

    def _ensure_registering(self, resource: str, state: _Resource) -> None:
        """Start a registration unless one is in flight: that one covers this trigger too, and registers
        once more if the kubelet's dial-back did not reach the server now serving."""
        if state.grace is not None:
            state.grace.cancel()
            state.grace = None
        if state.registering is not None and not state.registering.done():
            state.retry_now.set()
            return
        state.registering = asyncio.create_task(self._register(resource, state), name=f"register {resource}")

    async def _register(self, resource: str, state: _Resource) -> None:
        delay = BACKOFF_START
        last_error = ""
        while True:
            state.retry_now.clear()
            kubelet = self._kubelet_identity()
            mark = state.server.dial_mark()
            try:
                await register(
                    self.settings.kubelet_dir, state.server.socket_path.name, resource, state.server.options
                )
            except RegistrationError as exc:
                if str(exc) != last_error:
                    log.warning("Cannot register %s: %s; retrying with back-off", resource, exc)
                    last_error = str(exc)
                log.debug(
                    "Next registration attempt for %s in %.1f s, or when kubelet.sock appears",
                    resource,
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.retry_now.wait(), delay)
                # Woken by a change (kubelet.sock created, the server restarted): back-off starts over.
                delay = BACKOFF_START if state.retry_now.is_set() else min(delay * 2, BACKOFF_CAP)
                continue
            if not state.server.dialled_since(mark):
                log.debug("The kubelet dialled an earlier %s server; registering again", resource)
                continue
            state.registered, state.registered_with = True, kubelet
            REGISTRATIONS.labels(resource=resource).inc()
            log.info("Registered resource %s", resource)
            if state.server.streams == 0:
                # The kubelet opens its stream right after Register; one that ended while this registration
                # was under way went unanswered, so wait for a stream as after any loss.
                self._arm_grace(resource, state)
            return

    def _kubelet_identity(self) -> tuple[int, int] | None:
        return socket_identity(self.settings.kubelet_dir / KUBELET_SOCKET)

    def _streams_changed(self, resource: str, streams: int) -> None:
        state = self._resources.get(resource)
        if state is None:
            return
        if streams > 0:
            if state.grace is not None:
                state.grace.cancel()
                state.grace = None
            return
        registering = state.registering is not None and not state.registering.done()
        if not registering:
            self._arm_grace(resource, state)

    def _arm_grace(self, resource: str, state: _Resource) -> None:
        if state.server.serving and state.grace is None:
            delay = min(STREAM_GRACE * 2**state.lost_streak, STREAM_GRACE_CAP)
            state.grace = asyncio.get_running_loop().call_later(delay, self._stream_lost, resource)

    def _stream_lost(self, resource: str) -> None:
        state = self._resources.get(resource)
        if state is None:
            return
        state.grace = None
        if state.server.streams == 0 and state.server.serving:
            now = asyncio.get_running_loop().time()
            state.lost_streak = state.lost_streak + 1 if now - state.last_lost < _STREAK_WINDOW else 0
            state.last_lost = now
            log.info("The kubelet's ListAndWatch stream for %s ended; registering again", resource)
            state.registered, state.registered_with = False, None
            self.wake()

    async def _drop(self, resource: str) -> None:
        state = self._resources.pop(resource)
        if state.grace is not None:
            state.grace.cancel()
        if state.registering is not None:
            state.registering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await state.registering
        await state.server.stop()

    async def shutdown(self) -> None:
        """Stop every server and remove its socket."""
        self._stop_watching()
        for resource in list(self._resources):
            await self._drop(resource)
        if self.settings.cdi_spec_dir is not None and self._cdi_document is not None:
            cdi.remove_spec(self.settings.cdi_spec_dir)
        await self.backend.close()


def _backend(settings: Settings) -> Backend:
    try:
        return load_backend(settings.backend)(settings)
    except LookupError as exc:
        raise ConfigError(f"--backend: {exc.args[0]}") from None


async def discover_once(settings: Settings) -> Inventory:
    """One discovery with the configured backend, for ``ascend-agent list``."""
    backend = _backend(settings)
    try:
        await backend.start()
        await backend.query()
        return await backend.discover()
    finally:
        await backend.close()


def _reap_children_by_pidfd() -> None:
    """On the running loop: Python 3.11 waits for every npu-smi in a thread started for it; a pidfd on the
    event loop needs no thread (3.12 and later choose it themselves)."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel before 5.3, or a seccomp profile that refuses it
        return
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)


async def run_agent(source: SettingsSource, settings: Settings) -> int:
    """The ``run`` command: the agent until SIGTERM or SIGINT; the exit status."""
    configure_logging(settings.log_level, settings.log_format)
    _reap_children_by_pidfd()
    backend = _backend(settings)
    await backend.start()
    log.info(
        "ascend-agent %s starting: backend %s, kubelet directory %s",
        __version__,
        settings.backend,
        settings.kubelet_dir,
    )
    agent = Agent(settings, backend, source)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, agent.reload)
    http = None
    if settings.metrics_address:
        try:
            http = await serve_http(settings.metrics_address, agent.ready)
        except OSError as exc:
            raise ConfigError(
                f"--metrics-address {settings.metrics_address}: {exc.strerror or exc}"
            ) from None
        log.info("Serving /metrics, /healthz and /readyz on %s", settings.metrics_address)
    try:
        await agent.run(stop)
    finally:
        if http is not None:
            http.close()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)
    log.info("Stopped; sockets removed")
    return 0
