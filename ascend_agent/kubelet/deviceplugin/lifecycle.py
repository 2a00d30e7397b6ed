"""One resource's life with the kubelet: serve -> self-check -> register -> watch -> back-off -> serve again.

A :class:`ResourcePlugin` runs as one task. Each turn of its loop looks at the world (is the socket file still
the one we bound? which kubelet is listening? is the kubelet's ListAndWatch stream open?) and does the one
thing that is missing, then sleeps until :meth:`poke` (a file event, a stream that opened or closed) or a
timer wakes it::

    plugin = ResourcePlugin("huawei.com/Ascend910", settings)
    plugin.publish(devices, preference, inventory.container)
    task_group.start_soon(plugin.run)
    ...
    plugin.poke()          # kubelet.sock or our socket changed
    ready, why = plugin.status()

Two registration paths: ``kubelet`` calls Register on kubelet.sock (after a kubelet restart wiped our socket,
serve again first, so the kubelet never dials an endpoint that is not listening); ``plugin-watcher`` serves a
registration socket in the kubelet's plugins registry and waits for the kubelet to call it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
from grpclib.exceptions import GRPCError, StreamTerminatedError

from ascend_agent import naming
from ascend_agent._proto.v1beta1 import DevicePluginOptions, DevicePluginStub, PreStartContainerRequest
from ascend_agent.backoff import Backoff
from ascend_agent.config import PLUGIN_WATCHER_REGISTRATION, Settings
from ascend_agent.kubelet.deviceplugin.kubelet import (
    API_VERSION,
    KUBELET_SOCKET,
    RegistrationError,
    register,
)
from ascend_agent.kubelet.deviceplugin.service import DevicePluginService, Preference
from ascend_agent.kubelet.deviceplugin.transport import (
    BoundedServer,
    LocalChannel,
    SocketIdentity,
    socket_identity,
)
from ascend_agent.kubelet.deviceplugin.wire import BytesCodec
from ascend_agent.model import Chip, ContainerBase
from ascend_agent.observability import REGISTRATIONS, ProblemLog, log_fields

log = logging.getLogger(__name__)

BACKOFF_START = 0.1
BACKOFF_CAP = 5.0
# After the kubelet's ListAndWatch stream ends, wait this long for it to open a new one (it does so right
# after a registration) before registering again. Losses soon after each other double the wait, so a kubelet
# that drops every stream cannot drive a loop.
STREAM_GRACE = 0.5
STREAM_GRACE_CAP = 60.0
_STREAK_WINDOW = 30.0
_SELF_CHECK_TIMEOUT = 2.0
# The kubelet's plugin watcher looks at its directory about once a second; a restarted kubelet finds the
# registry socket again within that, and the agent must not act first.
_WATCHER_GRACE = 5.0


def _retrieve(task: asyncio.Future[None]) -> None:
    """Mark a given-up registration's outcome as seen (its error was already handled, or never matters)."""
    if not task.cancelled():
        task.exception()


class ServeFailed(Exception):
    """Serving kept failing for the whole ``serve_timeout``: the message says why, in one line."""


class ResourcePlugin:
    """Keeps one resource served and registered; the agent publishes to it and pokes it, nothing more."""

    def __init__(self, resource: str, settings: Settings) -> None:
        self.resource = resource
        self._kubelet_socket = settings.kubelet_dir / KUBELET_SOCKET
        self._kubelet_dir = settings.kubelet_dir
        self._watcher_mode = settings.registration == PLUGIN_WATCHER_REGISTRATION
        self.socket_path = (settings.endpoint_dir / naming.socket_name(resource)).absolute()
        self.registry_path = (
            settings.effective_plugins_registry_dir / naming.registry_socket_name(resource)
            if self._watcher_mode
            else None
        )
        self._serve_timeout = settings.serve_timeout
        self._failing_since: float | None = None
        self.service = DevicePluginService(resource, on_stream_change=self.poke)
        self._poked = anyio.Event()
        # Told after each registration (the agent starts its cluster side after the first).
        self.on_registered: Callable[[], None] = lambda: None
        self._registering: anyio.Event | None = None
        self._servers: list[tuple[BoundedServer, Path, SocketIdentity]] = []
        self._stale = False  # serve again although the sockets are still ours
        self._incarnation = 0
        # kubelet.sock's identity when we registered (kubelet mode), or True once the kubelet said so
        # (plugin-watcher mode); None while not registered.
        self._registered_with: SocketIdentity | bool | None = None
        self._failed_with: SocketIdentity | None = None  # kubelet.sock at the last failed registration
        self._lost_at: float | None = None
        self._streams_at_registration = 0
        self._lost_streak = 0
        self._last_lost = -math.inf
        self._problem = "not served yet"
        self._problem_log = ProblemLog()

    # what the agent may call -----------------------------------------------------------------------------
    def publish(
        self,
        devices: Mapping[str, Chip],
        preference: Preference | None,
        container: ContainerBase,
        most_per_container: int | None = None,
        listed: Mapping[str, Chip] | None = None,
    ) -> None:
        """Advertise ``devices`` (advertised ID -> chip) with ``preference`` over them; ``container`` says
        what a container that gets some of them gets besides them; a container asking for more than
        ``most_per_container`` devices is refused. ``listed``: what the device list shows per ID instead.
        The kubelet is sent the list only when it differs from the last one sent (a held chip's reason
        changing underneath sends nothing)."""
        self.service.publish(devices, preference, container, most_per_container, listed)

    def set_serve_timeout(self, seconds: float) -> None:
        """How long serving may keep failing before the agent gives up (``serveTimeout``, live)."""
        self._serve_timeout = seconds

    def poke(self) -> None:
        """Something in the world changed: look again."""
        self._poked.set()
        if self._registering is not None:
            self._registering.set()

    def status(self) -> tuple[bool, str]:
        """(ready, why not): ready while registered and the kubelet's ListAndWatch stream is open."""
        if self._registered_with is None:
            return False, f"not registered with the kubelet: {self.resource} ({self._problem})"
        if not self.service.kubelet_stream_open:
            return False, f"{self.resource}: the kubelet's ListAndWatch stream is not open"
        return True, ""

    async def run(self) -> None:
        """Serve, register and keep it so until cancelled; then stop serving and remove our sockets."""
        backoff = Backoff(BACKOFF_START, BACKOFF_CAP, jitter=False)
        try:
            while True:
                poked = self._poked = anyio.Event()
                if self._serving_ours():
                    if self._watcher_mode:
                        delay = self._keep_watched()
                    else:
                        delay = await self._keep_registered(backoff)
                elif await self._serve():
                    self._failing_since = None
                    backoff.reset()
                    continue
                else:
                    self._give_up_after_timeout()
                    delay = backoff.next()
                if delay is None:
                    await poked.wait()
                elif delay > 0:
                    with anyio.move_on_after(delay):
                        await poked.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await self._stop_serving()

    # serving ------------------------------------------------------------------------------------------------
    def _serving_ours(self) -> bool:
        """True while every socket we serve is still the file we bound (the kubelet's start-up wipes ours)."""
        return (
            not self._stale
            and bool(self._servers)
            and all(socket_identity(path) == identity for _, path, identity in self._servers)
        )

    async def _serve(self) -> bool:
        if self._servers and not self._stale:
            log.info("Socket %s is gone; serving %s again", self.socket_path, self.resource)
        await self._stop_serving()
        self._incarnation += 1
        self._registered_with = None
        self._stale = False
        path = self.socket_path
        try:
            await self._listen(BoundedServer([self.service], codec=BytesCodec()), path)
            await self._self_check()
            if self.registry_path is not None:
                path = self.registry_path
                from ascend_agent.kubelet.plugin_watcher import WatcherRegistration  # this mode only

                registration = WatcherRegistration(
                    self.resource,
                    self.socket_path,
                    self._expect_kubelet,
                    self._on_watcher_status,
                    plugin_type="DevicePlugin",
                    versions=(API_VERSION,),
                )
                await self._listen(BoundedServer([registration]), path)
        except (OSError, TimeoutError, GRPCError, StreamTerminatedError) as exc:
            reason = (
                exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
            )
            self._problem = f"cannot serve on {path}: {reason}"
            if self._problem_log.changed(self._problem):
                log.error(
                    "Cannot serve %s on %s: %s",
                    self.resource,
                    path,
                    reason,
                    extra=log_fields(resource=self.resource, path=path, reason=reason),
                )
            await self._stop_serving()
            return False
        self._problem = "waiting for the kubelet"
        if self.registry_path is not None:
            self._problem = f"waiting for the kubelet's plugin watcher to find {self.registry_path}"
        return True

    def _give_up_after_timeout(self) -> None:
        """A directory that stays unusable (read-only, not a directory) ends the agent with one line, so that
        Kubernetes restarts it and shows the reason, instead of a pod that runs and is never ready."""
        now = anyio.current_time()
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since >= self._serve_timeout:
            raise ServeFailed(
                f"{self.resource}: {self._problem} for {self._serve_timeout:g} s; check that the directory "
                "is the kubelet's, mounted read-write into the agent"
            )

    async def _listen(self, server: BoundedServer, path: Path) -> None:
        self._servers.append((server, path, await server.serve(path)))

    async def _self_check(self) -> None:
        """Dial our own socket and make a call, as the kubelet will (PreStartContainer: it answers at once
        and opens no stream)."""
        channel = LocalChannel(self.socket_path)
        try:
            await DevicePluginStub(channel).pre_start_container(
                PreStartContainerRequest(), timeout=_SELF_CHECK_TIMEOUT
            )
        finally:
            channel.close()

    async def _stop_serving(self) -> None:
        servers, self._servers = self._servers, []
        for server, path, identity in servers:
            if socket_identity(path) == identity:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            await server.shut()

    # registering ------------------------------------------------------------------------------------------
    async def _keep_registered(self, backoff: Backoff) -> float | None:
        """Register when this kubelet has not got us, or its stream is gone past the grace; the seconds until
        the next look (None: only when poked)."""
        kubelet = socket_identity(self._kubelet_socket)
        if self._registered_with is not None and self._registered_with == kubelet:
            wait = self._stream_grace_left()
            if wait is None or wait > 0:
                return wait
            self._stream_lost("registering again")
            self._registered_with = None
        # Our socket is looked at after kubelet.sock: a kubelet that wiped it at its start has done so before
        # it listened, so a socket still ours now is one that kubelet dials.
        if not self._serving_ours():
            return 0
        incarnation = self._incarnation
        try:
            if kubelet is None:
                # Not register() finding it a moment later: a kubelet that appears now may have just wiped
                # our socket; its creation pokes us, and the look at our socket comes first then.
                raise RegistrationError(
                    f"the kubelet is not listening: {self._kubelet_socket} does not exist"
                )
            if not await self._register_while_served():
                log.debug("%s: our socket went while registering; serving again first", self.resource)
                return 0
        except RegistrationError as exc:
            self._problem = str(exc)
            if self._problem_log.changed(self._problem):
                log.warning(
                    "Cannot register %s: %s; retrying with back-off",
                    self.resource,
                    exc,
                    extra=log_fields(resource=self.resource, reason=str(exc)),
                )
            if kubelet is not None and kubelet != self._failed_with:
                # A kubelet.sock not tried before: its file appears at bind(), before the kubelet listens, so
                # its first refusal is tried again soon, not after the back-off grown while it was absent.
                backoff.reset()
            self._failed_with = kubelet
            delay = backoff.next()
            log.debug(
                "Next registration attempt for %s in %.1f s, or when kubelet.sock appears",
                self.resource,
                delay,
            )
            return delay
        # Registered with the kubelet seen before the call: one that replaced it meanwhile is registered next.
        if self._incarnation != incarnation:
            log.debug("The kubelet dialled an earlier %s server; registering again", self.resource)
            return backoff.next()
        backoff.reset()
        self._registered(kubelet)
        return 0

    async def _register_while_served(self) -> bool:
        """Register; False, at once, when our socket is wiped meanwhile: the kubelet's dial-back cannot reach
        it, and waiting for its 10 s timeout would delay serving again. RegistrationError on failure.

        The call runs as a task of its own, so that giving it up cancels that task only: grpclib can swallow
        a cancellation while it takes a connection down, which inside a cancel scope of ours would leak into
        this resource's lifecycle and end it."""
        self._expect_kubelet()
        attempt = asyncio.ensure_future(
            register(self._kubelet_dir, self.socket_path.name, self.resource, self._options())
        )
        attempt.add_done_callback(_retrieve)
        try:
            while not attempt.done():
                changed = self._registering = anyio.Event()
                waiter = asyncio.ensure_future(changed.wait())
                try:
                    await asyncio.wait({attempt, waiter}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                if not attempt.done() and not self._serving_ours():
                    return False
            attempt.result()
            return True
        finally:
            self._registering = None
            attempt.cancel()

    def _options(self) -> DevicePluginOptions:
        return DevicePluginOptions.parse(self.service.options)

    def _stream_grace_left(self, floor: float = 0.0) -> float | None:
        """None while the kubelet's stream is open; else the seconds left before we act on its loss. Losses
        that follow each other within the streak window double the grace; a quiet spell resets it."""
        now = anyio.current_time()
        if self.service.kubelet_stream_open:
            self._lost_at = None
            return None
        if self._lost_at is None:
            self._lost_at = now
            if now - self._last_lost >= _STREAK_WINDOW:
                self._lost_streak = 0
        grace = max(min(STREAM_GRACE * 2.0**self._lost_streak, STREAM_GRACE_CAP), floor)
        return self._lost_at + grace - now

    def _stream_lost(self, action: str) -> None:
        """The kubelet's stream stayed away past the grace, with no kubelet restart: count it, say so."""
        now = anyio.current_time()
        self._lost_streak += 1
        self._last_lost = now
        opened = self.service.kubelet_streams_opened != self._streams_at_registration
        log.info(
            "The kubelet's ListAndWatch stream for %s %s; %s",
            self.resource,
            "ended" if opened else "never opened after the registration",
            action,
            extra=log_fields(resource=self.resource),
        )

    def _keep_watched(self) -> float | None:
        """Plugin-watcher mode: the kubelet finds the registry socket by itself, after its restarts too. A
        stream lost while that kubelet stays is the one case to act on: the registry socket is made again,
        which the plugin watcher sees as a new plugin."""
        if self._registered_with is None:
            return None
        wait = self._stream_grace_left(floor=_WATCHER_GRACE)
        if wait is None or wait > 0:
            return wait
        self._stream_lost("serving the registry socket again")
        self._stale = True
        return 0

    def _expect_kubelet(self) -> None:
        """A registration starts (Register, or the plugin watcher's GetInfo): the kubelet's next stream is
        the one to follow."""
        self._streams_at_registration = self.service.kubelet_streams_opened
        self.service.expect_kubelet()

    def _registered(self, registered_with: SocketIdentity | bool) -> None:
        self._lost_at = None
        self._registered_with = registered_with
        self._problem = ""
        self._problem_log.clear()
        REGISTRATIONS.labels(resource=self.resource).inc()
        log.info("Registered resource %s", self.resource, extra=log_fields(resource=self.resource))
        self.on_registered()

    def _on_watcher_status(self, registered: bool, error: str) -> None:
        if registered:
            self._registered(True)
        else:
            self._registered_with = None
            self._problem = f"the kubelet refused the registration: {error or 'no reason given'}"
            log.warning(
                "Cannot register %s: %s",
                self.resource,
                self._problem,
                extra=log_fields(resource=self.resource, reason=self._problem),
            )
        self.poke()
