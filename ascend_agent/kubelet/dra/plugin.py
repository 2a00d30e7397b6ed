"""The DRA kubelet plugin's life: serve ``dra.sock`` and the registration socket, and serve them again when
either file goes (a kubelet that cleans its directories, an operator). The kubelet's plugin watcher finds the
registration socket by itself, calls GetInfo (type ``DRAPlugin``, the services of ``VERSIONS``, endpoint
``dra.sock``) and then NotifyRegistrationStatus.

With the pod's UID (``$POD_UID``, the downward API) the sockets are the pod's own,
``<driver>-<pod uid>-reg.sock`` and ``dra-<pod uid>.sock``: during a DaemonSet's rolling update the kubelet
(1.33 and later) keeps both instances registered and calls the newer one, so no call finds the driver gone;
the two share the checkpoint, one call at a time (``serialize.CallLock``). Each registration the kubelet
confirms writes the node's ResourceSlices again: a kubelet that starts deletes them all first::

    plugin = DraPlugin(DraPaths.of(settings), service, on_kubelet_registered=side.kubelet_registered)
    task_group.start_soon(plugin.run)
    plugin.poke()                          # a socket directory changed
    ready, why = plugin.status()
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import anyio

from ascend_agent.files import make_dirs
from ascend_agent.kubelet.deviceplugin.transport import BoundedServer, SocketIdentity, socket_identity
from ascend_agent.kubelet.dra.handlers import grpc_handlers
from ascend_agent.kubelet.dra.paths import DraPaths, remove_stale
from ascend_agent.kubelet.dra.service import DraService
from ascend_agent.kubelet.plugin_watcher import WatcherRegistration
from ascend_agent.observability import REGISTRATIONS, ProblemLog, log_fields

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# The services dra.sock offers, newest DRAPlugin first (the kubelet takes the first it knows). Kubelets up
# to 1.36 open v1alpha1.DRAResourceHealth whatever is listed; v1 is listed for the kubelets after them.
VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
_RETRY = 1.0
# At SIGTERM, how long a prepare or unprepare in flight may take to finish (within a pod's default 30 s
# grace): its answer reaches the kubelet instead of a broken call the kubelet must retry.
DRAIN = 10.0


class DraPlugin:
    """Keeps the DRA plugin's two sockets served until cancelled; then removes them."""

    def __init__(
        self, paths: DraPaths, service: DraService, on_kubelet_registered: Callable[[], None] = lambda: None
    ) -> None:
        """``on_kubelet_registered``: called at each registration the kubelet confirms; it writes the node's
        ResourceSlices again (a kubelet that starts deletes them all, then registers the driver)."""
        self.paths = paths
        self.service = service
        self._on_kubelet_registered = on_kubelet_registered
        self._servers: list[tuple[BoundedServer, Path, SocketIdentity]] = []
        self._poked = anyio.Event()
        self._registered = False
        self._problem = "not served yet"
        self._serving_problem = ProblemLog()
        self.on_registered: Callable[[], None] = lambda: None

    def poke(self) -> None:
        self._poked.set()

    def status(self) -> tuple[bool, str]:
        """(ready, why not): ready once the kubelet confirmed the registration."""
        if not self._registered:
            return False, f"DRA driver {self.service.driver} not registered with the kubelet: {self._problem}"
        return True, ""

    async def run(self) -> None:
        try:
            while True:
                poked = self._poked = anyio.Event()
                delay: float | None = None
                if not self._serving_ours():
                    delay = None if await self._serve() else _RETRY
                if delay is None:
                    await poked.wait()
                else:
                    with anyio.move_on_after(delay):
                        await poked.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await self._stop(drain=DRAIN)

    def _serving_ours(self) -> bool:
        return bool(self._servers) and all(socket_identity(p) == i for _, p, i in self._servers)

    async def _serve(self) -> bool:
        if self._servers:
            log.info("A socket of DRA driver %s is gone; serving again", self.service.driver)
        await self._stop()
        self._registered = False
        registration = WatcherRegistration(
            self.service.driver,
            self.paths.socket,
            on_info=lambda: None,
            on_status=self._on_status,
            plugin_type=PLUGIN_TYPE,
            versions=VERSIONS,
        )
        path = self.paths.socket
        try:
            # The driver's own directory, in the kubelet's plugins directory (waited for, never made here).
            make_dirs(path.parent, 0o750, parents=False)
            if self.paths.lock is not None:
                gone = await anyio.to_thread.run_sync(remove_stale, self.paths, self.service.driver)
                for uid in gone:
                    log.info(
                        "Removed the sockets pod %s of DRA driver %s left: nothing listens",
                        uid,
                        self.service.driver,
                    )
            served: list[tuple[list[object], Path]] = [
                (grpc_handlers(self.service), self.paths.socket),
                ([registration], self.paths.registration),
            ]
            for handlers, path in served:
                server = BoundedServer(handlers)
                self._servers.append((server, path, await server.serve(path)))
        except OSError as exc:
            self._problem = f"cannot serve on {path}: {exc.strerror or exc}"
            if self._serving_problem.changed(self._problem):
                log.error("DRA driver %s: %s", self.service.driver, self._problem)
            await self._stop()
            return False
        self._problem = f"waiting for the kubelet's plugin watcher to find {self.paths.registration}"
        log.info(
            "Serving DRA driver %s on %s (registration %s)",
            self.service.driver,
            self.paths.socket,
            self.paths.registration,
        )
        return True

    async def _stop(self, drain: float = 0.0) -> None:
        """Remove the socket files (the kubelet deregisters the driver and calls another instance, if any),
        let the calls in flight finish for up to ``drain`` seconds, then close the servers."""
        servers, self._servers = self._servers, []
        for _, path, identity in servers:
            if socket_identity(path) == identity:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        if servers and drain and self.service.calls_in_flight:
            log.info(
                "DRA driver %s stopping: %d call(s) in flight, waiting up to %g s for them",
                self.service.driver,
                self.service.calls_in_flight,
                drain,
            )
            if left := await self.service.drained(drain):
                log.warning(
                    "DRA driver %s: %d call(s) cut short; the kubelet retries", self.service.driver, left
                )
        for server, _, _ in servers:
            await server.shut()

    def _on_status(self, registered: bool, error: str) -> None:
        driver = self.service.driver
        if registered:
            self._registered = True
            self._problem = ""
            self._serving_problem.clear()
            REGISTRATIONS.labels(resource=driver).inc()
            self._on_kubelet_registered()
            self.on_registered()
            log.info("Registered DRA driver %s", driver, extra=log_fields(resource=driver))
        else:
            self._registered = False
            self._problem = f"the kubelet refused the registration: {error or 'no reason given'}"
            log.warning("DRA driver %s: %s", driver, self._problem, extra=log_fields(resource=driver))
