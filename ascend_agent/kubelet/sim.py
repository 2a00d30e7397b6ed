"""A kubelet stand-in for local development: ``ascend-agent kubelet-sim --kubelet-dir DIR``.

It does what the kubelet's device manager does with a plugin, and prints it: serves Registration on
``DIR/kubelet.sock``, dials the plugin back inside Register, asks for its options, follows ListAndWatch,
and after the first device list allocates ``--allocate`` healthy devices (through GetPreferredAllocation
when the plugin offers it).

Unlike a starting kubelet it deletes nothing it did not create: it refuses a directory where
``kubelet.sock`` already exists (a live kubelet, or a stale socket someone must look at), leaves every
other socket alone, and at exit removes ``kubelet.sock`` only while it is still the socket it bound (one
line and exit status 1 when it cannot). It makes no directory: a missing ``--kubelet-dir`` is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import sys
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
from ascend_agent.config import ConfigError
from ascend_agent.kubelet.deviceplugin.kubelet import API_VERSION, KUBELET_SOCKET
from ascend_agent.kubelet.deviceplugin.transport import LocalChannel, socket_identity
from ascend_agent.stopping import ignore_while_stopping

_DIAL_TIMEOUT = 10.0
_PROBE_TIMEOUT = 2.0


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
    """Serve until SIGINT or SIGTERM; the exit status. :class:`ConfigError` when ``directory`` is not free."""
    _refuse_unless_directory(directory)
    socket_path = directory / KUBELET_SOCKET
    await _refuse_if_taken(socket_path)
    service = _Registration(directory, allocate)
    server = Server([service])
    try:
        await server.start(path=str(socket_path))
    except OSError as exc:
        raise ConfigError(f"cannot listen on {socket_path}: {exc.strerror or exc}") from None
    bound = socket_identity(socket_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # Only now: whoever waits for this line may stop us at once, and gets a clean exit.
    _say(f"listening on {socket_path}")
    await stop.wait()
    # A second signal (the walk-through's clean-up after Ctrl-C) must find no handler of the loop: closing,
    # the loop closes its wakeup socket before it removes them, and a signal in between prints a traceback.
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(signum)
    ignore_while_stopping()
    service.stop()
    server.close()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.wait_closed(), 0.5)
    if bound is not None and socket_identity(socket_path) == bound:
        try:
            socket_path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            print(
                f"kubelet-sim: cannot remove {socket_path}: {exc.strerror or exc}; remove it yourself before "
                "the next kubelet-sim there (it refuses a directory that holds a kubelet.sock)",
                file=sys.stderr,
                flush=True,
            )
            return 1
    return 0


def _refuse_unless_directory(directory: Path) -> None:
    """Raise :class:`ConfigError` unless ``directory`` is one: the simulator makes none (a path mistyped
    would be made, and served in, without a word)."""
    try:
        mode = os.stat(directory).st_mode
    except FileNotFoundError:
        raise ConfigError(
            f"--kubelet-dir {directory} does not exist; make an empty scratch directory first (mktemp -d)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot check --kubelet-dir {directory}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(mode):
        raise ConfigError(f"--kubelet-dir {directory} is not a directory; pass an empty scratch directory")


async def _refuse_if_taken(socket_path: Path) -> None:
    """Raise :class:`ConfigError` when anything is at ``socket_path``: listening on it would replace it."""
    try:
        mode = os.lstat(socket_path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"cannot check {socket_path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"{socket_path} exists and is not a socket; pass an empty scratch --kubelet-dir")
    try:
        async with asyncio.timeout(_PROBE_TIMEOUT):
            _, writer = await asyncio.open_unix_connection(str(socket_path))
    except ConnectionRefusedError:
        raise ConfigError(
            f"{socket_path} exists but nothing answers (a stopped kubelet or an earlier kubelet-sim); "
            "remove it yourself if it is stale, or pass another --kubelet-dir"
        ) from None
    except (OSError, TimeoutError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "no answer in time"
        raise ConfigError(
            f"{socket_path} exists and cannot be checked ({reason}); refusing to replace it"
        ) from None
    writer.close()
    raise ConfigError(
        f"{socket_path} accepts connections: a kubelet is running there; "
        "kubelet-sim never replaces it, pass a scratch --kubelet-dir"
    )
