"""A small gRPC server on a unix socket: HTTP/2 framing, unary and server-streaming calls, bytes in and out.

The DevicePlugin API needs no more than that, and the kubelet calls it on every pod admission. A unary
handler is a plain function from request bytes to response bytes, run inside the read callback: an answer
costs one socket write and no task. A streaming handler is an async generator of response bytes, run as a
task per call and paced by HTTP/2 flow control::

    server = GrpcServer(
        unary={"/v1beta1.DevicePlugin/Allocate": allocate},
        streaming={"/v1beta1.DevicePlugin/ListAndWatch": list_and_watch},
    )
    await server.start("/var/lib/kubelet/device-plugins/Ascend910.sock")
    ...
    server.close()
    await server.wait_closed()

Handlers refuse a call by raising ``grpclib.exceptions.GRPCError``. Headers are decoded with ``hpack``;
what this server sends uses no HPACK dynamic table, so its header blocks are built once. Not supported, as
the kubelet never uses them: message compression, client streaming, and deadlines (``grpc-timeout``), since
every unary handler answers at once from memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import AsyncGenerator, Callable, Mapping

import hpack
from grpclib.const import Status
from grpclib.exceptions import GRPCError

log = logging.getLogger(__name__)

Unary = Callable[[bytes], bytes]
Streaming = Callable[[bytes], AsyncGenerator[bytes, None]]

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types, flags, error codes and settings of RFC 9113.
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PUSH_PROMISE, _PING, _GOAWAY = 0, 1, 3, 4, 5, 6, 7
_WINDOW_UPDATE, _CONTINUATION = 8, 9
_END_STREAM = _ACK = 0x1
_END_HEADERS, _PADDED, _PRIORITY_FLAG = 0x4, 0x8, 0x20
_NO_ERROR, _PROTOCOL_ERROR, _FLOW_CONTROL_ERROR = 0x0, 0x1, 0x3
_FRAME_SIZE_ERROR, _REFUSED_STREAM, _COMPRESSION_ERROR = 0x6, 0x7, 0x9
_SETTINGS_INITIAL_WINDOW_SIZE, _SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
_SETTINGS_MAX_CONCURRENT_STREAMS, _SETTINGS_MAX_HEADER_LIST_SIZE = 0x3, 0x6

_DEFAULT_WINDOW = 65_535
_MAX_WINDOW = 2**31 - 1
_MAX_FRAME_SIZE = 16_384  # what we accept: the protocol's default, never raised
# What we grant the client, per stream and for the connection. The connection's window opens again only
# as requests are consumed, so this also bounds what one connection can make us buffer.
_RECEIVE_WINDOW = 1 << 20
_MAX_STREAMS = 256
_MAX_HEADER_BLOCK = 64 * 1024
_MAX_MESSAGE = 512 * 1024  # a DevicePlugin request is a few KiB; under the stream window, so it is refused
_MAX_REASON = 1024  # bytes of an error text we send, well inside one frame
_FRAME_HEADER = struct.Struct(">3sBBL")


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def _hpack_integer(value: int, prefix_bits: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with the bits above its prefix clear."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((value,))
    out = bytearray((limit,))
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header as a literal without indexing and with a literal name: it leaves the peer's table alone."""
    return b"\x00" + _hpack_integer(len(name), 7) + name + _hpack_integer(len(value), 7) + value


_STATUS_200 = b"\x88"  # :status 200, static table entry 8
_RESPONSE_HEADERS = _STATUS_200 + _literal(b"content-type", b"application/grpc")
_OK_TRAILERS = _literal(b"grpc-status", b"0")


def _status_block(status: Status, message: str) -> bytes:
    # grpc-message is percent-encoded UTF-8 outside printable ASCII.
    encoded = "".join(
        chr(byte) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}"
        for byte in message.encode()[:_MAX_REASON]
    )
    return _literal(b"grpc-status", str(status.value).encode()) + _literal(b"grpc-message", encoded.encode())


class _ProtocolError(Exception):
    """A connection error: the connection ends with a GOAWAY carrying ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class _Stream:
    __slots__ = (
        "body",
        "id",
        "outbox",
        "path",
        "ready",
        "received",
        "remote_closed",
        "send_window",
        "task",
        "trailers",
    )

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.path = ""
        self.body = bytearray()
        self.trailers: bytes | None = None  # to send once the outbox is empty
        self.remote_closed = False
        self.send_window = send_window
        self.received = 0  # flow-controlled bytes received and not yet given back to the connection window
        self.outbox = bytearray()  # DATA payload waiting for flow-control window
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()  # set when the outbox is empty


class GrpcServer:
    """Serves the given handlers, keyed by method path, on a unix socket."""

    def __init__(self, unary: Mapping[str, Unary], streaming: Mapping[str, Streaming]) -> None:
        self._unary = dict(unary)
        self._streaming = dict(streaming)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()
        self._calls: set[asyncio.Task[None]] = set()  # the streaming calls running now

    async def start(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self), path=path)

    def close(self) -> None:
        """Stop listening and end every connection: running streams are cancelled, clients get a GOAWAY."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.shut()

    async def wait_closed(self) -> None:
        """Wait until every streaming handler has finished."""
        if self._calls:
            await asyncio.wait(set(self._calls))
        if self._server is not None:
            await self._server.wait_closed()


class _Connection(asyncio.Protocol):
    """One client connection: parses frames from the read callback and answers as it goes. Everything
    written while handling one read goes out in one write."""

    def __init__(self, server: GrpcServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._preface_seen = False
        self._out = bytearray()
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = _MAX_HEADER_BLOCK
        self.streams: dict[int, _Stream] = {}
        self._last_stream_id = 0
        self._send_window = _DEFAULT_WINDOW
        self._peer_initial_window = _DEFAULT_WINDOW
        self._peer_max_frame = _MAX_FRAME_SIZE
        self._receive_window = _RECEIVE_WINDOW  # what the client may still send on the connection
        self._consumed = 0  # bytes consumed since the connection window was last opened again
        self._header_block: tuple[int, int, bytearray] | None = None  # stream, flags, fragments so far
        self._going_away = False
        self._writable = asyncio.Event()  # cleared while the transport's buffer is over its high mark
        self._writable.set()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._server._connections.add(self)
        settings = struct.pack(
            ">HLHLHL",
            _SETTINGS_MAX_CONCURRENT_STREAMS,
            _MAX_STREAMS,
            _SETTINGS_INITIAL_WINDOW_SIZE,
            _RECEIVE_WINDOW,
            _SETTINGS_MAX_HEADER_LIST_SIZE,
            _MAX_HEADER_BLOCK,
        )
        transport.write(
            _frame(_SETTINGS, 0, 0, settings)
            + _frame(_WINDOW_UPDATE, 0, 0, (_RECEIVE_WINDOW - _DEFAULT_WINDOW).to_bytes(4, "big"))
        )

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        try:
            position = 0
            if not self._preface_seen:
                if len(buffer) < len(_PREFACE):
                    if not _PREFACE.startswith(bytes(buffer)):
                        raise _ProtocolError(_PROTOCOL_ERROR, "not an HTTP/2 client")
                    return
                if not buffer.startswith(_PREFACE):
                    raise _ProtocolError(_PROTOCOL_ERROR, "not an HTTP/2 client")
                self._preface_seen = True
                position = len(_PREFACE)
            end = len(buffer)
            while end - position >= 9:
                length_bytes, kind, flags, stream_id = _FRAME_HEADER.unpack_from(buffer, position)
                length = int.from_bytes(length_bytes, "big")
                if length > _MAX_FRAME_SIZE:
                    raise _ProtocolError(_FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if end - position - 9 < length:
                    break
                payload = bytes(buffer[position + 9 : position + 9 + length])
                position += 9 + length
                self._on_frame(kind, flags, stream_id & _MAX_WINDOW, payload)
            del buffer[:position]
        except _ProtocolError as exc:
            log.debug("HTTP/2 connection error %d: %s", exc.code, exc)
            self._go_away(exc.code, str(exc))
        self._flush()

    def pause_writing(self) -> None:
        # Stop reading too: a client that sends requests (or PINGs) but never reads its answers must not
        # grow our write buffer.
        self._writable.clear()
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._writable.set()
        if self._transport is not None:
            self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.discard(self)
        self._transport = None
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            if stream.task is not None:
                stream.task.cancel()

    # frames

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._header_block is not None and (kind != _CONTINUATION or stream_id != self._header_block[0]):
            raise _ProtocolError(_PROTOCOL_ERROR, "a header block was interrupted")
        if kind == _DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == _HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == _CONTINUATION:
            if self._header_block is None:
                raise _ProtocolError(_PROTOCOL_ERROR, "CONTINUATION without HEADERS")
            block = self._header_block[2]
            block += payload
            if len(block) > _MAX_HEADER_BLOCK:
                raise _ProtocolError(_PROTOCOL_ERROR, "a header block over 64 KiB")
            if flags & _END_HEADERS:
                stream_id, header_flags, _ = self._header_block
                self._header_block = None
                self._on_header_block(stream_id, header_flags, bytes(block))
        elif kind == _SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == _WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == _PING:
            if len(payload) != 8 or stream_id:
                raise _ProtocolError(_FRAME_SIZE_ERROR, "a malformed PING")
            if not flags & _ACK:
                self._out += _frame(_PING, _ACK, 0, payload)
        elif kind == _RST_STREAM:
            if len(payload) != 4 or not stream_id:
                raise _ProtocolError(_FRAME_SIZE_ERROR, "a malformed RST_STREAM")
            stream = self.streams.get(stream_id)
            if stream is not None:
                self._close_stream(stream)
        elif kind == _GOAWAY:
            self._going_away = True
            if not self.streams and self._transport is not None:
                self._flush()
                self._transport.close()
        elif kind == _PUSH_PROMISE:
            raise _ProtocolError(_PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and unknown frame types are ignored, as the protocol says.

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ProtocolError(_PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & _ACK:
            if payload:
                raise _ProtocolError(_FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise _ProtocolError(_FRAME_SIZE_ERROR, "a SETTINGS frame of a length not divisible by 6")
        for offset in range(0, len(payload), 6):
            setting, value = struct.unpack_from(">HL", payload, offset)
            if setting == _SETTINGS_INITIAL_WINDOW_SIZE:
                if value > _MAX_WINDOW:
                    raise _ProtocolError(_FLOW_CONTROL_ERROR, "an initial window over 2^31-1")
                delta, self._peer_initial_window = value - self._peer_initial_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > _MAX_WINDOW:
                        raise _ProtocolError(_FLOW_CONTROL_ERROR, "a stream window overflowed")
            elif setting == _SETTINGS_MAX_FRAME_SIZE:
                if not _MAX_FRAME_SIZE <= value <= 2**24 - 1:
                    raise _ProtocolError(_PROTOCOL_ERROR, f"a maximum frame size of {value}")
                self._peer_max_frame = value
        self._out += _frame(_SETTINGS, _ACK, 0)
        self._send_pending()

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ProtocolError(_FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        increment = int.from_bytes(payload, "big") & _MAX_WINDOW
        if not stream_id:
            if not increment:
                raise _ProtocolError(_PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > _MAX_WINDOW:
                raise _ProtocolError(_FLOW_CONTROL_ERROR, "the connection window overflowed")
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            if not increment or stream.send_window + increment > _MAX_WINDOW:
                self._reset(stream, _PROTOCOL_ERROR if not increment else _FLOW_CONTROL_ERROR)
                return
            stream.send_window += increment
        self._send_pending()

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise _ProtocolError(_PROTOCOL_ERROR, "HEADERS on stream 0")
        payload = _unpadded(flags, payload)
        if flags & _PRIORITY_FLAG:
            if len(payload) < 5:
                raise _ProtocolError(_FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            payload = payload[5:]
        if flags & _END_HEADERS:
            self._on_header_block(stream_id, flags, payload)
        else:
            self._header_block = (stream_id, flags, bytearray(payload))

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        # Always decoded, even for a stream we refuse: the decoder's table must follow the client's.
        try:
            headers = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise _ProtocolError(_COMPRESSION_ERROR, f"a header block does not decode: {exc}") from None
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client end its side of the stream
            if not flags & _END_STREAM or stream.remote_closed:
                raise _ProtocolError(_PROTOCOL_ERROR, "HEADERS in the middle of a request")
            self._request_complete(stream)
            return
        if stream_id % 2 == 0:
            raise _ProtocolError(_PROTOCOL_ERROR, f"HEADERS opening even stream {stream_id}")
        if stream_id <= self._last_stream_id:
            return  # a stream already closed, by a reset or our answer: what the client still sends is moot
        self._last_stream_id = stream_id
        stream = _Stream(stream_id, self._peer_initial_window)
        if self._going_away or len(self.streams) >= _MAX_STREAMS:
            self._out += _frame(_RST_STREAM, 0, stream_id, _REFUSED_STREAM.to_bytes(4, "big"))
            return
        self.streams[stream_id] = stream
        stream.remote_closed = bool(flags & _END_STREAM)
        fields: dict[bytes, bytes] = dict(headers)
        stream.path = fields.get(b":path", b"").decode("utf-8", "replace")
        if fields.get(b":method") != b"POST" or not fields.get(b"content-type", b"").startswith(
            b"application/grpc"
        ):
            self._refuse(stream, Status.UNIMPLEMENTED, "only gRPC calls are served here")
        elif stream.path not in self._server._unary and stream.path not in self._server._streaming:
            self._refuse(stream, Status.UNIMPLEMENTED, f"no method {stream.path}")
        elif stream.remote_closed:
            self._request_complete(stream)

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._receive_window -= len(payload)
        if self._receive_window < 0:
            raise _ProtocolError(_FLOW_CONTROL_ERROR, "the client overran the connection window")
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if stream_id > self._last_stream_id or not stream_id:
                raise _ProtocolError(_PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            self._consume(len(payload))
            return  # a stream already closed: see _on_header_block
        stream.received += len(payload)
        if stream.received > _RECEIVE_WINDOW:
            self._reset(stream, _FLOW_CONTROL_ERROR)
            return
        data = _unpadded(flags, payload)
        if len(stream.body) + len(data) > _MAX_MESSAGE + 5:
            self._refuse(stream, Status.RESOURCE_EXHAUSTED, f"a request over {_MAX_MESSAGE} bytes")
            return
        stream.body += data
        if flags & _END_STREAM:
            self._request_complete(stream)

    def _consume(self, size: int) -> None:
        """``size`` received bytes are dealt with: open the connection window again, a quarter at a time."""
        self._consumed += size
        if self._consumed >= _RECEIVE_WINDOW // 4:
            self._out += _frame(_WINDOW_UPDATE, 0, 0, self._consumed.to_bytes(4, "big"))
            self._receive_window += self._consumed
            self._consumed = 0

    # calls

    def _request_complete(self, stream: _Stream) -> None:
        stream.remote_closed = True
        self._consume(stream.received)
        stream.received = 0
        body = stream.body
        if len(body) < 5 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            self._refuse(stream, Status.INTERNAL, "the request is not one length-prefixed gRPC message")
            return
        if body[0]:
            self._refuse(stream, Status.UNIMPLEMENTED, "compressed messages are not accepted")
            return
        message = bytes(body[5:])
        stream.body = bytearray()
        unary = self._server._unary.get(stream.path)
        if unary is None:
            stream.task = task = asyncio.get_running_loop().create_task(self._stream_call(stream, message))
            self._server._calls.add(task)
            task.add_done_callback(self._server._calls.discard)
            return
        try:
            answer = unary(message)
        except GRPCError as exc:
            self._refuse(stream, exc.status, exc.message or "")
            return
        except Exception:
            log.exception("%s failed", stream.path)
            self._refuse(stream, Status.INTERNAL, f"{stream.path} failed inside the agent")
            return
        self._out += _frame(_HEADERS, _END_HEADERS, stream.id, _RESPONSE_HEADERS)
        self._send_message(stream, answer)
        self._finish(stream, _OK_TRAILERS)

    async def _stream_call(self, stream: _Stream, message: bytes) -> None:
        trailers = _OK_TRAILERS
        try:
            self._out += _frame(_HEADERS, _END_HEADERS, stream.id, _RESPONSE_HEADERS)
            # Closed on the way out, cancelled or not, so the handler's own clean-up runs now.
            async with contextlib.aclosing(self._server._streaming[stream.path](message)) as responses:
                async for response in responses:
                    self._send_message(stream, response)
                    self._flush()
                    # The next response waits until this one is handed to the socket and the socket keeps
                    # up: a client that stops reading holds one response here, not a queue of them.
                    await stream.ready.wait()
                    await self._writable.wait()
        except GRPCError as exc:
            trailers = _status_block(exc.status, exc.message or "")
        except asyncio.CancelledError:
            self.streams.pop(stream.id, None)
            raise
        except Exception:
            log.exception("%s failed", stream.path)
            trailers = _status_block(Status.INTERNAL, f"{stream.path} failed inside the agent")
        if self.streams.get(stream.id) is stream:
            self._finish(stream, trailers)
            self._flush()

    def _send_message(self, stream: _Stream, message: bytes) -> None:
        stream.outbox += b"\x00" + len(message).to_bytes(4, "big") + message
        stream.ready.clear()
        self._send_pending(stream)

    def _finish(self, stream: _Stream, trailers: bytes) -> None:
        """End our side with ``trailers`` once everything before them is sent."""
        if stream.outbox:
            stream.trailers = trailers
            return
        self._out += _frame(_HEADERS, _END_HEADERS | _END_STREAM, stream.id, trailers)
        self._close_stream(stream)

    def _refuse(self, stream: _Stream, status: Status, message: str) -> None:
        """Answer with a status and no message (a trailers-only response)."""
        block = _RESPONSE_HEADERS + _status_block(status, message)
        self._out += _frame(_HEADERS, _END_HEADERS | _END_STREAM, stream.id, block)
        if not stream.remote_closed:
            # The client may still be sending: tell it to stop.
            self._out += _frame(_RST_STREAM, 0, stream.id, _NO_ERROR.to_bytes(4, "big"))
        self._close_stream(stream)

    def _reset(self, stream: _Stream, code: int) -> None:
        self._out += _frame(_RST_STREAM, 0, stream.id, code.to_bytes(4, "big"))
        self._close_stream(stream)

    def _close_stream(self, stream: _Stream) -> None:
        self.streams.pop(stream.id, None)
        self._consume(stream.received)
        stream.received = 0
        if stream.task is not None and stream.task is not asyncio.current_task():
            stream.task.cancel()
        if self._going_away and not self.streams and self._transport is not None:
            self._flush()
            self._transport.close()

    def _send_pending(self, only: _Stream | None = None) -> None:
        """Send as much of the waiting DATA as the flow-control windows allow."""
        for stream in (only,) if only is not None else list(self.streams.values()):
            while stream.outbox and self._send_window > 0 and stream.send_window > 0:
                size = min(len(stream.outbox), self._send_window, stream.send_window, self._peer_max_frame)
                self._out += _frame(_DATA, 0, stream.id, bytes(stream.outbox[:size]))
                del stream.outbox[:size]
                self._send_window -= size
                stream.send_window -= size
            if not stream.outbox:
                stream.ready.set()
                if stream.trailers is not None and self.streams.get(stream.id) is stream:
                    self._finish(stream, stream.trailers)

    def _go_away(self, code: int, reason: str) -> None:
        self._out += _frame(
            _GOAWAY,
            0,
            0,
            self._last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + reason.encode()[:_MAX_REASON],
        )
        self._flush()
        if self._transport is not None:
            self._transport.close()

    def shut(self) -> None:
        """End the connection: cancel its streams and say GOAWAY."""
        for stream in self.streams.values():
            if stream.task is not None:
                stream.task.cancel()
        self._go_away(_NO_ERROR, "the server is stopping")

    def _flush(self) -> None:
        if self._out and self._transport is not None:
            self._transport.write(bytes(self._out))
        self._out.clear()


def _unpadded(flags: int, payload: bytes) -> bytes:
    if not flags & _PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise _ProtocolError(_PROTOCOL_ERROR, "padding longer than its frame")
    return payload[1 : len(payload) - payload[0]]
