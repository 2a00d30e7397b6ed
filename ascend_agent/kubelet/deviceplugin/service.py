"""The five DevicePlugin RPCs of one resource, for a grpclib server, answered from what was last published.

Nothing on a request path does I/O: Allocate and GetPreferredAllocation compute from the published devices,
and the answer entry of each chip set is kept until the devices or what containers get change::

    service = DevicePluginService("huawei.com/Ascend910", on_stream_change=wake)
    service.publish({chip.device_id: chip for chip in chips}, preference, inventory.container)
    server = BoundedServer([service], codec=BytesCodec())
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from ascend_agent.container import container_spec
from ascend_agent.echo import MOST_LINE, cut
from ascend_agent.kubelet.deviceplugin import wire
from ascend_agent.kubelet.deviceplugin.transport import DEFAULT_LIMITS, connection_of
from ascend_agent.model import Chip, ContainerBase
from ascend_agent.naming import MAX_DEVICE_ID_LENGTH
from ascend_agent.observability import (
    ALLOCATE_SECONDS,
    ALLOCATIONS,
    KUBELET_STREAM,
    STREAMS,
    RepeatLimiter,
    log_fields,
)

log = logging.getLogger(__name__)

# The kubelet's device IDs of each container of an Allocate -> the IDs to hand over instead (a scheduler's
# choice). It may wait, asynchronously, inside that one call; LookupError refuses the Allocate with its words.
DeviceIdRemapper = Callable[[Sequence[Sequence[str]]], Awaitable[list[list[str]]]]
# (available, must_include, size) -> the preferred IDs
Preference = Callable[[Sequence[str], Sequence[str], int], list[str]]

_SERVICE = "/v1beta1.DevicePlugin"
# A kubelet's Allocate request is a few hundred bytes per container.
MAX_REQUEST = DEFAULT_LIMITS.max_request
_CACHE_BYTES = 4 * 1024 * 1024
# The kubelet asks for one container per call; a pod's containers, init containers included, stay far below
# this. It bounds the work one request can ask for.
MAX_CONTAINERS = 16
# A client repeating a bad request thousands of times a second gets one log line per this many seconds.
_REFUSAL_LOG_INTERVAL = 10.0


async def _request(stream: Stream[bytes, bytes]) -> bytes:
    """The request's bytes, read and bounded by the transport before the handler ran."""
    request = await stream.recv_message()
    if request is None:
        raise GRPCError(Status.INVALID_ARGUMENT, "the request has no message")
    return request


def _check_containers(count: int) -> None:
    if count > MAX_CONTAINERS:
        raise GRPCError(
            Status.INVALID_ARGUMENT,
            f"a request for {count} containers; the kubelet asks for one at a time, and at most "
            f"{MAX_CONTAINERS} are answered in one call",
        )


def _handed_for(kubelets: Sequence[Sequence[str]], handed: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    """(the kubelet's ID, the device handed over for it), container by container; a container whose count
    differs (no remapper gives one) pairs each device with itself.

    >>> _handed_for([["Ascend910-0", "Ascend910-1"]], [["Ascend910-3", "Ascend910-5"]])
    [('Ascend910-0', 'Ascend910-3'), ('Ascend910-1', 'Ascend910-5')]
    """
    pairs: list[tuple[str, str]] = []
    for asked, given in zip(kubelets, handed, strict=False):
        pairs.extend(
            zip(asked, given, strict=True) if len(asked) == len(given) else zip(given, given, strict=True)
        )
    return pairs


class _BoundedCache:
    """A mapping that holds at most ``limit`` bytes of keys and values; the oldest entries go first."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._size = 0
        self._items: dict[Any, tuple[bytes, int]] = {}

    def get(self, key: Any) -> bytes | None:
        item = self._items.get(key)
        return None if item is None else item[0]

    def put(self, key: Any, value: bytes, size: int) -> None:
        if size > self._limit:
            return
        while self._items and self._size + size > self._limit:
            self._size -= self._items.pop(next(iter(self._items)))[1]
        self._items[key] = (value, size)
        self._size += size

    def clear(self) -> None:
        self._items.clear()
        self._size = 0

    @property
    def size(self) -> int:
        return self._size


class DevicePluginService:
    """The DevicePlugin service of one resource.

    "The kubelet's stream" is the first ListAndWatch opened after :meth:`expect_kubelet` (called as a
    registration starts): on the connection that asked for the options when one did (kubelets since 1.25
    call GetDevicePluginOptions inside Register), else the first at all (older kubelets never ask).
    :attr:`kubelet_stream_open` says whether it is still open, whatever other clients do, and
    ``on_stream_change`` runs when it opens or closes."""

    def __init__(self, resource: str, on_stream_change: Callable[[], None]) -> None:
        self.resource = resource
        self._on_stream_change = on_stream_change
        self._devices: dict[str, Chip] = {}
        self._listed: dict[str, Chip] | None = None
        self._preference: Preference | None = None
        self._most_per_container: int | None = None
        self._container = ContainerBase()
        self._device_list = wire.DeviceList()
        self._snapshot = b""
        self._changed = anyio.Event()
        self._entries = _BoundedCache(_CACHE_BYTES)
        self._options = wire.options(preferred_allocation=False)
        self._streams: set[object] = set()
        self._kubelet_stream: object | None = None
        self._expect_kubelet_stream = False
        self._options_connection: object | None = None
        self.kubelet_streams_opened = 0
        self._allocated = ALLOCATIONS.labels(resource=resource, code="OK")
        self._refusals = RepeatLimiter("allocate_refused", _REFUSAL_LOG_INTERVAL)
        # Told, before the answer is sent, which device each Allocate hands over for each of the kubelet's IDs
        # ((kubelet ID, device) pairs: the same ID twice unless remap_ids chose others). The agent counts them
        # as held, reads PodResources through them, and asks the kubelet which pod got them.
        self.on_allocated: Callable[[Sequence[tuple[str, str]]], None] = lambda pairs: None
        # None: the kubelet's IDs are the chips handed over (no I/O on Allocate's path).
        self.remap_ids: DeviceIdRemapper | None = None

    @property
    def kubelet_stream_open(self) -> bool:
        return self._kubelet_stream is not None

    def expect_kubelet(self) -> None:
        """A registration is starting: the kubelet's next stream is the one to follow."""
        self._expect_kubelet_stream = True
        self._options_connection = None

    @property
    def options(self) -> bytes:
        """The encoded DevicePluginOptions."""
        return self._options

    @property
    def cached_bytes(self) -> int:
        """What the answer cache holds now, keys and values."""
        return self._entries.size

    def publish(
        self,
        devices: Mapping[str, Chip],
        preference: Preference | None,
        container: ContainerBase,
        most_per_container: int | None = None,
        listed: Mapping[str, Chip] | None = None,
    ) -> None:
        """Advertise ``devices`` (advertised ID -> chip); every stream gets the new list if it changed. A
        ``container`` unlike the last (what containers get changed) forgets every answer given. Allocate
        refuses a container request for more than ``most_per_container`` devices (failRequestsGreaterThanOne).
        ``listed`` (the same IDs) is what ListAndWatch advertises instead, when it differs from the chips
        Allocate hands over.
        """
        self._preference = preference
        self._most_per_container = most_per_container
        self._options = wire.options(preferred_allocation=preference is not None)
        if container != self._container:
            self._container = container
            self._entries.clear()
        if devices == self._devices and listed == self._listed and self._snapshot:
            return
        self._devices = dict(devices)
        self._listed = None if listed is None else dict(listed)
        self._entries.clear()
        snapshot = self._device_list.encode(devices if listed is None else listed)
        if snapshot == self._snapshot:
            return  # only what the kubelet does not see changed (a reason): nothing to send
        self._snapshot = snapshot
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def __mapping__(self) -> dict[str, Handler]:
        unary = Cardinality.UNARY_UNARY
        return {
            f"{_SERVICE}/GetDevicePluginOptions": Handler(self._get_options, unary, bytes, bytes),
            f"{_SERVICE}/ListAndWatch": Handler(self._list_and_watch, Cardinality.UNARY_STREAM, bytes, bytes),
            f"{_SERVICE}/GetPreferredAllocation": Handler(self._get_preferred, unary, bytes, bytes),
            f"{_SERVICE}/Allocate": Handler(self._allocate, unary, bytes, bytes),
            f"{_SERVICE}/PreStartContainer": Handler(self._pre_start, unary, bytes, bytes),
        }

    async def _get_options(self, stream: Stream[bytes, bytes]) -> None:
        await _request(stream)
        if self._expect_kubelet_stream and self._options_connection is None:
            self._options_connection = connection_of(stream)
        await stream.send_message(self._options)

    async def _pre_start(self, stream: Stream[bytes, bytes]) -> None:
        await _request(stream)
        await stream.send_message(b"")

    async def _list_and_watch(self, stream: Stream[bytes, bytes]) -> None:
        await _request(stream)
        token = object()
        self._streams.add(token)
        kubelets = self._expect_kubelet_stream and self._options_connection in (None, connection_of(stream))
        if kubelets:
            self._expect_kubelet_stream = False
            self._kubelet_stream = token
            self.kubelet_streams_opened += 1
        self._count_streams(kubelets)
        try:
            sent: bytes | None = None
            while True:
                snapshot, changed = self._snapshot, self._changed
                if snapshot is not sent:
                    await stream.send_message(snapshot)
                    sent = snapshot
                await changed.wait()
        finally:
            self._streams.discard(token)
            kubelets = self._kubelet_stream is token
            if kubelets:
                self._kubelet_stream = None
            self._count_streams(kubelets)

    def _count_streams(self, kubelets: bool) -> None:
        STREAMS.labels(resource=self.resource).set(len(self._streams))
        KUBELET_STREAM.labels(resource=self.resource).set(self.kubelet_stream_open)
        if kubelets:  # other clients' streams change nothing the lifecycle acts on
            self._on_stream_change()

    async def _allocate(self, stream: Stream[bytes, bytes]) -> None:
        request = await _request(stream)
        started = time.perf_counter()
        try:
            kubelets = self._containers(request)
            containers: Sequence[Sequence[str]] = kubelets
            if self.remap_ids is not None:
                containers = await self._remapped(kubelets, self.remap_ids)
            answer, ids = self._answer(containers)
        except GRPCError as exc:
            ALLOCATIONS.labels(resource=self.resource, code=exc.status.name).inc()
            # Keyed by the status, not the words: a client cycling through bad IDs gets no line per ID.
            self._refusals.log(
                log,
                logging.WARNING,
                exc.status,
                "Allocate refused for %s: %s",
                self.resource,
                exc.message,
                extra=log_fields(resource=self.resource, reason=exc.message),
            )
            raise
        finally:
            ALLOCATE_SECONDS.observe(time.perf_counter() - started)
        self._allocated.inc()
        log.info("Allocated %s", ids, extra=log_fields(resource=self.resource, devices=ids.split(",")))
        # Recorded before the answer goes out: a layout run while it is sent must see them held (if the send
        # fails, the record expires unseen).
        self.on_allocated(_handed_for(kubelets, containers))
        await stream.send_message(answer)

    def allocate(self, request: bytes) -> tuple[bytes, str]:
        """The encoded AllocateResponse to an encoded AllocateRequest, and the IDs it hands over; GRPCError
        names a bad ID."""
        return self._answer(self._containers(request))

    async def _remapped(
        self, containers: Sequence[Sequence[str]], remap: DeviceIdRemapper
    ) -> Sequence[Sequence[str]]:
        """The IDs per container, as ``remap`` gives them for the kubelet's."""
        try:
            return await remap(containers)
        except LookupError as exc:
            said = str(exc.args[0] if exc.args else exc)
            raise GRPCError(Status.FAILED_PRECONDITION, cut(said, MOST_LINE)) from None

    def _containers(self, request: bytes) -> list[list[str]]:
        try:
            containers = wire.allocate_request(request)
        except wire.WireError as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, f"AllocateRequest does not decode: {exc}") from None
        _check_containers(len(containers))
        return containers

    def _answer(self, containers: Sequence[Sequence[str]]) -> tuple[bytes, str]:
        entries = [self._container_entry(index, ids) for index, ids in enumerate(containers, start=1)]
        answer = b"".join(entries)
        ids = ";".join(",".join(container) for container in containers)
        return answer, ids

    def _container_entry(self, index: int, device_ids: Sequence[str]) -> bytes:
        if not device_ids:
            raise GRPCError(
                Status.INVALID_ARGUMENT, f"container request {index} for {self.resource} names no devices"
            )
        most = self._most_per_container
        if most is not None and len(device_ids) > most:
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"container request {index} asks for {len(device_ids)} of {self.resource}, whose chips are "
                f"shared: failRequestsGreaterThanOne allows {most} per container (a replica is a slice of a "
                "chip, not a chip)",
            )
        # Keyed by the chip's own device ID: the replicas of one chip are one chip, each vNPU is its own.
        chips: dict[str, Chip] = {}
        seen: set[str] = set()
        for device_id in device_ids:
            chip = self._checked_chip(device_id, seen)
            chips[chip.device_id] = chip
        if len(device_ids) > 1 and any(chip.vnpu is not None for chip in chips.values()):
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"container request {index} names {len(device_ids)} vNPUs of {self.resource}; a container "
                "gets one vNPU (ask for 1, or for a larger template)",
            )
        key = tuple(sorted(chips))
        cached = self._entries.get(key)
        if cached is not None:
            return cached
        entry = wire.container_response(
            container_spec([chips[device_id] for device_id in key], self._container)
        )
        self._entries.put(key, entry, len(entry) + sum(map(len, key)))
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

    async def _get_preferred(self, stream: Stream[bytes, bytes]) -> None:
        request = await _request(stream)
        await stream.send_message(self.preferred_allocation(request))

    def preferred_allocation(self, request: bytes) -> bytes:
        """The encoded PreferredAllocationResponse to an encoded request."""
        try:
            containers = wire.preferred_request(request)
        except wire.WireError as exc:
            raise GRPCError(
                Status.INVALID_ARGUMENT, f"PreferredAllocationRequest does not decode: {exc}"
            ) from None
        _check_containers(len(containers))
        choices = []
        for container in containers:
            if self._preference is not None:
                chosen = self._preference(container.available, container.must_include, container.size)
            else:
                merged = dict.fromkeys([*container.must_include, *container.available])
                chosen = list(merged)[: max(container.size, 0)]
            choices.append(chosen)
        return wire.preferred_response(choices)
