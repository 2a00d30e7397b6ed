"""The one Kubernetes client of the agent: lightkube's ``AsyncClient`` plus the bookkeeping every request
needs. This module imports lightkube; only :func:`ascend_agent.cluster.start` imports this module, so an
agent with the cluster side off never loads it.

    api = KubeApi.connect(target, node="node-1")
    node = await api.call("get", "nodes", api.client.get(Node, api.node))

:meth:`KubeApi.call` bounds the request by ``timeout`` (a hanging API server is a failure after that long,
never a wait without end), records the outcome in :class:`~ascend_agent.cluster.health.ApiHealth`, and turns
every failure that means "the API server does not serve us" (no answer, 401, 403, 429, 5xx) into
:class:`ApiUnavailable`. Answers a feature handles itself (404, 409, 422) come back as lightkube's
``ApiError``
and count as the API server working. Every answer is bounded in bytes at the transport
(:mod:`ascend_agent.cluster.bounded`): a ``list`` call's pages together by ``list_limit``, any other answer
and each line of a watch by 4 MiB; past that the request fails as the API server being unusable.

Every request of the cluster side first takes a token of the client's rate limit (``apiQps`` a second,
``apiBurst`` at once; see :mod:`~ascend_agent.cluster.ratelimit`), waiting asleep while none is left; a
request a kubelet call waits on (Allocate, NodePrepareResources) passes ``limited=False`` and never waits. A
429 or 503 with ``Retry-After`` carries that wait (at most :data:`MAX_RETRY_AFTER`) on its
:class:`ApiUnavailable`, for :func:`~ascend_agent.backoff.wait_before_retry`.

A watch is resumed rather than listed again (:meth:`KubeApi.watch`): it asks for bookmarks, keeps the newest
resourceVersion in a :class:`WatchCursor`, and after a failure opens again from there; only a 410 Gone (the
API server no longer has that version) makes the caller list again::

    cursor = WatchCursor()
    while True:
        try:
            if cursor.version is None:
                cursor.version = await list_them(api)     # the list's resourceVersion
            async for kind, pod in api.watch("pods", Pod, cursor, server_timeout=300):
                ...                                       # ADDED, MODIFIED, DELETED; no BOOKMARK
        except ApiUnavailable as exc:
            await wait_before_retry(backoff, exc)         # then from cursor.version again
"""

from __future__ import annotations

import email.utils
import inspect
import logging
import math
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import httpx2
import msgspec
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core import decoders
from lightkube.core.exceptions import ApiError, ConfigError, NotReadyError

from ascend_agent.cluster.bounded import (
    DEFAULT_LIST_LIMIT,
    AnswerTooLarge,
    BoundedAsyncTransport,
    BoundedTransport,
    answers_of_a_list,
)
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.cluster.health import ApiHealth, Failure
from ascend_agent.cluster.ratelimit import TokenBucket

log = logging.getLogger("ascend_agent.cluster")

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
# A watch that delivers nothing, not even a bookmark (the API server sends one a minute to a watch that asks),
# for this long is taken for a connection that died silently, ended and opened again from its version. An API
# server that sends no periodic bookmarks gets an idle watch opened again this often: as often as before
# watches lasted long.
WATCH_IDLE = 300.0
# A watch that ends sooner than this, having delivered nothing, is a failure (waits for the back-off).
SHORT_WATCH = 1.0
# Answers that are about the request, not about the API server: the feature that asked decides.
ANSWERS = frozenset({404, 409, 410, 422})
# The longest Retry-After obeyed: a broken header must not stall the agent for hours.
MAX_RETRY_AFTER = 60.0
# Refusals whose Retry-After is the API server's (priority and fairness, an overloaded server).
_ASKS_TO_WAIT = frozenset({429, 503})


class ApiUnavailable(Exception):
    """The API server did not serve a request: down, hanging, or refusing. Retry later, not before
    ``retry_after`` seconds (the Retry-After of a 429 or 503; 0 when none was given)."""

    def __init__(self, channel: str, failure: Failure, retry_after: float = 0.0) -> None:
        super().__init__(f"{channel}: {failure}")
        self.channel = channel
        self.failure = failure
        self.retry_after = retry_after


@dataclass(slots=True)
class WatchCursor:
    """Where a watch goes on from: the newest resourceVersion it saw (None: list first)."""

    version: str | None = None


class ClusterConnectError(Exception):
    """The credentials cannot be used (a kubeconfig that does not exist or does not parse)."""


class KubeApi:
    """The shared client: ``client`` for requests, ``call`` around each, ``node`` the agent's own Node."""

    def __init__(
        self,
        client: AsyncClient,
        node: str,
        server: str,
        timeout: float = DEFAULT_TIMEOUT,
        config: SingleConfig | None = None,
        list_limit: int = DEFAULT_LIST_LIMIT,
        qps: float = 0.0,
        burst: int = 1,
    ) -> None:
        self.client = client
        self.node = node
        self.timeout = timeout
        self.watch_idle = WATCH_IDLE
        self._may_not_list: set[str] = set()  # resources a list of was refused (403), said once
        self.list_limit = list_limit
        self._bucket = TokenBucket(qps, burst) if qps > 0 else None
        self.health = ApiHealth(server)
        self._config = config  # for the blocking client, made on the first call_blocking
        self._blocking: Client | None = None
        self._blocking_closed = False
        self._blocking_lock = threading.Lock()

    @classmethod
    def connect(
        cls,
        target: ClusterTarget,
        node: str,
        timeout: float = DEFAULT_TIMEOUT,
        list_limit: int = DEFAULT_LIST_LIMIT,
        qps: float = 0.0,
        burst: int = 1,
        context: str | None = None,
    ) -> KubeApi:
        """A client for ``target``; no request is made here. ``list_limit``: bytes a list may take; ``qps``
        and ``burst``: the rate limit (0 qps: none); ``context``: the kubeconfig's context to use (None: its
        current one)."""
        try:
            if target.kind == "in-cluster":
                config = KubeConfig.from_service_account()
            else:
                assert target.kubeconfig is not None
                config = KubeConfig.from_file(target.kubeconfig)
            single = config.get(context_name=context)
            if single is None:
                raise ConfigError("it names no current context")
            server = single.cluster.server
            if urllib.parse.urlsplit(server).scheme == "http":
                # Plain HTTP shows no certificate: without this, lightkube and the transport would each
                # read the system's CA bundle into memory (1.6 MiB together) to verify none.
                single = single._replace(cluster=msgspec.structs.replace(single.cluster, insecure=True))
            client = AsyncClient(
                config=single,
                timeout=httpx2.Timeout(timeout),
                field_manager="ascend-agent",
                transport=BoundedAsyncTransport(httpx2.AsyncHTTPTransport(**_transport_options(single))),
            )
        # Any kubeconfig a person wrote can fail here in its own way (YAML syntax, a list instead of a map, a
        # context naming an absent cluster, a certificate file that is not there): all of them are bad input.
        except Exception as exc:
            what = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ClusterConnectError(
                f"cannot use {target.describe()}: {type(exc).__name__}: {what}"
            ) from None
        return cls(client, node, server, timeout, single, list_limit, qps, burst)

    async def call(
        self,
        verb: str,
        resource: str,
        request: Awaitable[T],
        answers: frozenset[int] = ANSWERS,
        limited: bool = True,
    ) -> T:
        """Await one request of ``verb`` on ``resource`` (both only name it, for the log and the metric).
        An error status in ``answers`` is raised as lightkube's ``ApiError`` for the caller; any other is an
        outage (``answers=frozenset()`` for a request whose 404 means the setup is wrong). The answers of a
        ``list`` (every page of it) may take ``list_limit`` bytes together, any other answer 4 MiB. The
        request first waits for the rate limit (not counted in ``timeout``), unless ``limited`` is False."""
        channel = f"{verb} {resource}"
        if limited:
            try:
                await self._take_token()
            except BaseException:
                if inspect.iscoroutine(request):
                    request.close()  # never to be awaited: closed, so that it is not reported as forgotten
                raise
        try:
            with anyio.fail_after(self.timeout):
                if verb == "list":
                    with answers_of_a_list(self.list_limit):
                        result = await request
                else:
                    result = await request
        except Exception as exc:
            failed = self._failed(channel, verb, resource, exc, answers)
            if failed is exc:
                raise
            raise failed from None
        self.health.record_success(channel)
        return result

    async def call_blocking(
        self,
        verb: str,
        resource: str,
        request: Callable[[Client], T],
        answers: frozenset[int] = ANSWERS,
        limited: bool = True,
    ) -> T:
        """As :meth:`call`, for ``request(client)`` with lightkube's blocking ``Client``, run in a worker
        thread. For requests made while Allocates are being answered (the pods' marks of ``--volcano``): the
        HTTP client spends about 0.6 ms of Python on each request, which on the event loop would hold up an
        Allocate arriving meanwhile for all of it; in a thread, the Allocate gets the interpreter at the
        request's next blocking call (or after the interpreter's 5 ms switch interval). The wait is bounded by
        ``timeout`` and ends on cancellation as :meth:`call`'s does; the thread is then left to finish on its
        own (within the client's own timeout)::

            await api.call_blocking("patch", "pods", lambda client: client.patch(Pod, name, patch))
        """
        if limited:
            await self._take_token()
        in_thread = anyio.to_thread.run_sync(self._blocking_call, request, abandon_on_cancel=True)
        return await self.call(verb, resource, in_thread, answers, limited=False)

    async def _take_token(self) -> None:
        if self._bucket is not None:
            await self._bucket.take()

    def _blocking_call(self, request: Callable[[Client], T]) -> T:
        with self._blocking_lock:  # made once, never after close()
            if self._blocking_closed:
                raise ConfigError("the client is closed")
            if self._blocking is None:
                if self._config is None:
                    raise ConfigError("this client was made without a configuration for blocking requests")
                self._blocking = Client(
                    config=self._config,
                    timeout=httpx2.Timeout(self.timeout),
                    field_manager="ascend-agent",
                    transport=BoundedTransport(httpx2.HTTPTransport(**_transport_options(self._config))),
                )
            client = self._blocking
        return request(client)

    def _close_blocking(self) -> None:
        with self._blocking_lock:
            self._blocking_closed = True
            client, self._blocking = self._blocking, None
        if client is not None:
            client.close()

    async def stream(
        self, resource: str, watch: AsyncIterable[T], answers: frozenset[int] = frozenset({410})
    ) -> AsyncIterator[T]:
        """The items of a watch (``api.client.watch(...)``) on ``resource``, its failures recorded and raised
        as by :meth:`call` under the channel ``watch <resource>``; no time bound, a watch lasts. An error
        status in ``answers`` is the caller's (410: the resourceVersion is too old, list again)::

            async for kind, pod in api.stream("pods", api.client.watch(Pod, namespace="*")):
                ...
        """
        channel = f"watch {resource}"
        try:
            async for item in watch:
                self.health.record_success(channel)
                yield item
        except Exception as exc:
            failed = self._failed(channel, "watch", resource, exc, answers)
            if failed is exc:
                raise
            raise failed from None

    async def watch(
        self,
        resource: str,
        res: type[Any],
        cursor: WatchCursor,
        *,
        server_timeout: int,
        namespace: str | None = None,
        fields: Mapping[str, object] | None = None,
        answers: frozenset[int] = frozenset(),
    ) -> AsyncIterator[tuple[str, Any]]:
        """One watch of ``res`` from ``cursor.version`` (None: from now, the objects there first as ADDED),
        with bookmarks, until the API server ends it (after ``server_timeout`` seconds) or it delivers
        nothing for ``watch_idle`` seconds; a rate-limited request. Yields (type, object) but for bookmarks,
        and moves ``cursor`` past each event handled. A 410 Gone ends it with ``cursor.version`` None: list
        again. Failures are raised as by :meth:`stream`::

            async for kind, found in api.watch("configmaps", ConfigMap, cursor, server_timeout=300,
                                               namespace="kube-system", fields={"metadata.name": name}):
                ...
        """
        await self._take_token()
        opened_at, delivered, quiet = anyio.current_time(), False, False
        opened = watch_events(
            self.client,
            res,
            namespace=namespace,
            fields=fields,
            resource_version=cursor.version,
            server_timeout=server_timeout,
            timeout=httpx2.Timeout(self.timeout, read=self.watch_idle),
        )

        async def events() -> AsyncIterator[tuple[str, Any, str | None]]:
            try:
                async for event in opened:
                    yield event
            except httpx2.ReadTimeout:
                nonlocal quiet
                quiet = True
                log.debug("Watch of %s quiet for %g s; opening it again", resource, self.watch_idle)
            except (msgspec.ValidationError, msgspec.DecodeError, AnswerTooLarge):
                # A watch from before an event it cannot read would meet it again: a list, which leaves out
                # what it cannot read, goes past it.
                cursor.version = None
                raise

        try:
            async for kind, found, version in self.stream(resource, events(), answers | {410}):
                delivered = True
                if kind != "BOOKMARK":
                    yield kind, found
                cursor.version = version or cursor.version
        except httpx2.HTTPStatusError as exc:
            if _status(exc) != 410:
                raise
            log.debug("Watch of %s from version %s: 410 Gone; listing again", resource, cursor.version)
            cursor.version = None
            return
        if not (delivered or quiet) and anyio.current_time() - opened_at < SHORT_WATCH:
            # Something answers and hangs up at once (a proxy, a server shutting down): opened again at
            # once, the watch would be a tight loop; as a failure, it waits for the caller's back-off.
            failure = Failure(0, "the watch ended as soon as it was opened")
            self.health.record_failure(f"watch {resource}", failure)
            raise ApiUnavailable(f"watch {resource}", failure)

    async def read_named(
        self, resource: str, res: type[Any], name: str, namespace: str
    ) -> tuple[Any | None, str | None]:
        """The object ``name`` of ``res`` in ``namespace`` (None when there is none) and the resourceVersion
        to watch it from, by a list of that one name. A list answers with the API server's current version;
        a get gives the object's own, as old as its last change, and a watch from a version the API server
        no longer keeps (after it restarted, or once its watch cache moved on) is answered 410 Gone at once:
        a get, a watch from it and a 410 would follow each other without end::

            found, version = await api.read_named("configmaps", ConfigMap, NAME, namespace="kube-system")
        """

        listed = listed_with_version(self.client, res, namespace=namespace, fields={"metadata.name": name})
        try:
            items, version = await self.call("list", resource, listed, answers=ANSWERS | {403})
        except httpx2.HTTPStatusError as exc:
            if _status(exc) != 403:
                raise
            return await self._get_named(resource, res, name, namespace)
        found = next((i for i in items if i.metadata is not None and i.metadata.name == name), None)
        return found, version

    async def _get_named(
        self, resource: str, res: type[Any], name: str, namespace: str
    ) -> tuple[Any | None, str | None]:
        """:meth:`read_named` where the agent may not list (a Role from before it needed to): a get, and no
        version, so that the watch starts from now (the object first, as ADDED) and not from the object's
        own version, which the API server may refuse again and again."""
        if resource not in self._may_not_list:
            self._may_not_list.add(resource)
            log.warning(
                "The agent may not list %s (403 Forbidden: its Role lacks list; the chart's has it): reading "
                "each with get",
                resource,
            )
        try:
            found = await self.call(
                "get", resource, self.client.get(res, name, namespace=namespace), answers=frozenset({404})
            )
        except ApiError:
            return None, None
        return found, None

    def _failed(
        self, channel: str, verb: str, resource: str, exc: Exception, answers: frozenset[int]
    ) -> Exception:
        """What to raise for ``exc``: itself for an answer in ``answers``, else a recorded
        :class:`ApiUnavailable`."""
        if isinstance(exc, AnswerTooLarge):
            failure = Failure(0, f"{exc} (a broken API server, or something else answering at its address)")
        elif isinstance(exc, ApiError):
            code = _status(exc)
            if code in answers:
                self.health.record_success(channel)
                return exc
            failure = _refusal(code, exc.status.reason, verb, resource, self.node)
        elif isinstance(exc, httpx2.HTTPStatusError):
            # Not the API server's JSON (a proxy in between, say), or any refused watch or list: lightkube
            # raises the HTTP client's own error for their status.
            code = exc.response.status_code
            if verb in ("watch", "list") and code in answers:
                self.health.record_success(channel)
                return exc
            failure = _refusal(code, exc.response.reason_phrase, verb, resource, self.node)
        elif isinstance(exc, TimeoutError | httpx2.TimeoutException):
            failure = Failure(0, f"no answer within {self.timeout:g} s")
        elif isinstance(exc, httpx2.TransportError):
            failure = Failure(0, f"unreachable: {exc or type(exc).__name__}")
        elif isinstance(exc, msgspec.ValidationError | msgspec.DecodeError):
            failure = Failure(0, f"an answer the client cannot read: {exc}")
        elif isinstance(exc, OSError | ConfigError):  # the token file of the credentials gone or unreadable
            failure = Failure(0, f"cannot make the request: {type(exc).__name__}: {exc}")
        else:
            # What else the client raises for a request is about the answer: an error page without a
            # Content-Type (lightkube's KeyError), one that says JSON but is not (ValueError), and the like.
            failure = Failure(0, f"an answer the client cannot read ({type(exc).__name__}: {exc})")
        self.health.record_failure(channel, failure)
        asked = exc.response if isinstance(exc, httpx2.HTTPStatusError) else None
        if asked is not None and failure.status in _ASKS_TO_WAIT:
            return ApiUnavailable(channel, failure, retry_after(asked.headers.get("Retry-After")))
        return ApiUnavailable(channel, failure)

    async def close(self) -> None:
        """Close the client's connections; shielded from the caller's cancellation (the agent stopping) but
        given up after ``timeout``, so a connection that does not close cannot hold the agent's exit."""
        with anyio.move_on_after(self.timeout, shield=True):
            await self.client.close()
            await anyio.to_thread.run_sync(self._close_blocking, abandon_on_cancel=True)


async def watch_events(
    client: AsyncClient,
    res: type[Any],
    *,
    namespace: str | None,
    fields: Mapping[str, object] | None,
    resource_version: str | None,
    server_timeout: int,
    timeout: httpx2.Timeout,
) -> AsyncIterator[tuple[str, Any, str | None]]:
    """One watch request with ``allowWatchBookmarks=true``, its events as (type, object, resourceVersion)
    until the API server ends it; an ERROR event is raised as ``ApiError``, a refusal as the HTTP client's
    ``HTTPStatusError``. lightkube's own ``watch`` neither asks for bookmarks nor ends when the server ends
    the watch (it opens it again itself, past the rate limit), so the request is built and read here with
    lightkube's parts: the one place this module uses lightkube's internals."""
    generic = client._client
    request = generic.prepare_request(
        "list",
        res=res,
        namespace=namespace,
        watch=True,
        params={
            "timeoutSeconds": server_timeout,
            "resourceVersion": resource_version,
            "fieldSelector": ",".join(f"{key}={value}" for key, value in fields.items()) if fields else None,
            "allowWatchBookmarks": "true",
        },
    )
    request.timeout = timeout
    response = await generic.send(generic.build_adapter_request(request), stream=True)  # type: ignore[no-untyped-call]
    try:
        response.raise_for_status()
        async for line in response.aiter_lines():
            event = decoders.decode_watch_event(line)
            if event.type == "ERROR":
                raise ApiError(status=decoders.decode_status(event.object))
            if event.type == "BOOKMARK":
                # Only its version is read: the object around it is empty and may not decode as its kind (a
                # Pod's bookmark has a spec with "containers": null, which a Pod may not have).
                bookmark = msgspec.json.decode(event.object, type=_Bookmark)
                yield event.type, None, bookmark.metadata.resourceVersion
                continue
            found = decoders.decode_object(event.object, res)
            yield event.type, found, found.metadata.resourceVersion if found.metadata else None
    finally:
        await response.aclose()


async def listed_with_version(
    client: AsyncClient, res: type[Any], **selection: Any
) -> tuple[list[Any], str | None]:
    """Every item of ``client.list(res, **selection)`` and the list's resourceVersion, to watch from (None
    for an answer without one: the watch then starts from now)::

        items, version = await api.call("list", "pods", listed_with_version(api.client, Pod, namespace="*"))
    """
    listing = client.list(res, **selection)
    items = [item async for item in listing]
    try:
        version: str | None = listing.resourceVersion
    except NotReadyError:
        version = None
    return items, version


class _BookmarkMeta(msgspec.Struct):
    resourceVersion: str | None = None


class _Bookmark(msgspec.Struct):
    metadata: _BookmarkMeta = msgspec.field(default_factory=_BookmarkMeta)


def retry_after(header: str | None, now: Callable[[], float] = time.time) -> float:
    """The seconds a ``Retry-After`` header asks for (seconds or an HTTP date), within 0 and
    :data:`MAX_RETRY_AFTER`; 0 without one, or for one that says nothing readable.

    >>> retry_after("2"), retry_after("86400"), retry_after("soon"), retry_after(None), retry_after("inf")
    (2.0, 60.0, 0.0, 0.0, 60.0)
    >>> retry_after("Thu, 01 Jan 1970 00:00:05 GMT", now=lambda: 1.0)
    4.0
    """
    if header is None:
        return 0.0
    try:
        seconds = float(header)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(header).timestamp() - now()
        except (TypeError, ValueError):
            return 0.0
    if math.isnan(seconds):
        return 0.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _status(exc: httpx2.HTTPStatusError) -> int:
    """The status of a refusal: its Status object's (an ERROR event of a watch has only that), else the
    HTTP answer's."""
    code = exc.status.code if isinstance(exc, ApiError) else None
    if code:
        return int(code)
    # An ERROR event whose Status has no code comes without an HTTP answer of its own: a server error.
    return exc.response.status_code if exc.response is not None else 500


def _transport_options(config: SingleConfig) -> dict[str, Any]:
    """What lightkube would give the transport it makes itself: the TLS context of the kubeconfig (with its
    client certificate), and the proxy of the environment (``HTTPS_PROXY``, ``NO_PROXY``) for the server."""
    if config.user is None:
        raise ConfigError("its context names no user")
    context = verify_cluster(config.cluster, config.user, config.abs_file)
    url = urllib.parse.urlsplit(config.cluster.server)
    proxy = None
    if not urllib.request.proxy_bypass(url.hostname or ""):
        proxies = urllib.request.getproxies()
        proxy = proxies.get(url.scheme) or proxies.get("all")
    return {"verify": context, "proxy": proxy}


def _refusal(code: int, reason: str | None, verb: str, resource: str, node: str) -> Failure:
    if code == 404 and resource == "nodes":
        return Failure(
            404, f"404 Not Found: there is no Node {node} (--node-name, NODE_NAME or the hostname)"
        )
    if code == 403:
        return Failure(403, f"403 Forbidden: the agent may not {verb} {resource} (check its RBAC)")
    if code == 401:
        return Failure(401, "401 Unauthorized: the credentials were refused")
    return Failure(code, f"{code} {reason or 'error'}")
