"""Kubernetes Events on the agent's Node for each health transition of a chip, repeats counted on the same
Event (``count``, ``lastTimestamp``), as the kubelet's event recorder does.

    events = NodeEvents()
    events.observe(inventory)     # a chip turned Unhealthy: Warning NPUUnhealthy, written at once
    events.observe(inventory)     # Healthy again: Normal NPUHealthy; Unhealthy again: count 2 on the first

Reasons: ``NPU<class>`` (Warning: ``NPURestartNPU``, ``NPUSeparateNPU``... a chip's fault class, Huawei's
name, when it turns Unhealthy for it or its class changes, a chip that stays Healthy too), ``NPUUnhealthy``
(Warning: Unhealthy for no fault class), ``NPUHeld`` (Warning: the flap hold keeps the chip Unhealthy),
``NPUHealthy`` (Normal), ``NPUNetworkUnhealthy`` (Warning: the chip's RoCE link is down past the debounce),
``NPUNetworkHealthy`` (Normal: it is up again), ``NPUAddressChanged`` (Warning: a chip's device IP or vNIC IP
is not the one it had: the pods placed before keep the old one in their configuration); others raise their
own through ``note`` (the DRA driver's ``DRACheckpointUnusable``, by way of ``ClusterSide.event``), and on
a pod through ``note_pod`` (``--volcano``'s ``NPUChoiceSkipped``: one Event per pod, in its namespace). One
Event object per chip (or subject) and reason while its message stays the same; chips that turn the same way
for the same cause in one reconcile share one (``Ascend910-0, Ascend910-1 are Unhealthy: ...``), so a node
whose eight chips fail together writes one Event, not eight. An Event is written at once the first time, and
its repeats, or a new message for the same chips and reason, at most once per ``min_interval`` (30 s), so a
chip that flaps 100 times a minute costs a handful of writes, not hundreds.
RBAC: events create, patch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

import anyio
from lightkube import ApiError
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from ascend_agent.backoff import wait_before_retry
from ascend_agent.cluster.client import ApiUnavailable, KubeApi
from ascend_agent.cluster.writer import api_backoff
from ascend_agent.faultclass import FaultClass
from ascend_agent.model import Chip, Inventory
from ascend_agent.naming import object_name

log = logging.getLogger("ascend_agent.cluster")

COMPONENT = "ascend-agent"
# Where the kubelet records a Node's Events; `kubectl describe node` finds them there.
NAMESPACE = "default"
UNHEALTHY, HELD, HEALTHY = "NPUUnhealthy", "NPUHeld", "NPUHealthy"
NETWORK_UNHEALTHY, NETWORK_HEALTHY = "NPUNetworkUnhealthy", "NPUNetworkHealthy"
ADDRESS_CHANGED = "NPUAddressChanged"
MIN_INTERVAL = 30.0
# Events on pods waiting to be written (the API server down) beyond this many: the oldest are dropped.
MAX_POD_EVENTS = 256


class _Turn(NamedTuple):
    """A chip's turn as an Event says it: ``what`` follows the chip's ID (``is Unhealthy: ...``)."""

    kind: str
    reason: str
    device: str
    what: str


def _plural(what: str) -> str:
    """``what`` said of several chips: ``is Unhealthy`` -> ``are Unhealthy``."""
    for one, many in (("is ", "are "), ("stays ", "stay "), ("network is ", "networks are ")):
        if what.startswith(one):
            return many + what.removeprefix(one)
    return what


class PodEvent(NamedTuple):
    """An Event on a pod (:meth:`NodeEvents.note_pod`): of ``kind`` (Normal, Warning), in the pod's
    namespace."""

    kind: str
    reason: str
    namespace: str
    name: str
    uid: str
    message: str


@dataclass(slots=True)
class _Record:
    """One Event object: what it says, how often, and what of it is written."""

    type: str
    reason: str
    subject: str  # a chip's device ID, a file, or "pod <namespace>/<name>"
    message: str
    count: int
    first: datetime
    last: datetime
    name: str | None = None  # set once created
    pod: tuple[str, str, str] | None = None  # (namespace, name, uid) of the pod it is about; else the Node
    written_count: int = 0
    next_write: float = 0.0  # monotonic time before which repeats (and a new message of the same reason) wait


class NodeEvents:
    """The cluster feature that raises Events for health transitions."""

    def __init__(self, min_interval: float = MIN_INTERVAL) -> None:
        self._min_interval = min_interval
        self._seen: dict[str, tuple[bool, bool, FaultClass | None]] = {}  # device -> (healthy, held, class)
        self._network_down: dict[str, bool] = {}  # device -> network-unhealthy
        self._addresses: dict[str, tuple[str | None, str | None]] = {}  # device -> (device IP, vNIC IP)
        self._records: dict[tuple[str, str], _Record] = {}
        self._wake = anyio.Event()

    # what happened --------------------------------------------------------------------------------------
    def observe(self, inventory: Inventory) -> None:
        turns: list[_Turn] = []
        self._observe_network(inventory, turns)
        self._observe_addresses(inventory)
        for chip in inventory.chips:
            if chip.health_unknown and not chip.held:
                continue  # npu-smi is down: no transition of the chip's own (the agent logs the outage once)
            now = (chip.healthy, chip.held, chip.fault_class)
            before = self._seen.get(chip.device_id)
            self._seen[chip.device_id] = now
            if before == now or (before is None and chip.healthy and chip.fault_class is None):
                continue
            if chip.healthy:
                if before is not None and not before[0]:
                    turns.append(_Turn("Normal", HEALTHY, chip.device_id, "is Healthy again"))
                if chip.fault_class is not None and (before is None or before[2] != chip.fault_class):
                    turns.append(
                        _Turn(
                            "Warning",
                            fault_reason(chip.fault_class),
                            chip.device_id,
                            f"stays Healthy with fault class {chip.fault_class.huawei}: {_cause(chip)}",
                        )
                    )
            elif chip.held and (before is None or not before[1]):
                turns.append(_Turn("Warning", HELD, chip.device_id, f"is held Unhealthy: {_cause(chip)}"))
            elif before is None or before[0] or before[2] != chip.fault_class:
                reason = fault_reason(chip.fault_class) if chip.fault_class is not None else UNHEALTHY
                turns.append(_Turn("Warning", reason, chip.device_id, f"is Unhealthy: {_cause(chip)}"))
        self._note_turns(turns)

    def _note_turns(self, turns: list[_Turn]) -> None:
        """One Event for the chips that turned the same way for the same cause in one reconcile (a node's
        chips failing together, a rack's power flapping): its subject and message name them all."""
        together: dict[tuple[str, str, str], list[str]] = {}
        for turn in turns:
            together.setdefault((turn.kind, turn.reason, turn.what), []).append(turn.device)
        for (kind, reason, what), devices in together.items():
            if len(devices) == 1:
                self.note(kind, reason, devices[0], f"{devices[0]} {what}")
            else:
                self.note(kind, reason, ",".join(devices), f"{', '.join(devices)} {_plural(what)}")

    def _observe_network(self, inventory: Inventory, turns: list[_Turn]) -> None:
        for chip in inventory.chips:
            down = bool(chip.network_fault)
            before = self._network_down.get(chip.device_id)
            self._network_down[chip.device_id] = down
            if before == down or (before is None and not down):
                continue
            if down:
                what = f"network is unhealthy: {chip.network_fault}"
                turns.append(_Turn("Warning", NETWORK_UNHEALTHY, chip.device_id, what))
            else:
                turns.append(_Turn("Normal", NETWORK_HEALTHY, chip.device_id, "network is healthy again"))

    def _observe_addresses(self, inventory: Inventory) -> None:
        """A chip whose address, once known, is another now: the pods placed on it before were told the old
        one (their ``ascend-910-configuration`` is never rewritten), so their jobs' rank tables name it."""
        for chip in inventory.chips:
            if chip.vnpu is not None:
                continue
            now = (chip.device_ip, chip.vnic_ip)
            before = self._addresses.get(chip.device_id)
            self._addresses[chip.device_id] = now
            if before is None or before == now:
                continue
            for what, old, new in (("device IP", before[0], now[0]), ("vNIC IP", before[1], now[1])):
                if old is not None and old != new:
                    self.note(
                        "Warning",
                        ADDRESS_CHANGED,
                        chip.device_id,
                        f"{chip.device_id} {what} changed from {old} to {new or 'none'}: pods placed on it "
                        "before keep the old address in their configuration and rank tables",
                    )

    def note(self, kind: str, reason: str, subject: str, message: str) -> None:
        """An Event of ``kind`` (Normal, Warning) about ``subject`` (a chip, a file), written by the own task;
        the same subject and reason again is a repeat of the same Event."""
        now = datetime.now(UTC).replace(microsecond=0)
        key = (subject, reason)
        record = self._records.get(key)
        if record is None or record.message != message:
            # A new message is a new Event, but no sooner than a repeat of the old one would be written: a
            # chip flapping between two fault codes must not make an Event per turn. So is an Event about
            # chips another Event of the reason named (the chips that turn together change): the newest
            # takes their turn, and those already written are forgotten.
            next_write = 0.0 if record is None else record.next_write
            chips = set(subject.split(","))
            for other_key, other in list(self._records.items()):
                if other.reason != reason or other.pod is not None or other_key == key:
                    continue
                if chips.isdisjoint(other.subject.split(",")):
                    continue
                next_write = max(next_write, other.next_write)
                if other.count == other.written_count:
                    del self._records[other_key]
            self._records[key] = _Record(kind, reason, subject, message, 1, now, now, next_write=next_write)
        else:
            record.count += 1
            record.last = now
        self._wake.set()

    def note_pod(self, event: PodEvent) -> None:
        """``event`` on its pod, written once by the own task and then forgotten."""
        now = datetime.now(UTC).replace(microsecond=0)
        key = (f"pod {event.namespace}/{event.name}", event.reason)
        self._records.pop(key, None)
        self._records[key] = _Record(
            event.kind,
            event.reason,
            key[0],
            event.message,
            1,
            now,
            now,
            pod=(event.namespace, event.name, event.uid),
        )
        waiting = [key for key, record in self._records.items() if record.pod is not None]
        for dropped in waiting[: max(0, len(waiting) - MAX_POD_EVENTS)]:
            del self._records[dropped]
        self._wake.set()

    # writing it -----------------------------------------------------------------------------------------
    async def run(self, api: KubeApi) -> None:
        backoff = api_backoff()
        while True:
            self._wake = anyio.Event()
            try:
                delay = await self._write_due(api)
            except ApiUnavailable as exc:
                await wait_before_retry(backoff, exc)
                continue
            backoff.reset()
            with anyio.move_on_after(delay):
                await self._wake.wait()

    async def _write_due(self, api: KubeApi) -> float:
        """Write every record whose change may be written now; the seconds until the next one may be."""
        wait = float("inf")
        for record in list(self._records.values()):
            if record.count == record.written_count:
                continue
            due = record.next_write - time.monotonic()
            if due > 0:
                wait = min(wait, due)
                continue
            try:
                await self._write(api, record)
            except ApiError as exc:  # the API server answered but will not take this Event: drop it
                log.warning(
                    "Event %s for %s not written: %s", record.reason, record.subject, exc.status.message
                )
                record.written_count = record.count
            record.next_write = time.monotonic() + self._min_interval
            key = (record.subject, record.reason)
            # Said once: forgotten, unless note_pod put a new record under its key during the write.
            if record.pod is not None and self._records.get(key) is record:
                del self._records[key]
        return wait

    async def _write(self, api: KubeApi, record: _Record) -> None:
        count = record.count
        namespace = record.pod[0] if record.pod is not None else NAMESPACE
        if record.name is not None:
            patch = {"count": count, "lastTimestamp": _time(record.last), "message": record.message}
            try:
                await api.call(
                    "patch",
                    "events",
                    api.client.patch(
                        Event, record.name, patch, namespace=namespace, patch_type=PatchType.MERGE
                    ),
                )
                record.written_count = count
                return
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
                # expired (the API server keeps Events for an hour) or deleted: a new one takes its count
        about = record.pod[1] if record.pod is not None else api.node
        name = object_name(f"{about}.{time.time_ns():x}")
        # The namespace is the Event's own (metadata.namespace).
        await api.call("create", "events", api.client.create(self._event(api.node, name, namespace, record)))
        record.name, record.written_count = name, count

    @staticmethod
    def _event(node: str, name: str, namespace: str, record: _Record) -> Event:
        if record.pod is not None:
            pod_namespace, pod_name, uid = record.pod
            involved = ObjectReference(
                kind="Pod", namespace=pod_namespace, name=pod_name, uid=uid, apiVersion="v1"
            )
        else:
            # The kubelet gives its Node the node name as UID; `kubectl describe node` looks for that.
            involved = ObjectReference(kind="Node", name=node, uid=node, apiVersion="v1")
        return Event(
            metadata=ObjectMeta(name=name, namespace=namespace),
            involvedObject=involved,
            type=record.type,
            reason=record.reason,
            message=record.message,
            count=record.count,
            firstTimestamp=record.first,
            lastTimestamp=record.last,
            source=EventSource(component=COMPONENT, host=node),
            reportingComponent=COMPONENT,
            reportingInstance=node,
        )


def fault_reason(fault_class: FaultClass) -> str:
    """The Event reason of a chip's fault class: ``NPU`` and Huawei's name (``NPURestartNPU``)."""
    return f"NPU{fault_class.huawei}"


def _cause(chip: Chip) -> str:
    """The chip's reason, with its fault codes when the reason does not name them."""
    reason = chip.reason or ("fault" if chip.faults else "no reason reported")
    codes = [fault.code for fault in chip.faults if fault.code not in reason]
    return f"{reason} (fault codes {', '.join(codes)})" if codes else reason


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
