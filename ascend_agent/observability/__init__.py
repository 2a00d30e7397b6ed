"""What operators see: log lines (text or JSON lines) and Prometheus metrics.

configure_logging("info", "json")
log.info("Registered resource %s", resource, extra=log_fields(resource=resource))
REGISTRATIONS.labels(resource="huawei.com/Ascend910").inc()
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from ascend_agent import __version__
from ascend_agent.observability import npu_exporter

log = logging.getLogger(__name__)

_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


# Made now: the codec looked up at the first control character would be imported then, and with every
# descriptor in use (a connection flood) that import fails inside the logging of the failure.
_ESCAPES = {
    code: chr(code).encode("unicode_escape").decode("ascii") for code in (*range(0x20), *range(0x7F, 0xA0))
}


def _escaped(text: str) -> str:
    r"""``text`` with its control characters written as escapes: one record stays one line.

    >>> _escaped("model 910\nERROR forged")
    'model 910\\nERROR forged'
    """
    return text.translate(_ESCAPES)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname:<7} {_escaped(record.getMessage())}"
        if record.exc_info and record.levelno <= logging.DEBUG:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS})
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            entry["error"] = f"{type(error).__name__}: {error}"
        return json.dumps(entry, default=str)


def log_fields(**fields: Any) -> dict[str, Any]:
    """Structured fields for a log call's ``extra=``: JSON lines carry each beside ``msg`` (text lines show
    only the message, which names the same things). Fields that are None are left out; paths become strings,
    sets and tuples lists::

        log.warning("Allocate refused for %s: %s", resource, reason,
                    extra=log_fields(resource=resource, devices=ids, reason=reason))

    The names in use: ``resource`` (huawei.com/Ascend910), ``device`` / ``devices`` (device IDs),
    ``reason`` (why, in words), ``path`` (a file or directory), ``ids`` (physical chip ids), ``count``,
    ``settings`` (the effective configuration), ``suppressed`` (repeats held back, see RepeatLimiter).
    A name the log record itself uses (``msg``, ``name``, ``args``, ...) is refused with ValueError.
    """
    reserved = _STANDARD_ATTRS.intersection(fields)
    if reserved:
        raise ValueError(f"log field names taken by the log record: {', '.join(sorted(reserved))}")
    return {name: _plain(value) for name, value in fields.items() if value is not None}


def _plain(value: Any) -> Any:
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def configure_logging(level: str, log_format: str) -> None:
    """Send the agent's logs to stderr at ``level`` (debug, info, warning, error) as ``text`` or ``json``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if log_format == "json" else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx2 logs every request of the cluster side at info.
    for noisy in ("grpclib", "hpack", "h2", "httpx2", "httpcore2"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


# Metrics ---------------------------------------------------------------------------------------------------
disable_created_metrics()  # type: ignore[no-untyped-call]
DEVICES = Gauge("ascend_agent_devices", "Devices advertised to the kubelet.", ["resource", "health"])
DEVICE_HEALTH = Gauge(
    "ascend_agent_device_health", "1 while the chip is Healthy, 0 while Unhealthy.", ["resource", "device"]
)
REGISTRATIONS = Counter(
    "ascend_agent_registrations", "Successful registrations with the kubelet.", ["resource"]
)
KUBELET_RESTARTS = Counter("ascend_agent_kubelet_restarts", "Times kubelet.sock was created while we ran.")
WATCH_RESCANS = Counter(
    "ascend_agent_watch_rescans",
    "Times every watched directory was looked at again because inotify events were lost.",
    ["reason"],
)
ALLOCATIONS = Counter(
    "ascend_agent_allocations", "Allocate container requests answered.", ["resource", "code"]
)
ALLOCATE_SECONDS = Histogram(
    "ascend_agent_allocate_seconds",
    "Time to answer an Allocate call, in the handler.",
    buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1),
)
STREAMS = Gauge("ascend_agent_list_and_watch_streams", "Open ListAndWatch streams.", ["resource"])
KUBELET_STREAM = Gauge(
    "ascend_agent_kubelet_stream_open",
    "1 while the kubelet's own ListAndWatch stream (after its dial-back) is open.",
    ["resource"],
)
NPU_SMI_SECONDS = Histogram(
    "ascend_agent_npu_smi_seconds",
    "Duration of npu-smi queries.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
NPU_SMI_FAILURES = Counter("ascend_agent_npu_smi_failures", "Failed npu-smi queries.", ["reason"])
NPU_SMI_DOWN = Gauge(
    "ascend_agent_npu_smi_down",
    "1 while npu-smi is down (healthFailureThreshold failed health queries in a row, or not answered once "
    "since the start), else 0.",
)
CHIP_FAULT = Gauge(
    "ascend_agent_chip_fault",
    "1 while the chip reports this error code, with the fault class it is graded; gone when it clears.",
    ["device", "code", "fault_class"],
)
CHIP_INFO = Gauge(
    "ascend_agent_chip_info",
    "A chip's model, bus id, driver and firmware version and serial number, empty where unknown; always 1.",
    ["device", "model", "bus_id", "driver_version", "firmware_version", "serial"],
)
CHIP_TRAINING = Gauge(
    "ascend_agent_chip_training_info",
    "A chip's device IP, vNIC IP (A3) and super-pod identity (A3), empty where it has none; always 1.",
    ["device", "device_ip", "vnic_ip", "super_pod_id", "server_index", "sdid"],
)
# The RoCE network of each chip that has a device IP (backends/network.py), read every health interval.
CHIP_LINK_UP = Gauge(
    "ascend_agent_chip_link_up",
    "1 while hccn_tool -link -g says UP, 0 while DOWN; absent when unread.",
    ["device"],
)
CHIP_NET_HEALTH = Gauge(
    "ascend_agent_chip_net_health_info",
    "The status hccn_tool -net_health -g printed last (Success, Init, Fault, ...); always 1.",
    ["device", "status"],
)
CHIP_NETWORK_UNHEALTHY = Gauge(
    "ascend_agent_chip_network_unhealthy",
    "1 while the chip's link has been DOWN for linkDownDebounce s or more, else 0.",
    ["device"],
)
RESETS = Counter(
    "ascend_agent_resets",
    "Hot-reset steps by result (waiting, started, succeeded, failed, ...; docs/metrics.md).",
    ["result"],
)
CHIP_HELD = Gauge(
    "ascend_agent_chip_held", "1 while the chip is held Unhealthy for flapping, else 0.", ["device"]
)
# Telemetry the `npu-smi info` table carries, per chip, each health interval; absent where it prints NA or -.
CHIP_TEMPERATURE = Gauge("ascend_agent_chip_temperature_celsius", "Chip temperature.", ["device"])
CHIP_POWER = Gauge("ascend_agent_chip_power_watts", "Chip power draw.", ["device"])
CHIP_UTILIZATION = Gauge(
    "ascend_agent_chip_utilization_ratio", "AICore (NPU Util on Ascend 950) utilisation, 0 to 1.", ["device"]
)
CHIP_HBM_USED = Gauge("ascend_agent_chip_hbm_used_bytes", "HBM in use.", ["device"])
CHIP_HBM_TOTAL = Gauge("ascend_agent_chip_hbm_total_bytes", "HBM size.", ["device"])
CHIP_MEMORY_USED = Gauge("ascend_agent_chip_memory_used_bytes", "Chip DDR memory in use.", ["device"])
CHIP_MEMORY_TOTAL = Gauge("ascend_agent_chip_memory_total_bytes", "Chip DDR memory size.", ["device"])
# One series per vNPU, with the chip it is part of and its template; absent where npu-smi does not say.
VNPU_AICORES = Gauge(
    "ascend_agent_vnpu_aicores",
    "AI cores of the vNPU, as its template gives them.",
    ["device", "chip", "template"],
)
VNPU_MEMORY = Gauge(
    "ascend_agent_vnpu_memory_bytes",
    "Memory of the vNPU, as its template gives it.",
    ["device", "chip", "template"],
)


LOG_LINES_SUPPRESSED = Counter(
    "ascend_agent_log_lines_suppressed", "Repeated log lines held back by a rate limit.", ["event"]
)
BUILD_INFO = Gauge("ascend_agent_build_info", "The running ascend-agent; the value is always 1.", ["version"])
BUILD_INFO.labels(version=__version__).set(1)


# Repeated log lines --------------------------------------------------------------------------------------
class ProblemLog:
    """Whether a problem is new: one that persists is logged once, and again only when it changes or after
    :meth:`clear`. For problems a loop meets on every pass::

        serving = ProblemLog()
        if serving.changed(reason):
            log.error("Cannot serve: %s", reason)
        ...
        if serving.clear():                      # it works again
            log.info("Serving again")
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: Hashable | None = None

    def changed(self, problem: Hashable) -> bool:
        """True when ``problem`` differs from the last one (which it replaces)."""
        if problem == self._last:
            return False
        self._last = problem
        return True

    def clear(self) -> bool:
        """The problem is over; True when there was one."""
        had, self._last = self._last is not None, None
        return had


@dataclass(slots=True)
class _Window:
    started: float
    held: int = 0


class RepeatLimiter:
    """Lets the first line for a key through, then at most one per ``interval`` seconds, which says how many
    were held back since the last; each one held back counts in ``ascend_agent_log_lines_suppressed_total``
    under ``event``. For lines a peer can repeat at will, such as a refused Allocate::

        refusals = RepeatLimiter("allocate_refused", interval=10.0)
        refusals.log(log, logging.WARNING, (resource, reason), "Allocate refused for %s: %s", resource,
                     reason, extra=log_fields(resource=resource, reason=reason))

    At most ``max_keys`` keys are remembered; past that the ones whose interval is over are forgotten first.
    """

    def __init__(
        self,
        event: str,
        interval: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 1024,
    ) -> None:
        self._interval = interval
        self._clock = clock
        self._max_keys = max_keys
        self._windows: dict[Hashable, _Window] = {}
        self._suppressed = LOG_LINES_SUPPRESSED.labels(event=event)

    def admit(self, key: Hashable) -> int | None:
        """None when the line for ``key`` is to be held back; else how many were held back before it."""
        now = self._clock()
        window = self._windows.get(key)
        if window is not None and now - window.started < self._interval:
            window.held += 1
            self._suppressed.inc()
            return None
        self._windows.pop(key, None)
        self._windows[key] = _Window(now)
        if len(self._windows) > self._max_keys:
            self._forget(now)
        return 0 if window is None else window.held

    def _forget(self, now: float) -> None:
        for key in [k for k, w in self._windows.items() if now - w.started >= self._interval]:
            del self._windows[key]
        while len(self._windows) > self._max_keys:
            del self._windows[next(iter(self._windows))]  # the longest since it was let through

    def log(
        self,
        logger: logging.Logger,
        level: int,
        key: Hashable,
        msg: str,
        *args: object,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """``logger.log(level, msg, *args)`` unless held back; a line after held-back ones says how many."""
        held = self.admit(key)
        if held is None:
            return
        if held:
            msg, args = f"{msg} (%d repeats suppressed)", (*args, held)
            extra = {**(extra or {}), "suppressed": held}
        logger.log(level, msg, *args, extra=extra)


# A listening socket out of descriptors -------------------------------------------------------------------
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_FAILURES = RepeatLimiter("accept_failed", interval=60.0)


def log_accept_failures_briefly(loop: asyncio.AbstractEventLoop) -> None:
    """While the process is out of descriptors, asyncio logs a traceback for each connection it cannot
    accept on any socket the agent serves, several times a second: make that one line a minute per socket,
    with the next step. Every other error the loop reports keeps asyncio's own handler."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc, listening = context.get("exception"), context.get("socket")
        if not (isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES and listening is not None):
            loop.default_exception_handler(context)
            return
        try:
            address = listening.getsockname()
        except OSError:
            address = "a listening socket"
        where = ":".join(map(str, address)) if isinstance(address, tuple) else str(address)
        _ACCEPT_FAILURES.log(
            log,
            logging.ERROR,
            where,
            "Cannot accept connections on %s: %s; trying again each second (see what holds the "
            "descriptors in /proc/%d/fd, or raise the open-files limit)",
            where,
            exc.strerror or exc,
            os.getpid(),
            extra=log_fields(path=where, reason=exc.strerror or str(exc)),
        )

    loop.set_exception_handler(handle)


# Who holds each device, as labels of every per-device series ---------------------------------------------
HolderOf = Callable[[str], tuple[str, ...]]
HOLDER_LABELS = ("namespace", "pod", "container")
CLAIM_LABEL = "claim"
_holder_of: HolderOf | None = None
_holder_labels: tuple[str, ...] = HOLDER_LABELS


def label_devices_with_holders(holder_of: HolderOf | None, claims: bool = False) -> None:
    """From now on every series with a ``device`` label is exposed with ``namespace``, ``pod`` and
    ``container`` too (and with ``claims``, a DRA driver's, ``claim``): ``holder_of(device)`` (empty strings
    while the device is free), as dcgm-exporter labels GPU metrics."""
    global _holder_of, _holder_labels
    _holder_of = holder_of
    _holder_labels = (*HOLDER_LABELS, CLAIM_LABEL) if claims else HOLDER_LABELS


_node = ""


def label_series_with_node(node: str) -> None:
    """From now on every series /metrics shows carries ``node="<node>"`` (every one is the node's), so that
    a series names its node whatever the scrape adds; an empty name leaves the label out."""
    global _node
    _node = node


class _Exposed:
    """The default registry as /metrics shows it: every series with the node's name, per-device series with
    their holder's labels."""

    def collect(self) -> Iterator[Metric]:
        families = list(self._labelled())
        yield from families
        if npu_exporter.npu_exporter_names_on():
            yield from npu_exporter.npu_exporter_families(families)

    def _labelled(self) -> Iterator[Metric]:
        holder_of, labels, node = _holder_of, _holder_labels, _node
        for family in REGISTRY.collect():
            if not node and (holder_of is None or not any("device" in s.labels for s in family.samples)):
                yield family
                continue
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                extra = {"node": node} if node else {}
                if holder_of is not None and "device" in sample.labels:
                    extra.update(zip(labels, holder_of(sample.labels["device"]), strict=True))
                labelled.samples.append(sample._replace(labels={**sample.labels, **extra}))
            yield labelled


_EXPOSED = _Exposed()


# Probes and /metrics over HTTP ----------------------------------------------------------------------------
Readiness = Callable[[], tuple[bool, str]]
HealthDetail = Callable[[], str]

# Bounds on what a client can make the endpoint hold (it may listen on every address of the node).
_HEAD_TIMEOUT = 5.0  # seconds for the whole request head
_ANSWER_TIMEOUT = 10.0  # seconds for the answer to be taken
_MAX_HEAD = 8192  # bytes of request line and headers
_MAX_CONNECTIONS = 64  # a connection beyond these ends the oldest


# Read-only JSON documents served beside the probes (``/chips``): path -> what makes the document.
_json_routes: dict[str, Callable[[], Any]] = {}


def serve_json(path: str, document: Callable[[], Any] | None) -> None:
    """From now on ``GET path`` answers ``document()`` as JSON (None: no more)."""
    if document is None:
        _json_routes.pop(path, None)
    else:
        _json_routes[path] = document


def _json_route(path: str) -> tuple[int, str, bytes] | None:
    document = _json_routes.get(path)
    if document is None:
        return None
    return 200, "application/json", (json.dumps(document(), indent=1) + "\n").encode()


async def serve_http(address: str, ready: Readiness, detail: HealthDetail | None = None) -> asyncio.Server:
    """Serve ``/metrics`` (Prometheus text format), ``/healthz`` and ``/readyz`` on ``HOST:PORT``.

    ``/healthz`` answers 200 while the event loop runs, with ``detail()`` (the Kubernetes API state) after
    ``ok`` when there is any; ``/readyz`` answers 200 when ``ready()`` says so and
    503 with its reason otherwise. HTTP/1.0, one request per connection: what probes and scrapers need.
    A request head must come within 5 s and 8 KiB (431 beyond); at most 64 connections are open, a new one
    ends the oldest, so that idle connections can neither shut out a probe nor use up the descriptors.
    """
    host, _, port = address.rpartition(":")
    connections = _Connections(_MAX_CONNECTIONS)

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.add(writer)
        try:
            await _answer(reader, writer, ready, detail)
        finally:
            connections.discard(writer)

    return await asyncio.start_server(connected, host.strip("[]"), int(port), limit=_MAX_HEAD)


class _Connections:
    """The endpoint's open connections, oldest first; adding one beyond ``most`` ends the oldest."""

    def __init__(self, most: int) -> None:
        self._most = most
        self._open: dict[asyncio.StreamWriter, None] = {}

    def add(self, writer: asyncio.StreamWriter) -> None:
        self._open[writer] = None
        while len(self._open) > self._most:
            oldest = next(iter(self._open))
            del self._open[oldest]
            oldest.transport.abort()

    def discard(self, writer: asyncio.StreamWriter) -> None:
        self._open.pop(writer, None)


async def _answer(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    ready: Readiness,
    detail: HealthDetail | None = None,
) -> None:
    try:
        async with asyncio.timeout(_HEAD_TIMEOUT):
            request = await reader.readuntil(b"\r\n\r\n")
        method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split()
        status, content_type, body = _route(method, path.split("?", 1)[0], ready, detail)
    except asyncio.LimitOverrunError:
        status, content_type, body = 431, "text/plain", f"request head over {_MAX_HEAD} bytes\n".encode()
    except (TimeoutError, asyncio.IncompleteReadError, ValueError, UnicodeError):
        status, content_type, body = 400, "text/plain", b"bad request\n"
    except OSError:  # the client reset the connection
        writer.transport.abort()
        return
    if writer.transport.is_closing():  # ended for a newer connection
        return
    head = (
        f"HTTP/1.0 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    try:
        async with asyncio.timeout(_ANSWER_TIMEOUT):
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
    except (OSError, TimeoutError):
        writer.transport.abort()
    finally:
        writer.close()


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def _route(
    method: str, path: str, ready: Readiness, detail: HealthDetail | None = None
) -> tuple[int, str, bytes]:
    if method not in ("GET", "HEAD"):
        return 405, "text/plain", b"only GET\n"
    if path == "/metrics":
        return 200, CONTENT_TYPE_LATEST, generate_latest(_EXPOSED)
    if path == "/healthz":
        extra = detail() if detail is not None else ""
        return 200, "text/plain", f"ok\n{extra}\n".encode() if extra else b"ok\n"
    if path == "/readyz":
        is_ready, reason = ready()
        if is_ready:
            return 200, "text/plain", f"ready: {reason}\n".encode() if reason else b"ready\n"
        return 503, "text/plain", f"not ready: {reason}\n".encode()
    return _json_route(path) or (404, "text/plain", b"not found: try /metrics, /healthz, /readyz or /chips\n")
