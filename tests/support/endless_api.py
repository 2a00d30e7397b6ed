"""An API server gone wrong: an HTTP server on 127.0.0.1 that answers every request 200 with a body that
never ends (or with the ``answer`` given), in its own thread, with a kubeconfig for it.

    with EndlessApi(tmp) as server:                  # b"xxxx..." without end, no newline
        KubeApi.connect(ClusterTarget("kubeconfig", server.kubeconfig), "node-1")
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from types import TracebackType

_CHUNK = b"x" * 65536


class EndlessApi:
    def __init__(
        self, directory: Path, answer: bytes | None = None, headers: str = "", repeated: bytes = _CHUNK
    ) -> None:
        """``answer``: the whole body instead of one without end; ``headers``: lines added to the answer's
        (``"Content-Encoding: gzip\\r\\n"``); ``repeated``: what the body without end repeats (64 KiB of
        ``x``, no newline)."""
        self.kubeconfig = directory / "endless-kubeconfig"
        self._answer = answer
        self._headers = headers
        self._repeated = repeated
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="endless-api", daemon=True)
        self._server: asyncio.Server | None = None
        self.sent = 0  # body bytes written, over every request

    def __enter__(self) -> EndlessApi:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop
        ).result(10)
        port = self._server.sockets[0].getsockname()[1]
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: endless, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
            "users: [{name: endless, user: {token: t}}]\n"
            "contexts: [{name: endless, context: {cluster: endless, user: endless}}]\n"
            "current-context: endless\n"
        )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                if self._answer is not None:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        + self._headers.encode()
                        + f"Content-Length: {len(self._answer)}\r\n\r\n".encode()
                        + self._answer
                    )
                    self.sent += len(self._answer)
                    await writer.drain()
                    continue
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + self._headers.encode()
                    + b"Transfer-Encoding: chunked\r\n\r\n"
                )
                while True:
                    writer.write(b"%x\r\n%s\r\n" % (len(self._repeated), self._repeated))
                    self.sent += len(self._repeated)
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
