"""A kubelet stand-in on grpclib, for tests that run a ResourcePlugin in the test's own event loop.

Like the kubelet's device manager it serves Registration on ``<dir>/kubelet.sock`` (removing every socket in
the directory first, as a starting kubelet does), and inside Register dials the plugin back, asks for its
options and opens ListAndWatch. It can refuse the next N registrations, and records what it saw; tests wait
on that with :meth:`AsyncKubelet.wait_for`::

    kubelet = AsyncKubelet(directory, refuse=2)
    await kubelet.start()
    await kubelet.wait_for(lambda: len(kubelet.registrations) == 1, "a registration")
    await kubelet.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.server import Server

from ascend_agent._proto.v1beta1 import DevicePluginStub, Empty, RegisterRequest, RegistrationBase
from ascend_agent.kubelet.deviceplugin.kubelet import KUBELET_SOCKET
from ascend_agent.kubelet.deviceplugin.transport import LocalChannel
from tests.support import PATIENCE

_DIAL_TIMEOUT = 10.0


@dataclass
class Registration:
    resource: str
    endpoint: str
    # Was the plugin's socket there when Register arrived?
    socket_present: bool
    at: float = field(default_factory=time.monotonic)


@dataclass
class _Watch:
    channel: LocalChannel
    task: asyncio.Task[None]


class AsyncKubelet(RegistrationBase):
    def __init__(self, directory: Path, refuse: int = 0) -> None:
        self.directory = directory
        self.refuse = refuse
        self.refused = 0
        self.attempts: list[float] = []
        self.registrations: list[Registration] = []
        self.dial_failures: list[str] = []
        # (resource, device IDs) per ListAndWatch message
        self.updates: list[tuple[str, list[str]]] = []
        self.streams_ended = 0
        self._server: Server | None = None
        self._watches: dict[str, _Watch] = {}
        self._changed = anyio.Event()

    @property
    def socket(self) -> Path:
        return self.directory / KUBELET_SOCKET

    # lifecycle ------------------------------------------------------------------------------------------
    async def start(self, *, wipe: bool = True, sock: socket.socket | None = None) -> None:
        """Serve on kubelet.sock; or on ``sock``, a socket already bound there (it listens from now)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if wipe:
            for path in self.directory.glob("*.sock"):
                path.unlink()
        server = Server([self])
        if sock is None:
            await server.start(path=str(self.socket))
        else:
            await server.start(sock=sock)
        self._server = server

    async def stop(self) -> None:
        """Stop serving, end every ListAndWatch stream, and remove kubelet.sock."""
        if self._server is not None:
            self._server.close()
            with anyio.move_on_after(2):
                await self._server.wait_closed()
            self._server = None
        for resource in list(self._watches):
            await self.end_stream(resource)
        self.socket.unlink(missing_ok=True)

    async def end_stream(self, resource: str = "huawei.com/Ascend910") -> None:
        """End the resource's ListAndWatch stream, as a kubelet that dropped it does."""
        watch = self._watches.pop(resource)
        watch.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch.task
        watch.channel.close()

    # what it saw ----------------------------------------------------------------------------------------
    async def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float = PATIENCE) -> None:
        try:
            with anyio.fail_after(timeout):
                while not predicate():
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"kubelet stand-in: no {what} within {timeout} s; registrations={len(self.registrations)} "
                f"refused={self.refused} dial failures={self.dial_failures} updates={len(self.updates)}"
            ) from None

    async def wait_registrations(self, count: int, timeout: float = PATIENCE) -> list[Registration]:
        await self.wait_for(lambda: len(self.registrations) >= count, f"{count} registration(s)", timeout)
        return list(self.registrations)

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    # Registration ---------------------------------------------------------------------------------------
    async def register(self, message: RegisterRequest) -> Empty:
        self.attempts.append(time.monotonic())
        if self.refused < self.refuse:
            self.refused += 1
            self._notify()
            raise GRPCError(Status.UNAVAILABLE, "kubelet stand-in refuses for now")
        endpoint = self.directory / message.endpoint
        present = endpoint.is_socket()
        channel = LocalChannel(endpoint)
        stub = DevicePluginStub(channel)
        try:
            await stub.get_device_plugin_options(timeout=_DIAL_TIMEOUT)
        except (GRPCError, OSError, StreamTerminatedError, TimeoutError) as exc:
            channel.close()
            self.dial_failures.append(f"{type(exc).__name__}: {exc}")
            self._notify()
            raise GRPCError(Status.UNKNOWN, f"failed to dial device plugin: {exc}") from None
        old = self._watches.pop(message.resource_name, None)
        task = asyncio.create_task(self._follow(stub, message.resource_name))
        self._watches[message.resource_name] = _Watch(channel, task)
        if old is not None:
            old.task.cancel()
            old.channel.close()
        self.registrations.append(Registration(message.resource_name, message.endpoint, present))
        self._notify()
        return Empty()

    async def _follow(self, stub: DevicePluginStub, resource: str) -> None:
        try:
            async for update in stub.list_and_watch():
                self.updates.append((resource, [device.id for device in update.devices]))
                self._notify()
        except (GRPCError, OSError, StreamTerminatedError):
            pass
        finally:
            self.streams_ended += 1
            self._notify()
