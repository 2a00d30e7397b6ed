"""The HTTP endpoint's life (``/metrics``, ``/healthz``, ``/readyz`` and the JSON routes) beside the agent:
served at start when the address is free, else once it is (another agent that is stopping holds it: the
kubelet path never waits for it), moved to another address on a config reload, closed when the agent stops::

    endpoint = HttpEndpoint("0.0.0.0:9464", agent.ready, agent.health_detail)
    await endpoint.open()                  # before the instance lock: OSError but for an address in use
    tasks.start_soon(endpoint.run)         # serves until cancelled
    await endpoint.move("127.0.0.1:9000")  # False (and the old address kept) when it cannot
"""

from __future__ import annotations

import asyncio
import errno
import logging

import anyio
from anyio.abc import TaskGroup

from ascend_agent.observability import HealthDetail, Readiness, serve_http

log = logging.getLogger(__name__)

# Seconds between tries to serve on an address another process holds.
_RETRY_FIRST = 1.0
_RETRY_MOST = 10.0


class HttpEndpoint:
    """The agent's one HTTP server, on :attr:`address` (empty: none)."""

    def __init__(self, address: str, ready: Readiness, detail: HealthDetail | None = None) -> None:
        self.address = address
        self._ready = ready
        self._detail = detail
        self._opened: asyncio.Server | None = None
        self._scope = anyio.CancelScope()
        self._tasks: TaskGroup | None = None

    async def open(self) -> None:
        """Serve now if the address is free; an address in use is one warning line, and :meth:`run` serves
        once it is free. Any other error is raised: the address cannot be served at all."""
        if not self.address:
            return
        try:
            self._opened = await serve_http(self.address, self._ready, self._detail)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            # Another agent (waited for later), or another program: /metrics must not decide who runs.
            log.warning(
                "Cannot serve /metrics on %s yet (%s); trying again once this agent runs",
                self.address,
                exc.strerror or exc,
            )
        else:
            log.info("Serving /metrics, /healthz and /readyz on %s", self.address)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled: what :meth:`open` opened, or the address once nothing else holds it."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            if self._opened is not None:
                self._hold(self._opened)
                self._opened = None
            elif self.address:
                self._serve_when_free(self.address)
            task_status.started()
            await anyio.sleep_forever()

    async def move(self, address: str) -> bool:
        """Serve on ``address`` instead (empty: stop serving); False, and the old one kept, when it cannot."""
        if not address:
            self._scope.cancel()
            self.address = address
            log.info("Stopped serving /metrics, /healthz and /readyz")
            return True
        try:
            server = await serve_http(address, self._ready, self._detail)
        except OSError as exc:
            log.error(
                "Cannot serve /metrics on %s, keeping the old address: %s", address, exc.strerror or exc
            )
            return False
        self.address = address
        self._hold(server)
        log.info("Serving /metrics, /healthz and /readyz on %s", address)
        return True

    def _serve_when_free(self, address: str) -> None:
        assert self._tasks is not None
        self._scope.cancel()
        scope = self._scope = anyio.CancelScope()

        async def retry() -> None:
            delay = 0.0
            with scope:
                while True:
                    await anyio.sleep(delay)
                    try:
                        server = await serve_http(address, self._ready, self._detail)
                    except OSError as exc:
                        if exc.errno != errno.EADDRINUSE:
                            log.error("Cannot serve /metrics on %s: %s", address, exc.strerror or exc)
                            return
                        delay = min(max(2 * delay, _RETRY_FIRST), _RETRY_MOST)
                        continue
                    log.info("Serving /metrics, /healthz and /readyz on %s", address)
                    break
            if not scope.cancel_called:
                self._hold(server)
            else:
                server.close()

        self._tasks.start_soon(retry, name="http retry")

    def _hold(self, server: asyncio.Server) -> None:
        assert self._tasks is not None
        self._scope.cancel()
        scope = self._scope = anyio.CancelScope()

        async def hold() -> None:
            with scope:
                try:
                    await anyio.sleep_forever()
                finally:
                    server.close()

        self._tasks.start_soon(hold, name="http")
