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
"""

from __future__ import annotations

import threading
import urllib.parse
import urllib.request
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import httpx2
import msgspec
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core.exceptions import ApiError, ConfigError

from ascend_agent.cluster.bounded import (
    DEFAULT_LIST_LIMIT,
    AnswerTooLarge,
    BoundedAsyncTransport,
    BoundedTransport,
    answers_of_a_list,
)
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.cluster.health import ApiHealth, Failure

T = TypeVar("T")

DEFAULT_TIMEOUT = 10.0
# Answers that are about the request, not about the API server: the feature that asked decides.
ANSWERS = frozenset({404, 409, 410, 422})


class ApiUnavailable(Exception):
    """The API server did not serve a request: down, hanging, or refusing. Retry later."""

    def __init__(self, channel: str, failure: Failure) -> None:
        super().__init__(f"{channel}: {failure}")
        self.channel = channel
        self.failure = failure


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
    ) -> None:
        self.client = client
        self.node = node
        self.timeout = timeout
        self.list_limit = list_limit
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
    ) -> KubeApi:
        """A client for ``target``; no request is made here. ``list_limit``: bytes a list may take."""
        try:
            if target.kind == "in-cluster":
                config = KubeConfig.from_service_account()
            else:
                assert target.kubeconfig is not None
                config = KubeConfig.from_file(target.kubeconfig)
            single = config.get()
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
        return cls(client, node, server, timeout, single, list_limit)

    async def call(
        self, verb: str, resource: str, request: Awaitable[T], answers: frozenset[int] = ANSWERS
    ) -> T:
        """Await one request of ``verb`` on ``resource`` (both only name it, for the log and the metric).
        An error status in ``answers`` is raised as lightkube's ``ApiError`` for the caller; any other is an
        outage (``answers=frozenset()`` for a request whose 404 means the setup is wrong). The answers of a
        ``list`` (every page of it) may take ``list_limit`` bytes together, any other answer 4 MiB."""
        channel = f"{verb} {resource}"
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
        self, verb: str, resource: str, request: Callable[[Client], T], answers: frozenset[int] = ANSWERS
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
        in_thread = anyio.to_thread.run_sync(self._blocking_call, request, abandon_on_cancel=True)
        return await self.call(verb, resource, in_thread, answers)

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

    def _failed(
        self, channel: str, verb: str, resource: str, exc: Exception, answers: frozenset[int]
    ) -> Exception:
        """What to raise for ``exc``: itself for an answer in ``answers``, else a recorded
        :class:`ApiUnavailable`."""
        if isinstance(exc, AnswerTooLarge):
            failure = Failure(0, f"{exc} (a broken API server, or something else answering at its address)")
        elif isinstance(exc, ApiError):
            code = exc.status.code or exc.response.status_code
            if code in answers:
                self.health.record_success(channel)
                return exc
            failure = _refusal(code, exc.status.reason, verb, resource, self.node)
        elif isinstance(exc, httpx2.HTTPStatusError):
            # Not the API server's JSON (a proxy in between, say), or any refused watch: lightkube raises the
            # HTTP client's own error for a watch's status.
            code = exc.response.status_code
            if verb == "watch" and code in answers:
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
        return ApiUnavailable(channel, failure)

    async def close(self) -> None:
        """Close the client's connections; shielded from the caller's cancellation (the agent stopping) but
        given up after ``timeout``, so a connection that does not close cannot hold the agent's exit."""
        with anyio.move_on_after(self.timeout, shield=True):
            await self.client.close()
            await anyio.to_thread.run_sync(self._close_blocking, abandon_on_cancel=True)


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
