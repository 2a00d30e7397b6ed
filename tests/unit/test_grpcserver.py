"""The plugin socket's gRPC server on its own, on a real socket: grpcio for calls as the kubelet makes them,
h2 for a client that polices flow control, raw frames for what a broken or hostile client sends."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ascend_agent.grpcserver import GrpcServer, Streaming, Unary

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_BIG = bytes(range(256)) * 1200  # 300 KiB: several times every default window


class _Handlers:
    """Handlers that record what happened to them, for the server to call from its own thread."""

    def __init__(self) -> None:
        self.watch_ended = threading.Event()

    def unary(self) -> dict[str, Unary]:
        return {
            "/t.S/Echo": lambda data: data,
            "/t.S/Refuse": self._refuse,
            "/t.S/Crash": self._crash,
        }

    def streaming(self) -> dict[str, Streaming]:
        return {"/t.S/Watch": self._watch, "/t.S/Big": self._big}

    @staticmethod
    def _refuse(data: bytes) -> bytes:
        raise GRPCError(Status.FAILED_PRECONDITION, "chip 3 is ünhealthy: 100% of its HBM failed")

    @staticmethod
    def _crash(data: bytes) -> bytes:
        raise RuntimeError("a bug")

    async def _watch(self, data: bytes) -> AsyncGenerator[bytes, None]:
        try:
            yield b"first"
            await asyncio.Event().wait()
        finally:
            self.watch_ended.set()

    @staticmethod
    async def _big(data: bytes) -> AsyncGenerator[bytes, None]:
        yield _BIG
        yield b"after"


@contextmanager
def _serving(
    directory: Path, handlers: _Handlers
) -> Iterator[tuple[str, GrpcServer, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = GrpcServer(handlers.unary(), handlers.streaming())
    path = str(directory / "grpc.sock")
    asyncio.run_coroutine_threadsafe(server.start(path), loop).result(5)
    try:
        yield path, server, loop
    finally:

        async def stop() -> None:
            server.close()
            await asyncio.wait_for(server.wait_closed(), 5)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


@pytest.fixture
def served(short_dir: Path) -> Iterator[tuple[str, GrpcServer, asyncio.AbstractEventLoop, _Handlers]]:
    handlers = _Handlers()
    with _serving(short_dir, handlers) as (path, server, loop):
        yield path, server, loop, handlers


def _call(path: str, method: str, data: bytes, **kwargs: object) -> bytes:
    with grpc.insecure_channel(f"unix://{path}") as channel:
        return channel.unary_unary(method)(data, timeout=5, **kwargs)  # type: ignore[no-any-return]


def _code(path: str, method: str, data: bytes = b"x", **kwargs: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        _call(path, method, data, **kwargs)
    return caught.value.code(), caught.value.details()


def test_unary_answers_carry_the_bytes_both_ways(served: tuple[str, GrpcServer, object, _Handlers]) -> None:
    path = served[0]
    assert _call(path, "/t.S/Echo", b"\x0a\x03abc") == b"\x0a\x03abc"
    assert _call(path, "/t.S/Echo", b"") == b""
    assert _call(path, "/t.S/Echo", _BIG) == _BIG  # over every window, in both directions


def test_refusals_reach_the_client_with_their_status_and_words(
    served: tuple[str, GrpcServer, object, _Handlers],
) -> None:
    path = served[0]
    assert _code(path, "/t.S/Refuse") == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "chip 3 is ünhealthy: 100% of its HBM failed",
    )
    assert _code(path, "/t.S/Crash") == (grpc.StatusCode.INTERNAL, "/t.S/Crash failed inside the agent")
    assert _code(path, "/t.S/Nothing") == (grpc.StatusCode.UNIMPLEMENTED, "no method /t.S/Nothing")
    code, details = _code(path, "/t.S/Echo", b"x" * (5 << 20))
    assert (code, details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "a request over 524288 bytes")
    code, _ = _code(path, "/t.S/Echo", b"x" * 1000, compression=grpc.Compression.Gzip)
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert _call(path, "/t.S/Echo", b"still here") == b"still here"


def test_a_cancelled_stream_ends_its_handler(served: tuple[str, GrpcServer, object, _Handlers]) -> None:
    path, _, _, handlers = served
    with grpc.insecure_channel(f"unix://{path}") as channel:
        call = channel.unary_stream("/t.S/Watch")(b"")
        assert next(call) == b"first"
        assert not handlers.watch_ended.is_set()
        call.cancel()
        assert handlers.watch_ended.wait(5)


def test_closing_the_server_ends_open_streams(short_dir: Path) -> None:
    handlers = _Handlers()
    with grpc.insecure_channel(f"unix://{short_dir}/grpc.sock") as channel:
        with _serving(short_dir, handlers):
            call = channel.unary_stream("/t.S/Watch")(b"")
            assert next(call) == b"first"
        assert handlers.watch_ended.is_set()
        with pytest.raises(grpc.RpcError) as caught:
            next(call)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def _h2_client(path: str, window: int) -> tuple[socket.socket, h2.connection.H2Connection]:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(5)
    sock.connect(path)
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
    )
    connection.initiate_connection()
    sock.sendall(connection.data_to_send())
    # The server's settings and connection window come in its first write; wait for them before sending.
    seen: set[type] = set()
    while not {h2.events.RemoteSettingsChanged, h2.events.WindowUpdated} <= seen:
        received = sock.recv(65536)
        assert received, "the server closed the connection"
        seen.update(type(event) for event in connection.receive_data(received))
    sock.sendall(connection.data_to_send())
    return sock, connection


def _message(payload: bytes) -> bytes:
    return struct.pack(">BL", 0, len(payload)) + payload


@pytest.mark.parametrize(
    ("method", "request_message", "expected"),
    [
        ("/t.S/Big", b"", _message(_BIG) + _message(b"after")),  # a stream: messages, then trailers
        ("/t.S/Echo", _BIG, _message(_BIG)),  # unary: its trailers wait for the window too
    ],
)
def test_answers_never_overrun_a_small_window(
    served: tuple[str, GrpcServer, object, _Handlers], method: str, request_message: bytes, expected: bytes
) -> None:
    # h2 raises FlowControlError if the server sends more than the client's window allows.
    sock, connection = _h2_client(served[0], window=1000)
    with sock:
        stream = connection.get_next_available_stream_id()
        connection.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", method),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )
        data = _message(request_message)
        for offset in range(0, len(data), 16_384):
            connection.send_data(
                stream, data[offset : offset + 16_384], end_stream=offset + 16_384 >= len(data)
            )
        sock.sendall(connection.data_to_send())
        body, trailers, frames = bytearray(), None, 0
        while trailers is None:
            received = sock.recv(65536)
            assert received, "the server closed the connection"
            for event in connection.receive_data(received):
                if isinstance(event, h2.events.DataReceived):
                    body += event.data
                    frames += 1
                    connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers = dict(event.headers)
            sock.sendall(connection.data_to_send())
    assert frames > len(_BIG) // 1000
    assert bytes(body) == expected
    assert trailers[b"grpc-status"] == b"0"


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return struct.pack(">L", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">L", stream_id) + payload


def _frames_from(sock: socket.socket) -> Iterator[tuple[int, int, bytes]]:
    """(type, flags, payload) of each frame the server sends, until it closes the connection."""
    buffer = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return
        if not data:
            return
        buffer += data
        while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
            length = int.from_bytes(buffer[:3], "big")
            yield buffer[3], buffer[4], buffer[9 : 9 + length]
            buffer = buffer[9 + length :]


def _until_ping_ack_or_close(sock: socket.socket, payload: bytes) -> str:
    """Read frames until the server acknowledges PING ``payload`` ("alive") or closes ("closed")."""
    for kind, flags, body in _frames_from(sock):
        if kind == 6 and flags & 1 and body == payload:
            return "alive"
    return "closed"


_ECHO_HEADERS = b"\x83\x86\x44\x09/t.S/Echo\x5f\x10application/grpc"  # POST, http, :path, content-type


def test_requests_left_unfinished_do_not_reopen_the_connection_window(
    served: tuple[str, GrpcServer, object, _Handlers],
) -> None:
    """Data of requests that never end is not given back: a client that keeps sending past the 1 MiB it
    was granted is cut off with FLOW_CONTROL_ERROR instead of making the server buffer it."""
    chunk = b"\x00" * 16_000
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(served[0])
        sock.sendall(_PREFACE + _frame(4, 0, 0, b""))
        try:
            for stream_id in range(1, 41, 2):  # 20 streams x 64,000 bytes = 1.28 MB, none of them ended
                sock.sendall(_frame(1, 4, stream_id, _ECHO_HEADERS) + _frame(0, 0, stream_id, chunk) * 4)
        except (BrokenPipeError, ConnectionResetError):
            pass
        goaways = [body for kind, _, body in _frames_from(sock) if kind == 7]
    assert [int.from_bytes(body[4:8], "big") for body in goaways] == [3]


def test_answers_go_out_before_the_close_a_client_asked_for(
    served: tuple[str, GrpcServer, object, _Handlers],
) -> None:
    """A call and the client's GOAWAY in one write: the answer still arrives before the connection ends."""
    request = b"\x00\x00\x00\x00\x02hi"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(served[0])
        goaway = _frame(7, 0, 0, b"\x00\x00\x00\x01\x00\x00\x00\x00")
        sock.sendall(
            _PREFACE
            + _frame(4, 0, 0, b"")
            + _frame(1, 4, 1, _ECHO_HEADERS)
            + _frame(0, 1, 1, request)
            + goaway
        )
        data = [body for kind, _, body in _frames_from(sock) if kind == 0]
    assert data == [request]


def test_pings_are_answered_and_a_non_http2_client_is_turned_away(
    served: tuple[str, GrpcServer, object, _Handlers],
) -> None:
    path = served[0]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(_PREFACE + _frame(4, 0, 0, b"") + _frame(6, 0, 0, b"12345678"))
        assert _until_ping_ack_or_close(sock, b"12345678") == "alive"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _until_ping_ack_or_close(sock, b"12345678") == "closed"
    assert _call(path, "/t.S/Echo", b"ok") == b"ok"


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_WELL_FORMED = [
    b"\x00\x04\x00\x00\x10\x00\x00\x05\x00\x00\x40\x00",  # SETTINGS: window 4096, frame size 16384
    b"\x00\x00\x00\x01",  # WINDOW_UPDATE of 1, RST_STREAM PROTOCOL_ERROR
    _ECHO_HEADERS,
    b"\x00\x00\x00\x00\x03abc",  # a gRPC message
    b"\x00\x00\x00\x00\x00\x00\x00\x00",  # GOAWAY, PING
]
_frames = st.lists(
    st.tuples(
        st.sampled_from(range(13)),  # every frame type and a few unknown ones
        # END_STREAM/ACK, END_HEADERS, PADDED, PRIORITY and their mixes, or anything
        st.one_of(st.sampled_from([0, 0x1, 0x4, 0x5, 0x8, 0xD, 0x20, 0x25, 0x2D]), st.integers(0, 255)),
        st.sampled_from([0, 1, 3, 2, 2**31 - 1]),
        st.one_of(
            st.binary(max_size=40),
            # the payloads of well-formed frames, whole or cut short
            st.sampled_from(_WELL_FORMED).flatmap(
                lambda whole: st.sampled_from([whole, whole[:-1], whole[:5]])
            ),
        ),
    ),
    max_size=6,
)


@settings(
    max_examples=1000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(frames=_frames)
def test_any_frames_end_in_an_answer_or_a_clean_close(
    served: tuple[str, GrpcServer, object, _Handlers], frames: list[tuple[int, int, int, bytes]]
) -> None:
    """Whatever frames arrive, the server neither fails inside (no error logged, by it or by asyncio for
    it) nor leaves the client hanging: a PING sent after them is answered, or the connection is closed."""
    errors = _Errors()
    for name in ("asyncio", "ascend_agent"):
        logging.getLogger(name).addHandler(errors)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(served[0])
            data = b"".join(_frame(*frame) for frame in frames)
            sock.sendall(_PREFACE + _frame(4, 0, 0, b"") + data + _frame(6, 0, 0, b"probe!!!"))
            _until_ping_ack_or_close(sock, b"probe!!!")  # a client left hanging times out here
    finally:
        for name in ("asyncio", "ascend_agent"):
            logging.getLogger(name).removeHandler(errors)
    assert [record.getMessage() for record in errors.records] == []
