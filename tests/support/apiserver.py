"""A Kubernetes API server for tests: kmock's ``KubernetesEmulator`` (objects kept in memory, the REST API
with lists, watches, creates, JSON merge patches and deletes) on loopback HTTP, in a thread of its own, with a
kubeconfig file pointing at it. The agent (in-process or as a process) reaches it through the real client.

    def test_labels(apiserver: ApiServer) -> None:
        apiserver.put("nodes", {"metadata": {"name": "node-1"}})
        ...  # start the agent with --kubeconfig apiserver.kubeconfig --node-name node-1
        node = apiserver.wait_for(lambda: apiserver.get("nodes", "node-1"), lambda n: "accelerator" in ...)

Outages on demand, for every request or only those of one verb and resource::

    apiserver.fail("hang")                             # every request waits until behave() or stop()
    apiserver.fail("hang", seconds=30)                 # every request waits 30 s, then is served
    apiserver.fail(403, verb="create", resource="events")
    apiserver.fail(500)
    apiserver.behave()

A server without a feature, which drops its fields from what is written::

    apiserver.rewrite_writes("resourceslices", drop_taints)

Watches of a resource see the objects ``put`` (as ADDED or MODIFIED) and everything the client writes.
What the emulator does not do (kmock 0.8): label and field selectors are ignored (a list or watch gets every
object of the resource), there is no ``resourceVersion`` or conflict (409 only for a create of an existing
name), and every PATCH is applied as a JSON merge patch whatever its content type. PUT (update) is served
here on top of kmock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp.web
import attrs
import kmock
import pytest
from kmock._internal.k8s import KubernetesError, KubernetesObjectNotFoundError
from kmock._internal.rendering import Request

from tests.support import PATIENCE

T = TypeVar("T")

# Kinds the emulator lists even while none exist (it answers 404 for a resource it has never seen).
_KNOWN = {
    "nodes": ("", "v1", "nodes", False),
    "events": ("", "v1", "events", True),
    "pods": ("", "v1", "pods", True),
    "configmaps": ("", "v1", "configmaps", True),
    "resourceslices": ("resource.k8s.io", "v1", "resourceslices", False),
    "resourceclaims": ("resource.k8s.io", "v1", "resourceclaims", True),
}
_VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
_REASONS = {
    401: "Unauthorized",
    403: "Forbidden",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}

Fault = int | Literal["hang"]


def _verb(request: Request) -> str:
    """The request's verb as RBAC names it: get, list, watch, create, patch, update, delete."""
    verb = _VERBS.get(str(request.method.value), "")
    if verb == "get" and request.params.get("watch") in ("true", "1"):
        return "watch"
    if verb == "get" and request.name is None:
        return "list"
    return verb


@dataclass(frozen=True, slots=True)
class _Rule:
    fault: Fault
    verb: str | None
    resource: str | None
    seconds: float | None = None  # a hang that ends (then the request is served) after this long

    def matches(self, request: Request) -> bool:
        verb = _verb(request)
        plural = request.resource.plural if request.resource is not None else None
        return (self.verb is None or self.verb == verb) and (self.resource is None or self.resource == plural)


@dataclass(frozen=True, slots=True)
class Seen:
    """One request the server received (recorded as it arrives, before any fault): ``verb`` as RBAC names
    it, the resource's plural, the body."""

    verb: str
    resource: str | None
    name: str | None
    path: str
    data: Any


@attrs.define(kw_only=True)
class _Emulator(kmock.KubernetesEmulator):
    rules: list[_Rule] = attrs.field(factory=list)
    released: asyncio.Event = attrs.field(factory=asyncio.Event)
    on_request: Callable[[Request], None] = attrs.field(default=lambda request: None)
    on_answered: Callable[[], None] = attrs.field(default=lambda: None)
    # By resource: what the server does to a written body before keeping it (one without a feature drops
    # that feature's fields).
    rewrites: dict[str, Callable[[dict[str, Any]], None]] = attrs.field(factory=dict)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        """As the API server does: a Status object with ``Content-Type: application/json`` exactly (aiohttp
        adds a charset, and clients tell a Status from a proxy's error page by this header)."""
        response = await super()._render_error(exc)
        assert isinstance(response, aiohttp.web.Response) and response.body is not None
        return aiohttp.web.Response(
            body=response.body, status=response.status, headers={"Content-Type": "application/json"}
        )

    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        self.on_request(request)
        try:
            for rule in self.rules:
                if rule.matches(request):
                    if rule.fault == "hang":
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(rule.seconds):
                                await self.released.wait()
                        break
                    status = int(rule.fault)
                    return await self._render_error(
                        KubernetesError(
                            status=status, reason=_REASONS.get(status, "Error"), message="refused"
                        )
                    )
            rewrite = self.rewrites.get(request.resource.plural if request.resource is not None else "")
            writes = _verb(request) in ("create", "patch", "update")
            if rewrite is not None and writes and isinstance(request.data, dict):
                rewrite(request.data)
            if str(request.method.value) == "PUT" and request.resource is not None and request.name:
                return await self._replace(request)
            return await super()._handle(request)
        finally:
            # kmock keeps every request it served and looks through all of them on each new one: an
            # answered request is dropped (ApiServer.seen keeps what the tests ask about).
            with contextlib.suppress(ValueError):
                self._requests.remove(request)
            self.on_answered()

    async def _replace(self, request: Request) -> aiohttp.web.StreamResponse:
        """PUT (update): kmock serves no PUT; the object becomes the request's body, as a merge patch that
        also removes what the body leaves out."""
        assert request.resource is not None
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                return await self._render_error(KubernetesObjectNotFoundError())
            stored = self._objects[key]
            stored.patch(_replacement(_plain(stored.raw), request.data))
            raw = _plain(stored.raw)
            await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
        return aiohttp.web.Response(
            body=json.dumps(raw).encode(), headers={"Content-Type": "application/json"}
        )


class ApiServer:
    """The emulator on 127.0.0.1 in its own thread; every method may be called from any thread."""

    def __init__(self, directory: Path) -> None:
        self.kubeconfig = directory / "kubeconfig"
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="apiserver", daemon=True)
        self._changed = threading.Condition()
        self._seen: list[Seen] = []
        self._generation = 0
        self._emulator: _Emulator | None = None
        self._server: kmock.Server | None = None

    def start(self) -> None:
        self._thread.start()
        self._call(self._start())
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: test, cluster: {{server: '{self.url}'}}}}]\n"
            "users: [{name: test, user: {token: test-token}}]\n"
            "contexts: [{name: test, context: {cluster: test, user: test}}]\n"
            "current-context: test\n"
        )

    def stop(self) -> None:
        if self._emulator is not None:
            self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        emulator = _Emulator(on_request=self._record, on_answered=self._moved)
        for group, version, plural, namespaced in _KNOWN.values():
            emulator.resources[f"{group}/{version}/{plural}" if group else f"{version}/{plural}"] = {
                "namespaced": namespaced
            }
        await emulator.__aenter__()
        server = kmock.Server(emulator)
        await server.__aenter__()
        self._emulator, self._server = emulator, server
        self.url = f"http://{server.host}:{server.port}"

    async def _stop(self) -> None:
        assert self._emulator is not None and self._server is not None
        self._emulator.released.set()
        await self._server.__aexit__(None, None, None)
        await self._emulator.__aexit__(None, None, None)

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _record(self, request: Request) -> None:
        verb = _verb(request)
        plural = request.resource.plural if request.resource is not None else None
        with self._changed:
            self._seen.append(Seen(verb, plural, request.name, request.url.path, request.data))
            self._generation += 1
            self._changed.notify_all()

    def _moved(self) -> None:
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    # faults ------------------------------------------------------------------------------------------------
    def fail(
        self, fault: Fault, verb: str | None = None, resource: str | None = None, seconds: float | None = None
    ) -> None:
        """From now on, requests (of ``verb`` on ``resource``, if given) hang (until :meth:`behave`, or for
        ``seconds``) or get the ``fault`` status."""

        async def add() -> None:
            assert self._emulator is not None
            if fault == "hang":
                self._emulator.released = asyncio.Event()
            self._emulator.rules.append(_Rule(fault, verb, resource, seconds))

        self._call(add())

    def rewrite_writes(self, resource: str, rewrite: Callable[[dict[str, Any]], None]) -> None:
        """From now on, every create, patch and update of ``resource`` is kept as ``rewrite`` leaves its body
        (changed in place), and answered so: an API server without a feature drops its fields."""

        async def add() -> None:
            assert self._emulator is not None
            self._emulator.rewrites[resource] = rewrite

        self._call(add())

    def behave(self) -> None:
        """No more faults; requests hanging now get their answers."""

        async def clear() -> None:
            assert self._emulator is not None
            self._emulator.rules.clear()
            self._emulator.released.set()

        self._call(clear())

    # objects -----------------------------------------------------------------------------------------------
    def put_claim(
        self,
        name: str,
        devices: list[str],
        *,
        driver: str,
        pool: str,
        uid: str | None = None,
        admin_access: bool = False,
        parameters: list[Any] | None = None,
    ) -> str:
        """A ResourceClaim in ``default`` whose allocation gives ``devices`` of ``pool`` to ``driver``, as the
        scheduler leaves it (with ``admin_access``, as it leaves an ``adminAccess: true`` request's; with
        ``parameters``: the driver's opaque config, the claim's, in order); its UID (a new one unless
        given)."""
        uid = uid if uid is not None else str(uuid.uuid4())
        admin: dict[str, Any] = {"adminAccess": True} if admin_access else {}
        results = [{"request": "npus", "driver": driver, "pool": pool, "device": d, **admin} for d in devices]
        request = {"name": "npus", "exactly": {"deviceClassName": "npu", **admin}}
        allocation: dict[str, Any] = {"results": results}
        if parameters:
            allocation["config"] = [
                {"source": "FromClaim", "requests": ["npus"], "opaque": {"driver": driver, "parameters": p}}
                for p in parameters
            ]
        self.put(
            "resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default", "uid": uid},
                "spec": {"devices": {"requests": [request]}},
                "status": {"allocation": {"devices": allocation}},
            },
        )
        return uid

    def put(self, resource: str, obj: dict[str, Any]) -> None:
        """Store ``obj`` (a dict with ``metadata.name``) as if someone had created it."""
        group, version, plural, _ = _KNOWN[resource]
        meta = obj.get("metadata", {})

        async def store() -> None:
            assert self._emulator is not None
            res = kmock.resource(group, version, plural)
            key = (res, meta.get("namespace"), meta["name"])
            known = key in self._emulator.objects
            self._emulator.objects[key] = obj
            await self._emulator._buses[res].put({"type": "MODIFIED" if known else "ADDED", "object": obj})

        self._call(store())
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def send_event(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        """A watch event of ``kind`` (ADDED, MODIFIED, DELETED) carrying ``obj``, with nothing stored: what a
        broken API server might send (an object without a name, say)."""
        group, version, plural, _ = _KNOWN[resource]

        async def send() -> None:
            assert self._emulator is not None
            await self._emulator._buses[kmock.resource(group, version, plural)].put(
                {"type": kind, "object": obj}
            )

        self._call(send())

    def delete(self, resource: str, name: str, namespace: str | None = None) -> None:
        """Delete an object through the REST API, as a client does (watches see it DELETED)."""
        group, version, plural, _ = _KNOWN[resource]
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        if namespace is not None:
            path += f"/namespaces/{namespace}"
        request = urllib.request.Request(f"{self.url}{path}/{plural}/{name}", method="DELETE")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status in (200, 202), answer.status

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        found = [o for o in self.list(resource, namespace) if o.get("metadata", {}).get("name") == name]
        return found[0] if found else None

    def list(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        group, version, plural, _ = _KNOWN[resource]

        async def read() -> list[dict[str, Any]]:
            assert self._emulator is not None
            res = kmock.resource(group, version, plural)
            return [
                _plain(obj.raw)
                for (r, ns, _), obj in list(self._emulator.objects.items())
                if r == res and not obj.deleted and (namespace is None or ns == namespace)
            ]

        return self._call(read())

    def seen(self) -> list[Seen]:
        with self._changed:
            return list(self._seen)

    def _moved_on(self, generation: int) -> bool:
        return self._generation != generation

    def wait_for(self, read: Callable[[], T], ready: Callable[[T], bool], timeout: float = PATIENCE) -> T:
        """Wait until ``ready(read())``, checked again after every request the server gets; fail with the last
        value read."""
        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                generation = self._generation
            value = read()
            if ready(value):
                return value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"not ready within {timeout:g} s; last: {value!r}")
            with self._changed:
                self._changed.wait_for(partial(self._moved_on, generation), remaining)


def _replacement(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that turns ``old`` into ``new``: keys ``new`` leaves out are set to null."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        patch[key] = (
            _replacement(before, value) if isinstance(before, dict) and isinstance(value, dict) else value
        )
    return patch


def _plain(value: Any) -> Any:
    """kmock's own mapping types as plain dicts and lists."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@pytest.fixture
def apiserver(short_dir: Path) -> Iterator[ApiServer]:
    """A started Kubernetes API emulator with ``.kubeconfig`` pointing at it."""
    server = ApiServer(short_dir)
    server.start()
    yield server
    server.stop()
