"""An API server with resourceVersions, for tests of how the agent watches: objects of any resource kept by
name, one counter of versions, a history of changes that watches resume from, and the ends a real API
server gives a watch. On loopback HTTP in a thread of its own, with a kubeconfig for it; every request is
recorded with its arrival time (``time.monotonic``)::

    with VersionedApi(tmp_path) as server:
        server.put("configmaps", {"metadata": {"name": "m", "namespace": "kube-system"}, "data": {}})
        ...                                   # the agent, with --kubeconfig server.kubeconfig
        server.end_watches()                  # each open watch ends as after its timeoutSeconds
        server.put("configmaps", obj, seen=False)   # a change an open watch never delivers (the line cut)
        server.drop_watches()                 # each open watch's connection is cut
        server.compact()                      # versions before now are gone: a watch from one gets 410
        server.bookmark()                     # each open watch that asked for bookmarks gets one
        server.refuse(429, "watch", retry_after="2")   # the next watch is refused so
        server.wait_for(lambda: len(server.arrived("list")) == 2)

What it leaves out: selectors (every object of the resource is listed and watched), writes (only reads and
watches are served), namespaces (a name is one object whatever its namespace).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp.web

from tests.support import PATIENCE


@dataclass(frozen=True, slots=True)
class Arrived:
    verb: str  # get, list, watch
    resource: str
    params: dict[str, str]
    at: float


@dataclass(slots=True)
class _Refusal:
    status: int
    verb: str
    retry_after: str | None


def _status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "message": message}


class VersionedApi:
    def __init__(self, directory: Path) -> None:
        self.kubeconfig = directory / "versioned-kubeconfig"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="versioned-api", daemon=True)
        self._runner: aiohttp.web.AppRunner | None = None
        self._changed = threading.Condition()
        self._arrived: list[Arrived] = []
        self._objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []  # version, resource, type, object
        self._version = 100
        self._compacted = 0
        self._watches: set[asyncio.Queue[tuple[str, Any]]] = set()
        self._refusals: list[_Refusal] = []
        self._hang_ups = 0

    # running -----------------------------------------------------------------------------------------------
    def __enter__(self) -> VersionedApi:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: v, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
            "users: [{name: v, user: {token: t}}]\n"
            "contexts: [{name: v, context: {cluster: v, user: v}}]\n"
            "current-context: v\n"
        )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.drop_watches()
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> int:
        app = aiohttp.web.Application()
        app.router.add_get("/{path:.*}", self._serve)
        self._runner = aiohttp.web.AppRunner(app)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        port: int = server.sockets[0].getsockname()[1]
        return port

    def _in_loop(self, call: Callable[[], None]) -> None:
        async def run() -> None:
            call()

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)
        self._moved()

    def _moved(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # what the tests do ------------------------------------------------------------------------------------
    def put(self, resource: str, obj: dict[str, Any], seen: bool = True) -> str:
        """Store ``obj`` at a new version (returned); open watches deliver it unless ``seen`` is False."""
        return self._change(resource, obj, None, seen)

    def delete(self, resource: str, name: str, seen: bool = True) -> str:
        return self._change(resource, None, name, seen)

    def _change(self, resource: str, obj: dict[str, Any] | None, name: str | None, seen: bool) -> str:
        done: list[str] = []

        def change() -> None:
            self._version += 1
            version = str(self._version)
            key = (resource, str(name if obj is None else obj["metadata"]["name"]))
            if obj is None:
                gone = self._objects.pop(key)
                event, stored = (
                    "DELETED",
                    {**gone, "metadata": {**gone["metadata"], "resourceVersion": version}},
                )
            else:
                event = "MODIFIED" if key in self._objects else "ADDED"
                stored = {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}
                self._objects[key] = stored
            self._history.append((self._version, resource, event, stored))
            if seen:
                for queue in self._watches:
                    queue.put_nowait(("event", (resource, event, stored)))
            done.append(version)

        self._in_loop(change)
        return done[0]

    def compact(self) -> None:
        """Versions before the current one are gone: a watch from one of them gets 410 Gone."""
        self._in_loop(lambda: setattr(self, "_compacted", self._version))

    def end_watches(self) -> None:
        self._tell_watches("end")

    def drop_watches(self) -> None:
        self._tell_watches("drop")

    def bookmark(self) -> None:
        self._tell_watches("bookmark")

    def _tell_watches(self, what: str) -> None:
        def tell() -> None:
            for queue in self._watches:
                queue.put_nowait((what, None))

        self._in_loop(tell)

    def hang_up(self, watches: int) -> None:
        """The next ``watches`` watches are answered 200 and closed at once, with nothing in them."""

        def set_hang_ups() -> None:
            self._hang_ups = watches

        self._in_loop(set_hang_ups)

    def refuse(self, status: int, verb: str, retry_after: str | None = None) -> None:
        """The next request of ``verb`` is answered ``status`` (with this Retry-After)."""
        self._in_loop(lambda: self._refusals.append(_Refusal(status, verb, retry_after)))

    @property
    def watching(self) -> int:
        return len(self._watches)

    def arrived(self, verb: str | None = None) -> list[Arrived]:
        with self._changed:
            return [a for a in self._arrived if verb is None or a.verb == verb]

    def wait_for(self, ready: Callable[[], bool], timeout: float = PATIENCE) -> None:
        """Wait until ``ready()``, checked again after every request and change."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not ready():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"not ready within {timeout:g} s; arrived: {self._arrived!r}")
                self._changed.wait(remaining)

    # serving ----------------------------------------------------------------------------------------------
    async def _serve(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        parts = request.path.strip("/").split("/")
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if rest[:1] == ["namespaces"]:
            rest = rest[2:]
        resource, name = rest[0], (rest[1] if len(rest) > 1 else None)
        params = dict(request.query)
        verb = "watch" if params.get("watch") == "true" else "get" if name else "list"
        with self._changed:
            self._arrived.append(Arrived(verb, resource, params, time.monotonic()))
            self._changed.notify_all()
        for refusal in self._refusals:
            if refusal.verb == verb:
                self._refusals.remove(refusal)
                headers = {"Retry-After": refusal.retry_after} if refusal.retry_after else {}
                return aiohttp.web.json_response(
                    _status(refusal.status, "refused"), status=refusal.status, headers=headers
                )
        if verb == "watch":
            return await self._watch(request, resource, params)
        if verb == "get":
            found = self._objects.get((resource, name or ""))
            if found is None:
                return aiohttp.web.json_response(_status(404, "not found"), status=404)
            return aiohttp.web.json_response(found)
        items = [obj for (kind, _), obj in self._objects.items() if kind == resource]
        return aiohttp.web.json_response(
            {
                "kind": "List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self._version)},
                "items": items,
            }
        )

    async def _watch(
        self, request: aiohttp.web.Request, resource: str, params: dict[str, str]
    ) -> aiohttp.web.StreamResponse:
        answer = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await answer.prepare(request)
        if self._hang_ups:
            self._hang_ups -= 1
            return answer

        async def send(kind: str, obj: dict[str, Any]) -> None:
            await answer.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        since = params.get("resourceVersion")
        if since is not None and int(since) < self._compacted:
            await send("ERROR", _status(410, f"too old resource version: {since} ({self._compacted})"))
            return answer
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        if since is None:
            for (kind, _), obj in list(self._objects.items()):
                if kind == resource:
                    queue.put_nowait(("event", (resource, "ADDED", obj)))
        else:
            for version, kind, event, obj in self._history:
                if version > int(since) and kind == resource:
                    queue.put_nowait(("event", (resource, event, obj)))
        self._watches.add(queue)
        self._moved()
        try:
            async with asyncio.timeout(float(params.get("timeoutSeconds", "3600"))):
                while True:
                    what, item = await queue.get()
                    if what == "event" and item[0] == resource:
                        await send(item[1], item[2])
                    elif what == "bookmark" and params.get("allowWatchBookmarks") == "true":
                        # As the API server sends it: an empty object of the kind, a Pod's with a spec
                        # that names no containers (which a Pod may not have).
                        bookmark: dict[str, Any] = {"metadata": {"resourceVersion": str(self._version)}}
                        if resource == "pods":
                            bookmark.update(spec={"containers": None}, status={})
                        await send("BOOKMARK", bookmark)
                    elif what == "end":
                        break
                    elif what == "drop":
                        assert request.transport is not None
                        request.transport.close()
                        break
        except TimeoutError:
            pass
        finally:
            self._watches.discard(queue)
            self._moved()
        return answer
