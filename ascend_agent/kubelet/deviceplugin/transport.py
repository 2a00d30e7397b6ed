"""The gRPC transport of every socket the agent serves, with the limits a hostile client meets on each.

grpclib gives no hooks for these, so every touch of its private parts (``Stream._stream``, the server's
``_protocol_factory`` and handler mapping, the channel's ``_get_authority``) lives here and nowhere else; the
pin in pyproject.toml names the grpclib versions they were tested with. A :class:`BoundedServer` applies, by
construction, to every service it serves:

- a request is read in one pass, its length prefix checked against ``max_request`` before the body is read,
  and fields its message type does not know are dropped before it is decoded (a general decoder that keeps
  unknown fields can take seconds on a hostile request);
- a request whose body does not arrive within ``request_timeout`` is refused, and its stream released;
- a stream the client resets is released at once, even when its handler never ran (grpclib keeps it for as
  long as the connection lives), and a client that resets streams faster than any kubelet gets a GOAWAY;
- at most ``max_streams`` streams per connection; more are refused with REFUSED_STREAM;
- a connection with no stream open for ``idle_timeout`` is closed;
- a frame of a type HTTP/2 does not define is ignored, as RFC 9113 says, instead of ending the connection;
- a refusal's message is cut to :data:`~ascend_agent.echo.MOST_LINE` characters, whatever it echoes;

and an answer the agent reads as a client (:func:`read_answer`) has its length prefix checked before its body
is read::

    server = BoundedServer([service], codec=BytesCodec())
    identity = await server.serve(Path("/var/lib/kubelet/device-plugins/ascend-Ascend910.sock"))
    ...
    request = await stream.recv_message()     # in a handler: the bounded, pre-read request
    await server.shut()
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError
from grpclib.protocol import EventsProcessor, H2Protocol
from grpclib.protocol import Stream as H2Stream
from grpclib.server import Handler as RequestHandlers
from grpclib.server import Server, Stream
from h2.errors import ErrorCodes
from h2.events import DataReceived, RequestReceived, StreamReset
from h2.exceptions import ProtocolError
from h2.settings import SettingCodes

from ascend_agent.echo import MOST_LINE, cut
from ascend_agent.kubelet.deviceplugin import wire

log = logging.getLogger(__name__)

SocketIdentity = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection may ask of a served socket. A kubelet sends requests of a few hundred bytes,
    keeps one ListAndWatch stream open and resets a stream only when it stops watching."""

    max_request: int = 64 * 1024
    request_timeout: float = 10.0
    idle_timeout: float = 120.0
    max_streams: int = 64
    # More resets than this within ``reset_window`` seconds end the connection.
    max_resets: int = 200
    reset_window: float = 10.0


DEFAULT_LIMITS = Limits()
# grpclib's defaults are 4 MiB per stream and per connection; a kubelet sends a few KiB.
SERVER_CONFIG = Configuration(http2_connection_window_size=1 << 20, http2_stream_window_size=1 << 18)
_SHUTDOWN_GRACE = 0.3


def is_socket_name(name: str) -> bool:
    """Whether ``name`` is a socket's as the agent and the kubelet serve them: ``*.sock``, not the dot name
    :meth:`BoundedServer.serve` binds under before it renames the socket in."""
    return name.endswith(".sock") and not name.startswith(".")


def socket_identity(path: Path) -> SocketIdentity | None:
    """What tells one incarnation of a socket file from the next: its device, inode and change time (a file
    made again right after the old one was removed can get the same inode number)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_ctime_ns


class LocalChannel(Channel):
    """A grpclib channel over a unix socket that sends ``:authority: localhost``, as the kubelet does."""

    def __init__(self, path: Path | str, codec: CodecBase | None = None) -> None:
        super().__init__(path=str(path), codec=codec)

    def _get_authority(self, host: str, port: int) -> str:
        return "localhost"


def connection_of(stream: Stream[Any, Any]) -> object:
    """The HTTP/2 connection a call came on (the peer object grpclib hands out is new per call)."""
    return stream._stream.connection


async def read_request(stream: Stream[Any, Any], limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The bytes of a call's one request message, its length prefix checked before the body is read
    (grpclib's own reader takes in whatever a prefix claims, up to 4 GiB); GRPCError when it is too long,
    compressed, cut short or slower to arrive than ``limits.request_timeout``."""
    h2_stream = stream._stream
    try:
        async with asyncio.timeout(limits.request_timeout):
            prefix = await h2_stream.recv_data(5)
            if len(prefix) < 5:
                raise GRPCError(Status.INVALID_ARGUMENT, "the request has no message")
            compressed, length = struct.unpack(">?I", prefix)
            if compressed:
                raise GRPCError(Status.UNIMPLEMENTED, "compressed requests are not supported")
            if length > limits.max_request:
                raise GRPCError(
                    Status.RESOURCE_EXHAUSTED,
                    f"a request of {length} bytes is over the {limits.max_request} bytes this socket accepts",
                )
            return await h2_stream.recv_data(length)
    except AssertionError:  # grpclib's buffer, when the stream ends before what the prefix announced
        raise GRPCError(Status.INVALID_ARGUMENT, "the request ends before its message does") from None
    except TimeoutError:
        raise GRPCError(
            Status.DEADLINE_EXCEEDED, f"the request did not arrive within {limits.request_timeout:g} s"
        ) from None


class UnreadAnswer(Exception):
    """A unary answer the caller does not read: longer than it reads, compressed or cut short; the message
    says which."""


async def read_answer(call: Any, limit: int) -> bytes:
    """The one message of a unary call's answer (``call``: a grpclib client stream whose request was sent),
    its length prefix checked against ``limit`` before the body is read: grpclib's own reader gathers
    whatever a prefix claims, up to 4 GiB. :class:`UnreadAnswer` past ``limit``; GRPCError when the server
    refused the call; b"" for an answer without a message."""
    await call.recv_initial_metadata()
    h2_stream = call._stream
    try:
        prefix = await h2_stream.recv_data(5)
        if len(prefix) < 5:
            return b""
        compressed, length = struct.unpack(">?I", prefix)
        if compressed:
            raise UnreadAnswer("a compressed message, not asked for")
        if length > limit:
            raise UnreadAnswer(f"{length} bytes, over the {limit} read")
        data: bytes = await h2_stream.recv_data(length)
    except AssertionError:  # grpclib's buffer, when the stream ends before what the prefix announced
        raise UnreadAnswer("a message cut short") from None
    return data


def _known_fields(message_type: Any) -> frozenset[int] | None:
    """The field numbers of a betterproto message type; None for raw bytes (the service reads them)."""
    meta = getattr(message_type, "_betterproto", None)
    if meta is None:
        return None
    return frozenset(field.number for field in meta.meta_by_field_name.values())


def _bounded(handler: Handler, codec: Any, limits: Limits) -> Handler:
    """``handler`` with its request read by :func:`read_request` before it runs: its ``recv_message``
    returns that request, decoded from the fields its type knows."""
    if handler.cardinality not in (Cardinality.UNARY_UNARY, Cardinality.UNARY_STREAM):
        raise ValueError(f"{handler.func}: only calls with one request message are served")
    known = _known_fields(handler.request_type)
    func = cast(Callable[[Stream[Any, Any]], Awaitable[None]], handler.func)

    async def run(stream: Stream[Any, Any]) -> None:
        data = await read_request(stream, limits)
        if known is not None:
            try:
                data = wire.only_fields(data, known)
            except wire.WireError as exc:
                raise GRPCError(Status.INVALID_ARGUMENT, f"the request does not decode: {exc}") from None
        message = codec.decode(data, handler.request_type)
        pending = [message]

        async def recv_message() -> Any:
            return pending.pop() if pending else None

        stream.recv_message = recv_message  # type: ignore[method-assign]
        try:
            await func(stream)
        except GRPCError as exc:  # whatever it echoes, a refusal is one bounded line
            if exc.message is not None and len(exc.message) > MOST_LINE:
                raise GRPCError(exc.status, cut(exc.message, MOST_LINE), exc.details) from None
            raise

    return Handler(run, handler.cardinality, handler.request_type, handler.reply_type)


class _Handlers(RequestHandlers):
    """grpclib's per-connection handler, releasing a reset stream at once: a stream reset before its
    handler task ran would otherwise stay in the connection's table for as long as the connection lives."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._releases: dict[H2Stream, Callable[[], None]] = {}

    def accept(self, stream: H2Stream, headers: Any, release_stream: Callable[[], Any]) -> None:
        def release_once() -> None:
            if self._releases.pop(stream, None) is not None:
                release_stream()

        self._releases[stream] = release_once
        super().accept(stream, headers, release_once)

    def cancel(self, stream: H2Stream) -> None:
        super().cancel(stream)
        release = self._releases.get(stream)
        if release is not None:
            release()


class _Processor(EventsProcessor):
    """grpclib's event dispatch with the stream bound, the reset budget and unknown events ignored."""

    def __init__(self, handler: _Handlers, connection: Any, protocol: _Protocol) -> None:
        super().__init__(handler, connection)
        self._protocol = protocol
        self._resets: collections.deque[float] = collections.deque()

    def process(self, event: Any) -> None:
        if hasattr(self, "processors") and type(event) not in self.processors:
            log.debug("Ignored HTTP/2 event %s", type(event).__name__)
            return
        super().process(event)

    def process_request_received(self, event: RequestReceived) -> None:
        limits = self._protocol.limits
        if len(self.streams) >= limits.max_streams:
            assert event.stream_id is not None
            self.connection._connection.reset_stream(event.stream_id, ErrorCodes.REFUSED_STREAM)
            return
        self._protocol.touch()
        super().process_request_received(event)

    def process_stream_reset(self, event: StreamReset) -> None:
        super().process_stream_reset(event)
        if event.remote_reset:
            self.count_reset()

    def count_reset(self) -> None:
        """The client reset a stream: past the budget, the connection ends."""
        limits = self._protocol.limits
        now = time.monotonic()
        self._resets.append(now)
        while self._resets and self._resets[0] < now - limits.reset_window:
            self._resets.popleft()
        if len(self._resets) > limits.max_resets:
            self._protocol.go_away(
                ErrorCodes.ENHANCE_YOUR_CALM,
                f"over {limits.max_resets} streams reset within {limits.reset_window:g} s",
            )


class _Protocol(H2Protocol):
    """One served connection: grpclib's protocol with the stream bound, the idle timer, the reset budget,
    and remembered while connected so that stopping the server can drop it."""

    def __init__(
        self, handler: _Handlers, config: Any, h2_config: Any, limits: Limits, live: set[_Protocol]
    ) -> None:
        super().__init__(handler, config, h2_config)
        self.limits = limits
        self._live = live
        self._transport: asyncio.Transport | None = None
        self._idle_since = time.monotonic()
        self._idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self._live.add(self)
        super().connection_made(transport)
        h2 = self.connection._connection
        h2.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: self.limits.max_streams})
        self.connection.flush()
        self.processor = _Processor(cast(_Handlers, self.handler), self.connection, self)
        self._arm_idle(self.limits.idle_timeout)

    def data_received(self, data: bytes) -> None:
        """grpclib's, except that a request the same read also resets is never started: a flood of HEADERS
        each followed by RST_STREAM costs no stream object and no task."""
        try:
            events = self.connection.feed(data)
        except ProtocolError:
            log.debug("HTTP/2 protocol error", exc_info=True)
            self.processor.close("Protocol error")
            return
        self.connection.flush()
        reset = {e.stream_id for e in events if isinstance(e, StreamReset) and e.remote_reset}
        skipped: set[int] = set()
        for event in events:
            if self._transport is None or self._transport.is_closing():
                break
            stream_id = getattr(event, "stream_id", None)
            if isinstance(event, RequestReceived) and stream_id in reset:
                skipped.add(stream_id)
            elif stream_id in skipped:
                if isinstance(event, StreamReset):
                    cast(_Processor, self.processor).count_reset()
                elif isinstance(event, DataReceived):  # its window is the connection's too
                    self.connection.ack(stream_id, event.flow_controlled_length)
            else:
                self.processor.process(event)
        self.connection.flush()

    @property
    def open_streams(self) -> int:
        """Streams the connection holds: open ones, and any not yet released."""
        return len(self.processor.streams)

    def touch(self) -> None:
        self._idle_since = time.monotonic()

    def _arm_idle(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._idle_timer = loop.call_later(max(delay, 0.0), self._check_idle)

    def _check_idle(self) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        if self.processor.streams:
            self.touch()
        left = self._idle_since + self.limits.idle_timeout - time.monotonic()
        if left > 0:
            self._arm_idle(left)
            return
        self.go_away(ErrorCodes.NO_ERROR, f"no stream for {self.limits.idle_timeout:g} s")

    def go_away(self, code: ErrorCodes, why: str) -> None:
        """Tell the client the connection ends (GOAWAY), then end it."""
        log.debug("Closing a connection: %s", why)
        with contextlib.suppress(Exception):  # a connection h2 already closed has no GOAWAY to send
            self.connection._connection.close_connection(error_code=code)
            self.connection.flush()
        if self._transport is not None:
            self._transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._live.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        super().connection_lost(exc)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


class BoundedServer(Server):
    """A grpclib server for a unix socket with :class:`Limits` on every connection and call, whose
    :meth:`shut` also drops every connection (a client that stopped reading would otherwise keep its
    connection, and what is buffered for it, after the server is gone)."""

    def __init__(self, handlers: list[object], *, limits: Limits = DEFAULT_LIMITS, **kwargs: Any) -> None:
        super().__init__(handlers, config=SERVER_CONFIG, **kwargs)  # type: ignore[arg-type]
        self.limits = limits
        self._mapping = {name: _bounded(h, self._codec, limits) for name, h in self._mapping.items()}
        self._live: set[_Protocol] = set()

    def _protocol_factory(self) -> H2Protocol:
        self.__gc_step__()
        handler = _Handlers(self._mapping, self._codec, self._status_details_codec, self.__dispatch__)
        self._handlers.add(handler)
        return _Protocol(handler, self._config, self._h2_config, self.limits, self._live)

    @property
    def open_streams(self) -> int:
        """Streams held over all connections (what a flood of resets would grow)."""
        return sum(protocol.open_streams for protocol in self._live)

    @property
    def connections(self) -> int:
        return len(self._live)

    def close(self) -> None:
        super().close()
        for protocol in list(self._live):
            protocol.abort()

    async def serve(self, path: Path) -> SocketIdentity:
        """Listen on ``path`` (a stale file is replaced), mode 0600 before any client can connect; the
        socket file's identity. The file appears under its name only once it is listened on: bound as
        ``.<name>`` (the kubelet's plugin watcher skips dot files), then renamed, so a client that connects
        as soon as it sees the file is never refused."""
        # The directory is the kubelet's, or the agent's own made with the instance lock: never made here.
        if path.parent.exists() and not path.parent.is_dir():  # a plain file where the directory should be
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path.parent))
        bound = path.with_name(f".{path.name}")
        with contextlib.suppress(FileNotFoundError):
            bound.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # The file is made 0600 by bind() itself: a chmod after it would follow a link put in its place.
            previous = os.umask(0o177)
            try:
                listener.bind(str(bound))
            finally:
                os.umask(previous)
            await self.start(sock=listener)
        except BaseException:  # cancelled too (SIGTERM): the file we bound goes with the listener
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                bound.unlink()
            raise
        try:
            os.rename(bound, path)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                bound.unlink()
            await self.shut()
            raise
        identity = socket_identity(path)
        if identity is None:
            await self.shut()
            raise FileNotFoundError(f"{path} vanished while it was being served")
        return identity

    async def shut(self) -> None:
        self.close()
        # On Python 3.12+ wait_closed() also waits for the connections to finish closing: bound it.
        with anyio.move_on_after(_SHUTDOWN_GRACE):
            await self.wait_closed()
