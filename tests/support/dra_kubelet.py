"""The kubelet's DRA side, on grpclib: what its plugin watcher and DRA manager do with a DRA driver.

It finds ``<plugins registry>/<driver>-reg.sock`` (``<driver>-<pod uid>-reg.sock`` for a driver that
allows rolling updates), calls GetInfo and NotifyRegistrationStatus, dials the endpoint GetInfo named,
prepares and unprepares claims (DRAPlugin v1 or v1beta1) and keeps a NodeWatchResources stream open,
recording every message; tests wait on what it saw. As kubelets 1.34 to 1.36 do, the stream is
``v1alpha1.DRAResourceHealth`` whatever GetInfo listed; ``health="v1"`` is a newer kubelet, which opens
``v1.DRAResourceHealth`` only when GetInfo lists it::

    kubelet = DraKubelet(registry_dir)
    info = await kubelet.register("npu.huawei.com")
    answer = await kubelet.prepare([Claim(namespace="default", uid=uid, name="train")])
    async with kubelet.watching() as updates:
        await updates.wait_for(lambda seen: ..., "npu-1 UNHEALTHY")
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import anyio

from ascend_agent._proto.dra import v1 as health_v1
from ascend_agent._proto.dra import v1alpha1 as health_v1alpha1
from ascend_agent._proto.dra.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from ascend_agent._proto.dra.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_v1beta1
from ascend_agent._proto.pluginregistration import (
    InfoRequest,
    PluginInfo,
    RegistrationStatus,
    RegistrationStub,
)
from ascend_agent.kubelet.deviceplugin.transport import LocalChannel
from tests.support import PATIENCE

_TIMEOUT = PATIENCE
_LOOK_INTERVAL = 0.01  # the kubelet's plugin watcher is told by fsnotify; this stand-in looks this often


class HealthUpdates:
    """The messages of one NodeWatchResources stream, as {device name: (health name, message)}."""

    def __init__(self) -> None:
        self.seen: list[dict[str, tuple[str, str]]] = []
        self._changed = anyio.Event()

    def add(
        self, response: health_v1.NodeWatchResourcesResponse | health_v1alpha1.NodeWatchResourcesResponse
    ) -> None:
        self.seen.append(
            {d.device.device_name: (d.health.name or "", d.message) for d in response.devices if d.device}
        )
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(
        self, ready: Callable[[dict[str, tuple[str, str]]], bool], what: str, timeout: float = _TIMEOUT
    ) -> None:
        """Wait until the newest message satisfies ``ready``."""
        with anyio.fail_after(timeout):
            while not (self.seen and ready(self.seen[-1])):
                await self._changed.wait()


class DraKubelet:
    def __init__(self, registry: Path) -> None:
        self.registry = registry
        self.info: PluginInfo | None = None

    @property
    def endpoint(self) -> Path:
        assert self.info is not None, "register first"
        return Path(self.info.endpoint)

    async def register(self, driver: str, pod_uid: str = "", timeout: float = _TIMEOUT) -> PluginInfo:
        """Find the driver's registration socket (the one of the pod ``pod_uid``, when given), ask GetInfo,
        and confirm the registration."""
        socket = self.registry / (f"{driver}-{pod_uid}-reg.sock" if pod_uid else f"{driver}-reg.sock")
        with anyio.fail_after(timeout):
            while not socket.exists():
                await anyio.sleep(_LOOK_INTERVAL)
        channel = LocalChannel(socket)
        try:
            stub = RegistrationStub(channel)
            info = await stub.get_info(InfoRequest(), timeout=timeout)
            await stub.notify_registration_status(RegistrationStatus(plugin_registered=True), timeout=timeout)
        finally:
            channel.close()
        self.info = info
        return info

    async def prepare(
        self, claims: Sequence[dra_v1.Claim], timeout: float = _TIMEOUT
    ) -> dra_v1.NodePrepareResourcesResponse:
        channel = LocalChannel(self.endpoint)
        try:
            return await dra_v1.DraPluginStub(channel).node_prepare_resources(
                dra_v1.NodePrepareResourcesRequest(claims=list(claims)), timeout=timeout
            )
        finally:
            channel.close()

    async def prepare_v1beta1(
        self, claims: Sequence[dra_v1beta1.Claim], timeout: float = _TIMEOUT
    ) -> dra_v1beta1.NodePrepareResourcesResponse:
        channel = LocalChannel(self.endpoint)
        try:
            return await dra_v1beta1.DraPluginStub(channel).node_prepare_resources(
                dra_v1beta1.NodePrepareResourcesRequest(claims=list(claims)), timeout=timeout
            )
        finally:
            channel.close()

    async def unprepare(
        self, claims: Sequence[dra_v1.Claim], timeout: float = _TIMEOUT
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        channel = LocalChannel(self.endpoint)
        try:
            return await dra_v1.DraPluginStub(channel).node_unprepare_resources(
                dra_v1.NodeUnprepareResourcesRequest(claims=list(claims)), timeout=timeout
            )
        finally:
            channel.close()

    @contextlib.asynccontextmanager
    async def watching(self, health: str = "v1alpha1") -> AsyncIterator[HealthUpdates]:
        """A NodeWatchResources stream of the ``health`` version, read in a task of its own while the block
        runs."""
        assert self.info is not None, "register first"
        if health == "v1":
            assert "v1.DRAResourceHealth" in self.info.supported_versions, (
                "a kubelet opens only what is listed"
            )
        api = health_v1 if health == "v1" else health_v1alpha1
        updates = HealthUpdates()
        channel = LocalChannel(self.endpoint)

        async def read() -> None:
            stub = api.DraResourceHealthStub(channel)
            async for response in stub.node_watch_resources(api.NodeWatchResourcesRequest()):
                updates.add(response)

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(read)
                yield updates
                tasks.cancel_scope.cancel()
        finally:
            channel.close()
