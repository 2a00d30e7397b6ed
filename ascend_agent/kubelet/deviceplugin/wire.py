"""The protobuf bytes of the DevicePlugin API that the agent sends and reads on its hot paths.

Answers are built once and kept as bytes: a ListAndWatchResponse is its devices' entries side by side, so a
change re-encodes only the devices that changed. Requests are read by :func:`allocate_request` and
:func:`preferred_request`, which walk the wire format once and skip unknown fields in linear time (a general
decoder that keeps unknown fields can take seconds on a hostile request)::

    devices = DeviceList()
    snapshot = devices.encode({"Ascend910-0": chip})
    allocate_request(b"\\x0a\\x0d\\x0a\\x0bAscend910-0")   # -> [['Ascend910-0']]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from grpclib.encoding.base import CodecBase

from ascend_agent._proto.v1beta1 import (
    CdiDevice,
    ContainerAllocateResponse,
    ContainerPreferredAllocationResponse,
    Device,
    DevicePluginOptions,
    DeviceSpec,
    Mount,
    NumaNode,
    TopologyInfo,
)
from ascend_agent.model import Chip, ContainerSpec, Health

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not a valid encoding of the expected message."""


def repeated_entry(payload: bytes) -> bytes:
    """``payload`` as one entry of the repeated message field 1 (tag, varint length, bytes).

    >>> repeated_entry(b"abc")
    b'\\n\\x03abc'
    """
    return b"\x0a" + varint(len(payload)) + payload


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint.

    >>> varint(300)
    b'\\xac\\x02'
    """
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def fields(data: bytes | memoryview, wanted: frozenset[int]) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) for the ``wanted`` fields of the message ``data``, in their order:
    an int for varints, a slice of ``data`` for the rest (a memoryview's slices copy nothing). Every other
    field is stepped over; :class:`WireError` when the bytes do not decode.

    >>> [bytes(value) for _, _, value in fields(memoryview(b"\\x0a\\x01a\\x12\\x01b"), frozenset((2,)))]
    [b'b']
    """
    for number, kind, value, _ in _walk(data, wanted):
        yield number, kind, value


def only_fields(data: bytes, wanted: frozenset[int]) -> bytes:
    """The message ``data`` with only its ``wanted`` fields, as they were encoded: what a decoder that keeps
    unknown fields can then read in time linear in what is kept. :class:`WireError` when it does not decode.

    >>> only_fields(b"\\x08\\x01\\x10\\x02\\x08\\x03", frozenset((1,)))
    b'\\x08\\x01\\x08\\x03'
    """
    return b"".join(data[start:end] for _, _, _, (start, end) in _walk(data, wanted, spans=True))


def _walk(
    data: bytes | memoryview, wanted: frozenset[int], spans: bool = False
) -> Iterator[tuple[int, int, Any, tuple[int, int]]]:
    """(field number, wire type, value, (start, end) of the whole field when ``spans``) for the ``wanted``
    fields. Every other field is checked and stepped over without being copied; one-byte varints, what a
    request full of junk is made of, take the short way."""
    at, end = 0, len(data)
    no_span = (0, 0)
    while at < end:
        start = at
        key = data[at]
        if key < 0x80:
            at += 1
        else:
            key, at = _read_varint(data, at)
        number, kind = key >> 3, key & 0x7
        if number == 0:
            raise WireError("field number 0")
        if kind == _VARINT:
            if at < end and data[at] < 0x80:
                value, at = data[at], at + 1
            else:
                value, at = _read_varint(data, at)
            if number in wanted:
                yield number, kind, value, (start, at) if spans else no_span
            continue
        if kind == _LENGTH_DELIMITED:
            if at < end and data[at] < 0x80:
                size, at = data[at], at + 1
            else:
                size, at = _read_varint(data, at)
        elif kind == _FIXED64:
            size = 8
        elif kind == _FIXED32:
            size = 4
        else:
            raise WireError(f"unsupported wire type {kind}")
        if at + size > end:
            raise WireError("a field runs past the end of the message")
        if number in wanted:
            yield (
                number,
                kind,
                (b"" if spans else data[at : at + size]),
                (start, at + size) if spans else no_span,
            )
        at += size


_FIRST = frozenset((1,))
_SIZE = frozenset((3,))


def _strings(data: bytes, number: int) -> list[str]:
    """The values of the repeated string field ``number`` of a message."""
    found = []
    for _, kind, value in fields(data, frozenset((number,))):
        if kind != _LENGTH_DELIMITED:
            raise WireError(f"field {number} is not a string")
        try:
            found.append(value.decode("utf-8"))
        except UnicodeDecodeError:
            raise WireError(f"field {number} is not UTF-8") from None
    return found


def _entries(data: bytes) -> list[bytes]:
    """The embedded messages of the repeated field 1 (``container_requests``)."""
    entries = []
    for _, kind, value in fields(data, _FIRST):
        if kind != _LENGTH_DELIMITED:
            raise WireError("container_requests is not a message")
        entries.append(value)
    return entries


def allocate_request(data: bytes) -> list[list[str]]:
    """An AllocateRequest's device IDs, per container request; :class:`WireError` when it does not decode."""
    return [_strings(entry, 1) for entry in _entries(data)]


@dataclass(frozen=True, slots=True)
class PreferredRequest:
    """One ``ContainerPreferredAllocationRequest``."""

    available: list[str]
    must_include: list[str]
    size: int


def preferred_request(data: bytes) -> list[PreferredRequest]:
    """A PreferredAllocationRequest's container requests; :class:`WireError` when it does not decode."""
    requests = []
    for entry in _entries(data):
        size = 0
        for _, kind, value in fields(entry, _SIZE):
            if kind != _VARINT:
                raise WireError("allocation_size is not an integer")
            size = value - (1 << 64) if value >= 1 << 63 else value  # int32 negatives are 10-byte varints
        requests.append(PreferredRequest(_strings(entry, 1), _strings(entry, 2), size))
    return requests


def preferred_response(choices: list[list[str]]) -> bytes:
    """The encoded PreferredAllocationResponse: one container response per request, in order."""
    return b"".join(
        repeated_entry(bytes(ContainerPreferredAllocationResponse(device_i_ds=chosen))) for chosen in choices
    )


def options(*, preferred_allocation: bool) -> bytes:
    return bytes(
        DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=preferred_allocation)
    )


class DeviceList:
    """Encodes ListAndWatchResponses, re-encoding only the devices that changed since the last one."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, Health, int | None], bytes] = {}

    def encode(self, devices: Mapping[str, Chip]) -> bytes:
        """The ListAndWatchResponse advertising ``devices`` (advertised ID -> chip)."""
        entries = {}
        for device_id, chip in devices.items():
            key = (device_id, chip.health, chip.numa_node)
            entries[key] = self._entries.get(key) or repeated_entry(bytes(_device(device_id, chip)))
        self._entries = entries
        return b"".join(entries.values())


def _device(device_id: str, chip: Chip) -> Device:
    topology = None if chip.numa_node is None else TopologyInfo(nodes=[NumaNode(id=chip.numa_node)])
    return Device(id=device_id, health=chip.health.value, topology=topology)


def container_response(spec: ContainerSpec) -> bytes:
    """One ``container_responses`` entry of an AllocateResponse."""
    message = ContainerAllocateResponse(
        envs=dict(spec.envs),
        devices=[
            DeviceSpec(container_path=n.container_path, host_path=n.host_path, permissions=n.permissions)
            for n in spec.devices
        ],
        mounts=[
            Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in spec.mounts
        ],
        cdi_devices=[CdiDevice(name=name) for name in spec.cdi_devices],
    )
    return repeated_entry(bytes(message))


class BytesCodec(CodecBase):
    """grpclib's codec for the plugin socket: answers leave as the bytes they already are. Requests are read
    by the service itself, length prefix first (``service._request``), so nothing here decodes them."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        if not isinstance(message, bytes):
            raise TypeError(f"the plugin socket sends bytes, not {type(message).__name__}")
        return message

    def decode(self, data: bytes, message_type: Any) -> bytes:
        return data
