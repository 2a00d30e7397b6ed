"""A gRPC client over a unix socket made of raw HTTP/2 frames (``h2``), to send what a gRPC library would not:
the DATA frames of concurrent requests interleaved, a client that never reads, windows of our choosing.

It obeys flow control: a request's data goes out only as far as the server's windows allow::

    client = await RawGrpcClient.connect(path)
    ids = [client.request("/v1beta1.DevicePlugin/Allocate") for _ in range(3)]
    await client.send_bodies({stream_id: grpc_message(b"...") for stream_id in ids})
    answers = await client.wait_answers(ids)      # {stream_id: Answer}
    client.close()
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

_CHUNK = 16 * 1024


def request_headers(path: str) -> list[tuple[str, str]]:
    """The headers of a gRPC request for ``path`` over a unix socket, as the kubelet sends them."""
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


def grpc_message(payload: bytes) -> bytes:
    """One length-prefixed gRPC message."""
    return b"\x00" + struct.pack(">I", len(payload)) + payload


@dataclass
class Answer:
    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: int | None = None

    @property
    def done(self) -> bool:
        return self.ended or self.reset is not None

    @property
    def status(self) -> int | None:
        """grpc-status, from the trailers or a trailers-only answer."""
        value = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if value is None else int(value)

    @property
    def message(self) -> str:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))

    def payloads(self) -> list[bytes]:
        """The gRPC messages of the answer's data."""
        messages, at = [], 0
        while at + 5 <= len(self.data):
            size = struct.unpack(">I", self.data[at + 1 : at + 5])[0]
            messages.append(bytes(self.data[at + 5 : at + 5 + size]))
            at += 5 + size
        return messages


class RawGrpcClient:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: h2.connection.H2Connection
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._conn = conn
        self.answers: dict[int, Answer] = {}
        # DATA bytes sent per stream
        self.sent: dict[int, int] = {}
        self.closed = False

    @classmethod
    async def connect(cls, path: str, initial_window: int | None = None) -> RawGrpcClient:
        """Connect and send the preface; ``initial_window`` sets how much the server may send per stream."""
        reader, writer = await asyncio.open_unix_connection(path)
        conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        conn.initiate_connection()
        if initial_window is not None:
            conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: initial_window})
        client = cls(reader, writer, conn)
        client._flush()
        return client

    def request(self, path: str) -> int:
        """Open a request stream (headers only); its stream id."""
        stream_id = self._conn.get_next_available_stream_id()
        self._conn.send_headers(stream_id, request_headers(path))
        self.answers[stream_id] = Answer()
        self.sent[stream_id] = 0
        self._flush()
        return stream_id

    async def send_bodies(self, bodies: dict[int, bytes]) -> None:
        """Send each stream's body and end it, one DATA frame of each stream in turn, as far as the windows
        allow; wait for WINDOW_UPDATEs when they are shut."""
        left = {stream_id: memoryview(body) for stream_id, body in bodies.items()}
        while left:
            progressed = False
            for stream_id in list(left):
                if self.answers[stream_id].done:  # answered or reset before it was all sent
                    del left[stream_id]
                    continue
                body = left[stream_id]
                size = min(
                    len(body),
                    self._conn.local_flow_control_window(stream_id),
                    self._conn.max_outbound_frame_size,
                )
                size = min(size, _CHUNK)
                if size > 0 or not body:
                    self._conn.send_data(stream_id, body[:size].tobytes(), end_stream=size == len(body))
                    self.sent[stream_id] += size
                    progressed = True
                    if size == len(body):
                        del left[stream_id]
                    else:
                        left[stream_id] = body[size:]
            self._flush()
            if not progressed:
                await self._receive()

    async def wait_answers(self, stream_ids: list[int]) -> dict[int, Answer]:
        """Read until every stream is answered or reset (the caller bounds the wait)."""
        while not all(self.answers[stream_id].done for stream_id in stream_ids):
            await self._receive()
        return {stream_id: self.answers[stream_id] for stream_id in stream_ids}

    async def _receive(self) -> None:
        data = await self._reader.read(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        for event in self._conn.receive_data(data):
            self._on_event(event)
        self._flush()

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            self.answers[event.stream_id].headers.update(_headers(event.headers))
        elif isinstance(event, h2.events.TrailersReceived):
            self.answers[event.stream_id].trailers.update(_headers(event.headers))
        elif isinstance(event, h2.events.DataReceived):
            self.answers[event.stream_id].data += event.data
            self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.answers[event.stream_id].ended = True
        elif isinstance(event, h2.events.StreamReset):
            if event.stream_id in self.answers:
                self.answers[event.stream_id].reset = int(event.error_code)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.closed = True

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data:
            self._writer.write(data)

    def close(self) -> None:
        self._writer.close()


def _headers(pairs: object) -> dict[str, str]:
    return {str(name): str(value) for name, value in pairs}  # type: ignore[attr-defined]
