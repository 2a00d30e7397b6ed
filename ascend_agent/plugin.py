"""One DevicePlugin gRPC server per resource, on ``<kubelet-dir>/<Resource>.sock``.

The agent publishes the devices; the server fans them out to every open ListAndWatch stream and answers
Allocate from what was published, with no I/O on the request path::

    server = PluginServer("huawei.com/Ascend910", Path("/var/lib/kubelet/device-plugins/Ascend910.sock"),
                          spec_for=backend.container_spec)
    server.publish({chip.device_id: chip for chip in chips})
    await server.start()
    await server.check()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ascend_agent._proto.v1beta1 import (
    AllocateRequest,
    CdiDevice,
    ContainerAllocateResponse,
    ContainerPreferredAllocationResponse,
    Device,
    DevicePluginOptions,
    DevicePluginStub,
    DeviceSpec,
    Mount,
    NumaNode,
    PreferredAllocationRequest,
    PreferredAllocationResponse,
    PreStartContainerRequest,
    TopologyInfo,
)
from ascend_agent.grpcserver import GrpcServer
from ascend_agent.kubelet import LocalChannel, socket_identity
from ascend_agent.model import MAX_DEVICE_ID_LENGTH, Chip, ContainerSpec, Health
from ascend_agent.observability import ALLOCATE_SECONDS, ALLOCATIONS, STREAMS

log = logging.getLogger(__name__)

SpecFor = Callable[[Sequence[Chip]], ContainerSpec]
# (available, must_include, size) -> the preferred IDs
Preference = Callable[[Sequence[str], Sequence[str], int], list[str]]
StreamsChanged = Callable[[str, int], None]

_SHUTDOWN_GRACE = 0.3
# Distinct chip sets and requests whose Allocate answers are kept: the kubelet asks for few; these bound a
# bad client.
_MAX_CACHED_RESPONSES = 4096
_MAX_CACHED_REQUEST_BYTES = 4096
_SELF_CHECK_TIMEOUT = 2.0
_SERVICE = "/v1beta1.DevicePlugin"


class PluginServer:
    """The DevicePlugin service of one resource and the socket it listens on."""

    def __init__(
        self,
        resource: str,
        socket_path: Path,
        spec_for: SpecFor,
        *,
        on_streams_changed: StreamsChanged | None = None,
    ) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self._spec_for_ = spec_for
        self._on_streams_changed = on_streams_changed
        self._devices: dict[str, Chip] = {}
        self._preference: Preference | None = None
        self._snapshot = b""  # the encoded ListAndWatchResponse
        self._device_entries: dict[tuple[str, Health, int | None], bytes] = {}
        self._changed = asyncio.Event()
        self._responses: dict[tuple[int, ...], bytes] = {}
        self._answers: dict[bytes, bytes] = {}
        self._streams: set[object] = set()  # the open streams of the incarnation serving now
        self._server: GrpcServer | None = None
        self._allocated = ALLOCATIONS.labels(resource=resource, code="OK")
        self._identity: tuple[int, int] | None = None
        # Which incarnation of the server is up, and how often the kubelet dialled it (GetDevicePluginOptions,
        # which the kubelet calls inside Register): tells whether a registration reached this incarnation.
        self._generation = 0
        self._dials = 0

    @property
    def spec_for(self) -> SpecFor:
        return self._spec_for_

    @spec_for.setter
    def spec_for(self, spec_for: SpecFor) -> None:
        """A new source of container specs (the config changed): forget the cached Allocate answers."""
        self._spec_for_ = spec_for
        self._responses.clear()
        self._answers.clear()

    @property
    def streams(self) -> int:
        """How many ListAndWatch streams are open now on the server serving now."""
        return len(self._streams)

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def options(self) -> DevicePluginOptions:
        return DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=self._preference is not None
        )

    def socket_is_ours(self) -> bool:
        """True while the socket file we listen on is still there (the kubelet wipes it when it restarts)."""
        return self._identity is not None and socket_identity(self.socket_path) == self._identity

    def publish(self, devices: Mapping[str, Chip], preference: Preference | None = None) -> bool:
        """Advertise ``devices`` (advertised ID -> chip); wake every stream if anything changed."""
        self._preference = preference
        if devices == self._devices and self._devices:
            return False
        self._devices = dict(devices)
        # ListAndWatchResponse is one repeated field: its encoding is the devices' entries side by side, so
        # only the devices that changed are encoded again (1024 devices: milliseconds, not 50 ms).
        entries = {}
        for device_id, chip in devices.items():
            key = (device_id, chip.health, chip.numa_node)
            entries[key] = self._device_entries.get(key) or _repeated_field_entry(
                bytes(_device(device_id, chip))
            )
        self._device_entries = entries
        self._snapshot = b"".join(entries.values())
        self._responses.clear()
        self._answers.clear()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return True

    async def start(self) -> None:
        """Listen on a fresh socket (a stale file is removed first), mode 0600."""
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = GrpcServer(
            unary={
                f"{_SERVICE}/GetDevicePluginOptions": lambda _: bytes(self.options_asked()),
                f"{_SERVICE}/GetPreferredAllocation": self._preferred_allocation_rpc,
                f"{_SERVICE}/Allocate": self._allocate_rpc,
                f"{_SERVICE}/PreStartContainer": lambda _: b"",
            },
            streaming={f"{_SERVICE}/ListAndWatch": lambda _: self.list_and_watch()},
        )
        await server.start(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        self._server = server
        self._identity = socket_identity(self.socket_path)
        self._generation += 1
        self._dials = 0
        self._streams = set()

    async def check(self) -> None:
        """Dial our own socket and make a call, as the kubelet will; raise on failure. The call is
        PreStartContainer, which the kubelet never makes here, so GetDevicePluginOptions counts only the
        kubelet's dials."""
        channel = LocalChannel(self.socket_path)
        try:
            await DevicePluginStub(channel).pre_start_container(
                PreStartContainerRequest(), timeout=_SELF_CHECK_TIMEOUT
            )
        finally:
            channel.close()

    def dial_mark(self) -> tuple[int, int]:
        """A mark to pass to :meth:`dialled_since` later."""
        return self._generation, self._dials

    def dialled_since(self, mark: tuple[int, int]) -> bool:
        """True when a client has asked the server now serving for its options since ``mark`` was taken."""
        generation, dials = mark
        return self._dials > (dials if generation == self._generation else 0)

    def options_asked(self) -> DevicePluginOptions:
        self._dials += 1
        return self.options

    async def stop(self) -> None:
        """Stop serving, end every stream, and remove the socket if it is still ours."""
        server, self._server = self._server, None
        if server is None:
            return
        if self.socket_is_ours():
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self._identity = None
        server.close()
        # On Python 3.12+ wait_closed() also waits for every connection to finish closing, which takes as
        # long as a client takes to read what is still buffered for it: bound the wait, so shutdown is prompt.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), _SHUTDOWN_GRACE)

    async def list_and_watch(self) -> AsyncGenerator[bytes, None]:
        """The encoded device list now, then again after every change, until the client goes away."""
        streams, token = self._streams, object()
        streams.add(token)
        self._streams_changed()
        try:
            sent: bytes | None = None
            while True:
                snapshot, changed = self._snapshot, self._changed
                if snapshot is not sent:
                    yield snapshot
                    sent = snapshot
                await changed.wait()
        finally:
            streams.discard(token)
            # A stream of an earlier incarnation ending says nothing about the kubelet's current stream.
            if streams is self._streams:
                self._streams_changed()

    def _streams_changed(self) -> None:
        STREAMS.labels(resource=self.resource).set(len(self._streams))
        if self._on_streams_changed is not None:
            self._on_streams_changed(self.resource, len(self._streams))

    def allocate(self, request: bytes) -> bytes:
        """The encoded AllocateResponse to an encoded AllocateRequest: one container response per container
        request, in order; GRPCError names a bad ID. The kubelet repeats the same requests, so answers are
        kept by the request's bytes until the devices change."""
        answer = self._answers.get(request)
        if answer is not None:
            return answer
        try:
            message = AllocateRequest.parse(request)
        except Exception as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, f"AllocateRequest does not decode: {exc}") from None
        answer = b"".join(
            # A malformed entry can decode as None: it names no devices.
            self._container_response(index, container.devices_ids if container else [])
            for index, container in enumerate(message.container_requests, start=1)
        )
        if len(request) <= _MAX_CACHED_REQUEST_BYTES:
            if len(self._answers) >= _MAX_CACHED_RESPONSES:
                self._answers.clear()
            self._answers[request] = answer
        return answer

    def _allocate_rpc(self, request: bytes) -> bytes:
        started = time.perf_counter()
        try:
            answer = self.allocate(request)
        except GRPCError as exc:
            ALLOCATIONS.labels(resource=self.resource, code=exc.status.name).inc()
            log.warning("Allocate refused for %s: %s", self.resource, exc.message)
            raise
        finally:
            ALLOCATE_SECONDS.observe(time.perf_counter() - started)
        self._allocated.inc()
        return answer

    def _container_response(self, index: int, device_ids: Sequence[str]) -> bytes:
        """The encoded ``container_responses`` entry for one container request."""
        if not device_ids:
            raise GRPCError(
                Status.INVALID_ARGUMENT, f"container request {index} for {self.resource} names no devices"
            )
        chips: dict[int, Chip] = {}
        seen: set[str] = set()
        for device_id in device_ids:
            chip = self._checked_chip(device_id, seen)
            chips[chip.phys_id] = chip
        key = tuple(sorted(chips))
        entry = self._responses.get(key)
        if entry is None:
            spec = self._spec_for_([chips[phys_id] for phys_id in key])
            entry = _repeated_field_entry(bytes(_container_response(spec)))
            if len(self._responses) >= _MAX_CACHED_RESPONSES:
                self._responses.clear()
            self._responses[key] = entry
        return entry

    def _checked_chip(self, device_id: str, seen: set[str]) -> Chip:
        if len(device_id) > MAX_DEVICE_ID_LENGTH:
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"device ID {device_id[:MAX_DEVICE_ID_LENGTH]!r}... is {len(device_id)} characters, "
                f"over the {MAX_DEVICE_ID_LENGTH} the device plugin API allows",
            )
        if device_id in seen:
            raise GRPCError(
                Status.INVALID_ARGUMENT, f"device {device_id!r} is named twice in one container request"
            )
        seen.add(device_id)
        chip = self._devices.get(device_id)
        if chip is None:
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"unknown device {device_id!r} for {self.resource}: "
                f"this node advertises {self._id_summary()}",
            )
        if not chip.healthy:
            raise GRPCError(
                Status.FAILED_PRECONDITION,
                f"device {device_id!r} is Unhealthy ({chip.reason or 'no reason reported'}); "
                "the kubelet will stop offering it once it reads the next device list",
            )
        return chip

    def _id_summary(self) -> str:
        ids = sorted(self._devices)
        if not ids:
            return "no devices"
        return ", ".join(ids) if len(ids) <= 4 else f"{len(ids)} devices, {ids[0]} .. {ids[-1]}"

    def preferred_allocation(self, request: PreferredAllocationRequest) -> PreferredAllocationResponse:
        responses = []
        for container in request.container_requests:
            available = list(container.available_deviceIDs)
            must_include = list(container.must_include_deviceIDs)
            size = container.allocation_size
            if self._preference is not None:
                chosen = self._preference(available, must_include, size)
            else:
                chosen = list(dict.fromkeys([*must_include, *available]))[: max(size, 0)]
            responses.append(ContainerPreferredAllocationResponse(device_i_ds=chosen))
        return PreferredAllocationResponse(container_responses=responses)

    def _preferred_allocation_rpc(self, request: bytes) -> bytes:
        try:
            message = PreferredAllocationRequest.parse(request)
        except Exception as exc:
            raise GRPCError(
                Status.INVALID_ARGUMENT, f"PreferredAllocationRequest does not decode: {exc}"
            ) from None
        return bytes(self.preferred_allocation(message))


def _repeated_field_entry(payload: bytes) -> bytes:
    """``payload`` as one entry of the repeated message field 1 (tag, varint length, bytes)."""
    length = len(payload)
    varint = bytearray()
    while length > 0x7F:
        varint.append(length & 0x7F | 0x80)
        length >>= 7
    varint.append(length)
    return b"\x0a" + bytes(varint) + payload


def _device(device_id: str, chip: Chip) -> Device:
    topology = None if chip.numa_node is None else TopologyInfo(nodes=[NumaNode(id=chip.numa_node)])
    return Device(id=device_id, health=chip.health.value, topology=topology)


def _container_response(spec: ContainerSpec) -> ContainerAllocateResponse:
    return ContainerAllocateResponse(
        envs=dict(spec.envs),
        devices=[
            DeviceSpec(
                container_path=node.container_path, host_path=node.host_path, permissions=node.permissions
            )
            for node in spec.devices
        ],
        mounts=[
            Mount(container_path=mount.container_path, host_path=mount.host_path, read_only=mount.read_only)
            for mount in spec.mounts
        ],
        cdi_devices=[CdiDevice(name=name) for name in spec.cdi_devices],
    )
