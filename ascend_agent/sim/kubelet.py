"""A kubelet stand-in for local development: ``ascend-agent kubelet-sim --kubelet-dir DIR``.

It does what the kubelet's device manager does with a plugin, and prints it: serves Registration on
``DIR/kubelet.sock`` (removing the other sockets first, as a starting kubelet does), dials the plugin
back inside Register, asks for its options, follows ListAndWatch, and after the first device list
allocates ``--allocate`` healthy devices (through GetPreferredAllocation when the plugin offers it).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from ascend_agent._proto.v1beta1 import (
    AllocateRequest,
    ContainerAllocateRequest,
    ContainerPreferredAllocationRequest,
    DevicePluginStub,
    Empty,
    ListAndWatchResponse,
    PreferredAllocationRequest,
    RegisterRequest,
    RegistrationBase,
)
from ascend_agent.deviceplugin.kubelet import API_VERSION, KUBELET_SOCKET, LocalChannel

_DIAL_TIMEOUT = 10.0


def _say(text: str) -> None:
    print(f"kubelet-sim: {text}", flush=True)


class _Registration(RegistrationBase):
    def __init__(self, directory: Path, allocate: int) -> None:
        self._directory = directory
        self._allocate = allocate
        self._watches: dict[str, asyncio.Task[None]] = {}

    async def register(self, message: RegisterRequest) -> Empty:
        if message.version != API_VERSION:
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f'requested API version "{message.version}" is not supported by kubelet',
            )
        _say(f"Register {message.resource_name} at {message.endpoint}")
        channel = LocalChannel(self._directory / message.endpoint)
        options = await DevicePluginStub(channel).get_device_plugin_options(timeout=_DIAL_TIMEOUT)
        _say(
            f"  options: pre_start_required={options.pre_start_required} "
            f"get_preferred_allocation_available={options.get_preferred_allocation_available}"
        )
        old = self._watches.pop(message.resource_name, None)
        if old is not None:
            old.cancel()
        self._watches[message.resource_name] = asyncio.create_task(
            self._watch(channel, message.resource_name, options.get_preferred_allocation_available)
        )
        return Empty()

    async def _watch(self, channel: LocalChannel, resource: str, preferred: bool) -> None:
        stub = DevicePluginStub(channel)
        allocated = False
        try:
            async for update in stub.list_and_watch():
                _print_devices(resource, update)
                if not allocated and self._allocate > 0:
                    allocated = True
                    await self._try_allocate(stub, resource, update, preferred)
            _say(f"ListAndWatch for {resource} ended; devices are Unhealthy until the plugin registers again")
        except (GRPCError, OSError) as exc:
            _say(f"ListAndWatch for {resource} broke: {exc}")
        finally:
            channel.close()

    async def _try_allocate(
        self, stub: DevicePluginStub, resource: str, update: ListAndWatchResponse, preferred: bool
    ) -> None:
        healthy = [device.id for device in update.devices if device.health == "Healthy"]
        if len(healthy) < self._allocate:
            _say(f"  cannot allocate {self._allocate} {resource}: only {len(healthy)} healthy")
            return
        chosen = healthy[: self._allocate]
        try:
            if preferred:
                answer = await stub.get_preferred_allocation(
                    PreferredAllocationRequest(
                        container_requests=[
                            ContainerPreferredAllocationRequest(
                                available_deviceIDs=healthy, allocation_size=self._allocate
                            )
                        ]
                    )
                )
                chosen = answer.container_responses[0].device_i_ds
                _say(f"  preferred allocation of {self._allocate}: {', '.join(chosen)}")
            response = await stub.allocate(
                AllocateRequest(container_requests=[ContainerAllocateRequest(devices_ids=chosen)])
            )
        except GRPCError as exc:
            _say(f"  Allocate failed: {exc.status.name}: {exc.message}")
            return
        container = response.container_responses[0]
        _say(f"  Allocate {', '.join(chosen)}:")
        for key, value in sorted(container.envs.items()):
            _say(f"    env {key}={value}")
        for device in container.devices:
            _say(f"    device {device.host_path} -> {device.container_path} ({device.permissions})")
        for mount in container.mounts:
            _say(f"    mount {mount.host_path} -> {mount.container_path}{' (ro)' if mount.read_only else ''}")
        for cdi in container.cdi_devices:
            _say(f"    cdi {cdi.name}")

    def stop(self) -> None:
        for task in self._watches.values():
            task.cancel()


def _print_devices(resource: str, update: ListAndWatchResponse) -> None:
    healthy = sum(device.health == "Healthy" for device in update.devices)
    _say(f"ListAndWatch {resource}: {len(update.devices)} devices, {healthy} healthy")
    for device in update.devices:
        numa = ",".join(str(node.id) for node in device.topology.nodes) if device.topology else "-"
        _say(f"  {device.id:<24} {device.health:<10} numa {numa}")


async def run_simulator(directory: Path, *, allocate: int = 1) -> int:
    """Serve until SIGINT or SIGTERM; the exit status."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.sock"):
        stale.unlink()
    service = _Registration(directory, allocate)
    server = Server([service])
    await server.start(path=str(directory / KUBELET_SOCKET))
    _say(f"listening on {directory / KUBELET_SOCKET}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    service.stop()
    server.close()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.wait_closed(), 0.5)
    with contextlib.suppress(FileNotFoundError):
        (directory / KUBELET_SOCKET).unlink()
    return 0
