"""The limits every served socket has by construction (``transport.BoundedServer``), met by raw HTTP/2
clients: streams reset before their handler ran, a reset flood, a frame of an unknown type, idle connections,
requests whose body never comes, and an oversized request on the plugin-watcher registration socket."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import unquote

import anyio
import h2.errors
import pytest
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from ascend_agent.echo import MOST_LINE
from ascend_agent.kubelet.deviceplugin import wire
from ascend_agent.kubelet.deviceplugin.service import DevicePluginService
from ascend_agent.kubelet.deviceplugin.transport import BoundedServer, Limits
from ascend_agent.kubelet.deviceplugin.wire import BytesCodec
from ascend_agent.kubelet.plugin_watcher import WatcherRegistration
from ascend_agent.model import Chip, ContainerBase
from tests.support.h2_client import RawGrpcClient, grpc_message, request_headers

ALLOCATE = "/v1beta1.DevicePlugin/Allocate"
GET_INFO = "/pluginregistration.Registration/GetInfo"
CHIPS = [Chip.make(i, "910B4") for i in range(4)]


def _allocate(device_id: str) -> bytes:
    inner = wire.varint(1 << 3 | 2) + wire.varint(len(device_id)) + device_id.encode()
    return grpc_message(wire.varint(1 << 3 | 2) + wire.varint(len(inner)) + inner)


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait, up to 5 s, for ``condition`` (the server side settles on the event loop we share)."""
    with anyio.fail_after(5):
        while not condition():
            await asyncio.sleep(0.01)
    assert condition(), what


@pytest.fixture
async def serve(short_dir: Path) -> AsyncIterator[Callable[[Limits], object]]:
    servers: list[BoundedServer] = []

    async def start(limits: Limits) -> tuple[BoundedServer, str]:
        service = DevicePluginService("huawei.com/Ascend910", on_stream_change=lambda: None)
        service.publish({c.device_id: c for c in CHIPS}, None, ContainerBase())
        server = BoundedServer([service], codec=BytesCodec(), limits=limits)
        path = short_dir / f"plugin{len(servers)}.sock"
        await server.serve(path)
        servers.append(server)
        return server, str(path)

    yield start  # type: ignore[misc]
    for server in servers:
        await server.shut()


async def _answer(client: RawGrpcClient, path: str, body: bytes) -> int | None:
    stream_id = client.request(path)
    await client.send_bodies({stream_id: body})
    with anyio.fail_after(5):
        answers = await client.wait_answers([stream_id])
    return answers[stream_id].status


async def test_streams_reset_before_their_handler_ran_are_released(serve: Callable[..., object]) -> None:
    """HTTP/2 rapid reset: each HEADERS followed at once by RST_STREAM. grpclib cancels the handler task
    before it starts, so nothing released the stream: the connection's table grew with every reset."""
    server, path = await serve(Limits(max_resets=10_000))  # type: ignore[misc]
    client = await RawGrpcClient.connect(path)
    try:
        for _ in range(150):
            stream_id = client._conn.get_next_available_stream_id()
            client._conn.send_headers(stream_id, request_headers(ALLOCATE))
            client._conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        client._flush()
        assert await _answer(client, ALLOCATE, _allocate("Ascend910-1")) == 0
        await _until(lambda: server.open_streams == 0, f"{server.open_streams} streams kept")
        assert server.connections == 1
    finally:
        client.close()


async def test_a_reset_flood_ends_the_connection(serve: Callable[..., object]) -> None:
    server, path = await serve(Limits(max_resets=50))  # type: ignore[misc]
    client = await RawGrpcClient.connect(path)
    try:
        for _ in range(60):
            stream_id = client._conn.get_next_available_stream_id()
            client._conn.send_headers(stream_id, request_headers(ALLOCATE))
            client._conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        client._flush()
        with anyio.fail_after(5), pytest.raises(ConnectionError):
            while True:
                await client._receive()
        assert client.closed  # a GOAWAY came first
        await _until(lambda: server.connections == 0, "the connection was kept")
    finally:
        client.close()


async def test_a_frame_of_an_unknown_type_is_ignored(serve: Callable[..., object]) -> None:
    """RFC 9113 §4.1: unknown frame types are ignored; grpclib raised on them and dropped the connection."""
    _, path = await serve(Limits())  # type: ignore[misc]
    client = await RawGrpcClient.connect(path)
    try:
        assert await _answer(client, ALLOCATE, _allocate("Ascend910-0")) == 0
        client._writer.write(struct.pack(">I", 4)[1:] + bytes([0xFA, 0]) + struct.pack(">I", 0) + b"junk")
        assert await _answer(client, ALLOCATE, _allocate("Ascend910-1")) == 0
    finally:
        client.close()


async def test_an_idle_connection_is_closed(serve: Callable[..., object]) -> None:
    server, path = await serve(Limits(idle_timeout=0.3))  # type: ignore[misc]
    client = await RawGrpcClient.connect(path)
    try:
        assert await _answer(client, ALLOCATE, _allocate("Ascend910-0")) == 0
        with anyio.fail_after(5), pytest.raises(ConnectionError):
            while True:
                await client._receive()
        await _until(lambda: server.connections == 0, "the idle connection was kept")
    finally:
        client.close()


async def test_a_request_whose_body_never_comes_is_refused_and_released(serve: Callable[..., object]) -> None:
    server, path = await serve(Limits(request_timeout=0.3))  # type: ignore[misc]
    client = await RawGrpcClient.connect(path)
    try:
        stuck = client.request(ALLOCATE)
        with anyio.fail_after(5):
            answer = (await client.wait_answers([stuck]))[stuck]
        assert answer.status == Status.DEADLINE_EXCEEDED.value, answer
        await _until(lambda: server.open_streams == 0, "the stream was kept")
        assert await _answer(client, ALLOCATE, _allocate("Ascend910-0")) == 0
    finally:
        client.close()


async def test_the_registration_socket_caps_requests_and_drops_unknown_fields(short_dir: Path) -> None:
    """One GetInfo of 1 MiB of unknown fields kept grpclib's decoder busy for tens of seconds."""
    infos: list[bool] = []
    registration = WatcherRegistration(
        "huawei.com/Ascend910",
        short_dir / "plugin.sock",
        lambda: infos.append(True),
        lambda ok, why: None,
        plugin_type="DevicePlugin",
        versions=("v1beta1",),
    )
    server = BoundedServer([registration])
    path = short_dir / "registration.sock"
    await server.serve(path)
    client = await RawGrpcClient.connect(str(path))
    try:
        flood = b"\x78\x01" * (512 * 1024)  # field 15, varint 1: unknown to InfoRequest
        stream_id = client.request(GET_INFO)
        client._conn.send_data(stream_id, grpc_message(flood)[:16384])
        client._flush()
        with anyio.fail_after(5):
            answer = (await client.wait_answers([stream_id]))[stream_id]
        assert answer.status == Status.RESOURCE_EXHAUSTED.value, answer
        assert await _answer(client, GET_INFO, grpc_message(flood[: 60 * 1024])) == 0
        assert infos == [True]
    finally:
        client.close()
        await server.shut()


class _EchoingService:
    """A service whose refusal echoes the whole request, as a careless handler would."""

    def __mapping__(self) -> dict[str, Handler]:
        return {"/test.Echo/Say": Handler(self._say, Cardinality.UNARY_UNARY, bytes, bytes)}

    async def _say(self, stream: Stream[bytes, bytes]) -> None:
        said = await stream.recv_message()
        raise GRPCError(Status.INVALID_ARGUMENT, f"unknown device {(said or b'').decode()}")


async def test_a_refusal_that_echoes_a_long_request_is_cut_to_one_bounded_line(short_dir: Path) -> None:
    """A 60 KB device ID echoed whole into grpc-message took seconds to send (HPACK in pure Python), and a
    grpc-go or grpcio client drops a header that long (its 16 KiB metadata limit) for RESOURCE_EXHAUSTED."""
    server = BoundedServer([_EchoingService()], codec=BytesCodec())
    path = short_dir / "echo.sock"
    await server.serve(path)
    client = await RawGrpcClient.connect(str(path))
    try:
        stream_id = client.request("/test.Echo/Say")
        await client.send_bodies({stream_id: grpc_message(b"Ascend910-" + b"9" * 60_000)})
        with anyio.fail_after(10):
            answer = (await client.wait_answers([stream_id]))[stream_id]
        assert answer.status == Status.INVALID_ARGUMENT.value
        message = unquote(answer.message)
        assert len(message) < MOST_LINE + 40, len(message)
        assert message.startswith("unknown device Ascend910-999") and message.endswith("(60025 characters)")
    finally:
        client.close()
        await server.shut()
