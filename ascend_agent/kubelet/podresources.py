"""Which pod holds which chip, from the kubelet's PodResources API (``v1.PodResourcesLister/List`` on
``/var/lib/kubelet/pod-resources/kubelet.sock``), as dcgm-exporter does for GPUs.

    holders = await list_holders(Path("/var/lib/kubelet/pod-resources/kubelet.sock"))
    holders.of(chip, replicas=1)      # (Holder(namespace='team-a', pod='train-0', container='main'),)
    holders.of_claimed("npu.huawei.com", chip)   # DRA: the same, with the claim that gave it

:class:`PodHolders` keeps the last answer for the agent, refreshed at each health interval and shortly after
each Allocate; a missing or refusing socket costs one warning (again only after it worked) and empty holders,
never the health loop.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import anyio.to_thread
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError

from ascend_agent.kubelet.deviceplugin.transport import LocalChannel, UnreadAnswer, read_answer
from ascend_agent.kubelet.deviceplugin.wire import BytesCodec, WireError, fields
from ascend_agent.memory import LARGE, give_back
from ascend_agent.model import Holder, Holders

log = logging.getLogger(__name__)

LIST_TIMEOUT = 2.0
_LIST = "/v1.PodResourcesLister/List"
# The kubelet records an allocation as the pod is admitted; give it that long after Allocate answered.
AFTER_ALLOCATE = 0.5
# The most of a List answer read, gRPC's default receive limit: a node of a few hundred pods answers well
# under 1 MiB. A longer answer is refused before it is read.
MAX_ANSWER = 4 * 1024 * 1024
# The most devices (device IDs and claimed devices together) an answer may name: a node has at most 16 chips,
# a few vNPUs or replicas each.
MAX_DEVICES = 4096


class PodResourcesError(Exception):
    """The socket is missing, refused the call or answered what is not read; the message says which in one
    line."""


async def list_holders(socket: Path, timeout: float = LIST_TIMEOUT) -> Holders:
    """One ``List`` call; :class:`PodResourcesError` when it cannot be made. The answer (megabytes on a
    node with many pods) is decoded in a worker thread: Allocates go on meanwhile."""
    if not socket.exists():
        raise PodResourcesError(f"{socket} does not exist (is the pod-resources directory mounted?)")
    channel = LocalChannel(socket, codec=BytesCodec())
    try:
        with anyio.fail_after(timeout):
            async with channel.request(_LIST, Cardinality.UNARY_UNARY, bytes, bytes, timeout=timeout) as call:
                await call.send_message(b"", end=True)  # an empty ListPodResourcesRequest
                answer = await read_answer(call, MAX_ANSWER)
    except UnreadAnswer as exc:
        raise PodResourcesError(
            f"{socket} answered List with {exc} (a node of a few hundred pods answers well under 1 MiB)"
        ) from None
    except TimeoutError:
        raise PodResourcesError(f"{socket} did not answer List within {timeout:g} s") from None
    except GRPCError as exc:
        raise PodResourcesError(f"{socket} refused List: {exc.message or exc.status.name}") from None
    except (OSError, StreamTerminatedError) as exc:
        raise PodResourcesError(f"cannot call List on {socket}: {exc}") from None
    finally:
        channel.close()
    size = len(answer)
    read = await anyio.to_thread.run_sync(_read, answer)
    del answer
    if size >= LARGE:
        await anyio.to_thread.run_sync(give_back)
    if isinstance(read, str):
        raise PodResourcesError(f"{socket} answered List with {read}")
    return read


def _read(answer: bytes) -> Holders | str:
    """:func:`holders_of`, or why not in words. No exception leaves the worker thread: one would hold the
    answer (its traceback, in a reference cycle through the awaiting task) past the memory given back."""
    try:
        return holders_of(answer)
    except PodResourcesError as exc:
        return str(exc)
    except (WireError, UnicodeDecodeError) as exc:
        return f"what does not decode: {exc}"


# ListPodResourcesResponse.pod_resources; PodResources name, namespace, containers; ContainerResources name,
# devices, dynamic_resources; ContainerDevices resource_name, device_ids; DynamicResource claim_name,
# claim_resources; ClaimResource driver_name, device_name.
_PODS = frozenset({1})
_POD = frozenset({1, 2, 3})
_CONTAINER = frozenset({1, 2, 5})
_DEVICES = frozenset({1, 2})
_CLAIM = frozenset({2, 4})
_CLAIMED = frozenset({2, 4})
_LENGTH_DELIMITED = 2


def holders_of(answer: bytes) -> Holders:
    """The holders a ``ListPodResourcesResponse`` names, read field by field; :class:`PodResourcesError`
    past :data:`MAX_DEVICES` devices, :class:`~ascend_agent.kubelet.deviceplugin.wire.WireError` or
    UnicodeDecodeError when it does not decode.

    >>> pod = b"\\x0a\\x01p\\x12\\x02ns\\x1a\\x0f\\x0a\\x01c\\x12\\x0a\\x0a\\x01r\\x12\\x05npu-1"
    >>> holders_of(b"\\x0a" + bytes([len(pod)]) + pod).by_device
    {('r', 'npu-1'): (Holder(namespace='ns', pod='p', container='c', claim=''),)}
    """
    found: dict[tuple[str, str], set[Holder]] = {}
    claimed: dict[tuple[str, str], set[Holder]] = {}
    for _, pod in _parts(memoryview(answer), _PODS):
        name = namespace = ""
        containers = []
        for number, value in _parts(pod, _POD):
            if number == 1:
                name = _text(value)
            elif number == 2:
                namespace = _text(value)
            else:
                containers.append(value)
        for container in containers:
            _container(container, namespace, name, found, claimed)
            if len(found) + len(claimed) > MAX_DEVICES:
                raise _too_many()
    return Holders(
        {key: tuple(sorted(holders)) for key, holders in found.items()},
        {key: tuple(sorted(holders)) for key, holders in claimed.items()},
    )


def _container(
    data: memoryview,
    namespace: str,
    pod: str,
    found: dict[tuple[str, str], set[Holder]],
    claimed: dict[tuple[str, str], set[Holder]],
) -> None:
    name = ""
    devices: list[tuple[str, list[str]]] = []
    claims: list[tuple[str, list[tuple[str, str]]]] = []
    named = 0  # devices the container names so far: past MAX_DEVICES the rest is not read
    for number, value in _parts(data, _CONTAINER):
        if number == 1:
            name = _text(value)
        elif number == 2:
            resource, ids = "", []
            for field, part in _parts(value, _DEVICES):
                if field == 1:
                    resource = _text(part)
                else:
                    ids.append(_text(part))
                    named += 1
                    if named > MAX_DEVICES:
                        raise _too_many()
            devices.append((resource, ids))
        else:
            claim, resources = "", []
            for field, part in _parts(value, _CLAIM):
                if field == 2:
                    claim = _text(part)
                else:
                    driver = device = ""
                    for inner, text in _parts(part, _CLAIMED):
                        if inner == 2:
                            driver = _text(text)
                        else:
                            device = _text(text)
                    if device:
                        resources.append((driver, device))
                        named += 1
                        if named > MAX_DEVICES:
                            raise _too_many()
            claims.append((claim, resources))
    holder = Holder(namespace, pod, name)
    for resource, ids in devices:
        for device_id in ids:
            found.setdefault((resource, device_id), set()).add(holder)
    for claim, resources in claims:
        by_claim = Holder(namespace, pod, name, claim)
        for key in resources:
            claimed.setdefault(key, set()).add(by_claim)


def _too_many() -> PodResourcesError:
    return PodResourcesError(f"more than {MAX_DEVICES} devices, more than a node has: not read")


def _parts(data: memoryview, wanted: frozenset[int]) -> Iterator[tuple[int, memoryview]]:
    """The ``wanted`` fields of a message, each a string or a message (a view of ``data``, not a copy)."""
    for number, kind, value in fields(data, wanted):
        if kind != _LENGTH_DELIMITED:
            raise WireError(f"field {number} is not a string or a message")
        yield number, value


def _text(value: memoryview) -> str:
    return str(value, "utf-8")


class PodHolders:
    """The agent's view of the holders: :meth:`run` refreshes it; :meth:`poke` after an Allocate."""

    def __init__(self, socket: Path, interval: float) -> None:
        self.socket = socket
        self.interval = interval
        self.holders = Holders()
        self.error: str | None = None
        # Told when the holders changed (the agent then reconciles, under --volcano).
        self.on_change: Callable[[], None] = lambda: None
        # Told every answer, with when it was asked (time.monotonic()).
        self.on_answer: Callable[[Holders, float], None] = lambda holders, asked_at: None
        self._poked = anyio.Event()
        self._asked_at = -math.inf  # when the answer taken in last was asked

    def poke(self) -> None:
        self._poked.set()

    async def refresh(self) -> bool:
        """Ask the kubelet once; True when the holders changed, and ``on_change`` is told then (whoever asked:
        the health interval, an Allocate, the hot reset). An answer asked before the one taken in last (two
        asked at once, answered out of order) is dropped: it is older than what the holders show."""
        asked_at = time.monotonic()
        problem: str | None = None
        try:
            holders = await list_holders(self.socket)
        except Exception as exc:  # PodResourcesError, or an answer that does not decode
            problem = str(exc) if isinstance(exc, PodResourcesError) else f"{type(exc).__name__}: {exc}"
            holders = Holders()
        if asked_at < self._asked_at:
            return False
        self._asked_at = asked_at
        if problem is not None:
            if self.error is None:
                log.warning("Cannot tell which pod holds which chip: %s", problem)
            self.error = problem
        else:
            if self.error is not None:
                log.info("PodResources answers again on %s", self.socket)
            self.error = None
            self.on_answer(holders, asked_at)
        changed = holders != self.holders
        if changed:  # an equal answer keeps the object: what is made from it stays valid
            self.holders = holders
            self.on_change()
        return changed

    async def run(self) -> None:
        """Refresh each ``interval``, and ``AFTER_ALLOCATE`` after a :meth:`poke`, until cancelled."""
        while True:
            await self.refresh()
            self._poked = anyio.Event()
            with anyio.move_on_after(self.interval):
                await self._poked.wait()
                await anyio.sleep(AFTER_ALLOCATE)
