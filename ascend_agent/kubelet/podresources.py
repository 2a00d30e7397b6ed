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
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError

from ascend_agent._proto.v1 import ListPodResourcesResponse
from ascend_agent.kubelet.deviceplugin.transport import LocalChannel
from ascend_agent.kubelet.deviceplugin.wire import BytesCodec
from ascend_agent.model import Holder, Holders

log = logging.getLogger(__name__)

LIST_TIMEOUT = 2.0
_LIST = "/v1.PodResourcesLister/List"
# The kubelet records an allocation as the pod is admitted; give it that long after Allocate answered.
AFTER_ALLOCATE = 0.5


class PodResourcesError(Exception):
    """The socket is missing or refused the call; the message says which in one line."""


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
                answer = await call.recv_message()
    except TimeoutError:
        raise PodResourcesError(f"{socket} did not answer List within {timeout:g} s") from None
    except GRPCError as exc:
        raise PodResourcesError(f"{socket} refused List: {exc.message or exc.status.name}") from None
    except (OSError, StreamTerminatedError) as exc:
        raise PodResourcesError(f"cannot call List on {socket}: {exc}") from None
    finally:
        channel.close()
    return await anyio.to_thread.run_sync(_holders, answer or b"")


def _holders(answer: bytes) -> Holders:
    """The holders a ``ListPodResourcesResponse`` names."""
    response = ListPodResourcesResponse.parse(answer)
    found: dict[tuple[str, str], set[Holder]] = {}
    claimed: dict[tuple[str, str], set[Holder]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            holder = Holder(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                for device_id in devices.device_ids:
                    found.setdefault((devices.resource_name, device_id), set()).add(holder)
            for claim in container.dynamic_resources:
                by_claim = Holder(pod.namespace, pod.name, container.name, claim.claim_name)
                for resource in claim.claim_resources:
                    if resource.device_name:
                        claimed.setdefault((resource.driver_name, resource.device_name), set()).add(by_claim)
    return Holders(
        {key: tuple(sorted(holders)) for key, holders in found.items()},
        {key: tuple(sorted(holders)) for key, holders in claimed.items()},
    )


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
