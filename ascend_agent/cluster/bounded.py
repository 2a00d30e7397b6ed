"""Every answer of the API server bounded in bytes, at the HTTP transport, so that no request can be made
without it: the asynchronous client, the blocking one, lists and watches alike.

An answer is read whole before lightkube decodes it, and a watch line is gathered until its newline: an API
server that is broken or hostile and streams without end would have the agent hold all of it (5 GB in 30 s
were measured). So each answer may be at most :data:`OBJECT_LIMIT` bytes, each line of a watch the same (a
watch event is one object), and the answers of one list (every page of it) together at most the limit given
to :func:`answers_of_a_list`; past it the read fails with :class:`AnswerTooLarge`, which the client records
as the API server being unusable. The transport asks for answers without compression (an answer compressed
anyway is refused): a compressed answer would be bounded only before it was inflated.

    transport = BoundedAsyncTransport(httpx2.AsyncHTTPTransport(verify=context))
    with answers_of_a_list(64 * MIB):
        pods = [pod async for pod in client.list(Pod)]
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import httpx2

from ascend_agent.config import DEFAULT_API_LIST_LIMIT_MIB

MIB = 1024 * 1024
# The API server stores an object of at most 1.5 MiB (etcd's default request limit); an answer about one
# object, or a watch event, is never much more.
OBJECT_LIMIT = 4 * MIB
DEFAULT_LIST_LIMIT = DEFAULT_API_LIST_LIMIT_MIB * MIB


class AnswerTooLarge(httpx2.HTTPError):
    """An answer (or a watch line) longer than its bound, or compressed though not asked to be."""


class _Budget:
    """Bytes an answer, or every page of one list, may still take."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.left = limit
        self.what = what

    def take(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise AnswerTooLarge(f"{self.what} over {_mib(self.limit)}, refused")


_list_budget: ContextVar[_Budget | None] = ContextVar("ascend_agent_list_budget", default=None)


@contextmanager
def answers_of_a_list(limit: int) -> Iterator[None]:
    """The answers of requests made within (every page of one list) share ``limit`` bytes."""
    token = _list_budget.set(_Budget(limit, "a list (apiListLimitMib)"))
    try:
        yield
    finally:
        _list_budget.reset(token)


class _Counter:
    """Counts one answer's bytes against its budget; for a watch, each line's instead."""

    def __init__(self, request: httpx2.Request) -> None:
        self._watch = request.url.params.get("watch") == "true"
        if self._watch:
            self._budget = _Budget(OBJECT_LIMIT, "a watch event")
        else:
            self._budget = _list_budget.get() or _Budget(OBJECT_LIMIT, "an answer")

    def count(self, chunk: bytes) -> None:
        if not self._watch:
            self._budget.take(len(chunk))
            return
        newline = chunk.rfind(b"\n")
        if newline >= 0:  # the bytes after the last newline start the next line
            self._budget.left = self._budget.limit
            chunk = chunk[newline + 1 :]
        self._budget.take(len(chunk))


def _ask_uncompressed(request: httpx2.Request) -> None:
    request.headers["Accept-Encoding"] = "identity"


def _check_encoding(response: httpx2.Response) -> None:
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerTooLarge(f"an answer compressed ({encoding}) though asked not to be, refused")


class _BoundedAsyncStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, counter: _Counter) -> None:
        self._inner = inner
        self._counter = counter

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._counter.count(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _BoundedStream(httpx2.SyncByteStream):
    def __init__(self, inner: httpx2.SyncByteStream, counter: _Counter) -> None:
        self._inner = inner
        self._counter = counter

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._counter.count(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class BoundedAsyncTransport(httpx2.AsyncBaseTransport):
    """``inner`` with every answer bounded."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        _ask_uncompressed(request)
        response = await self._inner.handle_async_request(request)
        try:
            _check_encoding(response)
        except AnswerTooLarge:
            await response.aclose()
            raise
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_BoundedAsyncStream(response.stream, _Counter(request)),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedTransport(httpx2.BaseTransport):
    """``inner`` with every answer bounded, for the blocking client."""

    def __init__(self, inner: httpx2.BaseTransport) -> None:
        self._inner = inner

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        _ask_uncompressed(request)
        response = self._inner.handle_request(request)
        try:
            _check_encoding(response)
        except AnswerTooLarge:
            response.close()
            raise
        assert isinstance(response.stream, httpx2.SyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_BoundedStream(response.stream, _Counter(request)),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._inner.close()


def _mib(size: int) -> str:
    return f"{size / MIB:g} MiB"
