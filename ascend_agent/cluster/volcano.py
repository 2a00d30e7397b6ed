"""``--volcano``: Volcano chooses the chips. Volcano's ``ascend-for-volcano`` writes its choice on the pod it
places (``huawei.com/Ascend910: Ascend910-3,Ascend910-5`` and a ``predicate-time``); on Allocate the agent
answers with those chips instead of the kubelet's IDs and marks the pod as Huawei's device plugin does.

    pods = VolcanoPods(mounted=MountedChips(on_change=agent.wake))   # told what each pod got (MountedView)
    pods.observe(inventory)                          # the chips, to check Volcano's choice against
    tasks.start_soon(pods.run, api)                  # the node's pods, watched; the pods' patches
    await pods.remap("huawei.com/Ascend910", [["Ascend910-0", "Ascend910-1"]])   # [["Ascend910-3", ...]]

Among the node's pods that a scheduler bound (condition ``PodScheduled``) and that the kubelet has not
admitted yet (no ``status.startTime``) nor begun to terminate, ask for the resource in a container limit,
carry the resource's annotation with as many chips as the kubelet asked for, and whose ``predicate-time`` is
not ``18446744073709551615`` (taken), the one with the smallest ``predicate-time`` gets this Allocate. A pod
whose choice names a chip another pod holds cannot be the one the kubelet admits: it is skipped (one log
line, one Event on that pod) and the choice moves on to the next in the same Allocate; for good, unless the
pod holding the chip is being deleted (then in this Allocate only). Pods come from a list and a watch,
opened again from where it was at least every :data:`WATCH_SECONDS` (listed again only when the API server
no longer has that version); a miss, or a choice naming a held chip, reads the pods once from the API server
(a held chip asks PodResources again too; that read never waits for the client's rate limit), and the choice
is tried 3 times 1 s apart before Allocate is refused (the kubelet then fails the pod:
``UnexpectedAdmissionError``). A request for every chip of the resource keeps the kubelet's IDs, as Huawei's
plugin does.

The pod is then patched (RBAC: pods list, watch, patch) with ``predicate-time: "18446744073709551615"``,
``huawei.com/AscendReal`` (the chips mounted), ``huawei.com/kltDev`` (the kubelet's IDs) and
``ascend.kubectl.kubernetes.io/ascend-910-configuration`` (``ascend-npu-configuration`` for 950). The patch is
written beside Allocate from a worker thread (:meth:`~ascend_agent.cluster.client.KubeApi.call_blocking`),
retried until it lands, never behind the client's rate limit; the pod counts as taken from the moment
Allocate chose it.
"""

from __future__ import annotations

import functools
import heapq
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import httpx2
from lightkube import ALL_NS, ApiError, Client
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType
from prometheus_client import Gauge

from ascend_agent.backoff import wait_before_retry
from ascend_agent.cluster.client import ApiUnavailable, KubeApi, WatchCursor
from ascend_agent.cluster.events import PodEvent
from ascend_agent.cluster.placed import node_address
from ascend_agent.cluster.podlist import MAX_PODS, bound_to, list_node_pods, view_of
from ascend_agent.cluster.ranktable import CONFIGURATION as CONFIGURATION_910
from ascend_agent.cluster.ranktable import CONFIGURATION_NPU
from ascend_agent.cluster.volcano_marks import (
    KUBELET_IDS,
    PREDICATE_TIME,
    REAL,
    TAKEN,
    VOLCANO_SCHEDULER,
    ChipHeld,
    Mounted,
    PodView,
    Skipped,
    choose,
    configuration,
    follow_mounted,
    mounted_from,
)
from ascend_agent.cluster.writer import api_backoff
from ascend_agent.echo import cut
from ascend_agent.model import Chip, Generation, Holders, Inventory

log = logging.getLogger("ascend_agent.cluster")

TRIES = 3
TRY_INTERVAL = 1.0
# How long one watch of the pods lasts before it is opened again from where it was: a watch that silently
# stopped delivering cannot leave the cache older than this (nor than KubeApi.watch_idle, by its bookmarks).
WATCH_SECONDS = 300
# A cache miss reads the pods once; it waits at most this long for them.
MISS_READ_TIMEOUT = 2.0

# The Event on a pod skipped by a choice (Warning).
SKIPPED_REASON = "NPUChoiceSkipped"
# The reasons the refusal of an Allocate names at most.
_SHOWN_SKIPPED = 3

# Who writes an Event on a pod (NodeEvents.note_pod).
PodEvents = Callable[[PodEvent], None]

CHIPS_TAKEN = Gauge(
    "ascend_agent_volcano_chips_taken",
    "Chips pods Volcano placed have, as the agent's pod watch knows (--volcano).",
)


@dataclass(frozen=True, slots=True)
class _Patch:
    """The marks of a pod that got its chips; the configuration annotation is made when it is written (it
    needs the node's address, read once by the writer)."""

    pod: PodView
    annotations: dict[str, str]
    configuration_key: str
    chips: tuple[Chip, ...]

    def body(self, host_ip: str) -> dict[str, Any]:
        configured = {self.configuration_key: configuration(self.pod, self.chips, host_ip)}
        return {"metadata": {"annotations": {**self.annotations, **configured}}}


@dataclass(slots=True)
class _Patches:
    """The pods' patches not written yet, by pod uid; the newest for a pod wins."""

    pending: dict[str, _Patch] = field(default_factory=dict)
    wake: anyio.Event = field(default_factory=anyio.Event)

    def add(self, patch: _Patch) -> None:
        self.pending[patch.pod.uid] = patch
        self.wake.set()


@dataclass(slots=True)
class _Choosing:
    """One Allocate's choice: whether it read the pods again and asked PodResources again (each at most once
    per Allocate); the pods passed over in this Allocate only (the pod holding their chips is going); and why
    pods were skipped."""

    pods_read: bool = False
    kubelets_asked: bool = False
    passed: set[str] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)


class MountedView(Protocol):
    """Who is told what the pods got (the kubelet side's ``MountedChips``), and who knows the kubelet's own
    view of which pod holds which chip (PodResources read through what each Allocate handed over for the
    kubelet's IDs)."""

    kubelet_holders: Callable[[], Holders]
    refresh_kubelet_holders: Callable[[], Awaitable[object]]

    def update(self, mounted: Iterable[Mounted]) -> None:
        """The pods that got Volcano's choice now."""


class VolcanoPods:
    """The cluster feature of ``--volcano``: the node's pods, Volcano's choice on Allocate, the pods'
    marks."""

    def __init__(
        self,
        tries: int = TRIES,
        try_interval: float = TRY_INTERVAL,
        mounted: MountedView | None = None,
        scheduler: str = VOLCANO_SCHEDULER,
        events: PodEvents | None = None,
    ) -> None:
        # Told what the pods got whenever it may have changed: the health the kubelet sees follows it. Its
        # ``kubelet_holders`` is the kubelet's PodResources view, by the chips handed over.
        self._mounted = mounted
        self._scheduler = scheduler
        self._events = events
        self._mounted_told = True  # False while what the pods got changed since MountedChips was told
        self._tries = tries
        self._try_interval = try_interval
        self._chips: dict[str, Chip] = {}
        self._pods: dict[str, PodView] = {}  # the node's pods that have not ended, by uid
        self._names: dict[tuple[str, str], str] = {}  # (namespace, name) -> uid, of the same pods
        self._taken: dict[str, Mounted] = {}  # uid -> what it got (until the pod goes)
        # uid -> the chips it has: what this agent handed out, else the marks of an earlier one; and by chip.
        self._mounts: dict[str, Mounted] = {}
        self._on_chip: dict[tuple[str, str], set[str]] = {}
        # The marks of the pods there at the first read, as they were then: only an earlier agent can have
        # given them chips, and a mark written later (by a user on their own pod) is not believed.
        self._marks: dict[str, Mounted] | None = None
        self._refused: set[str] = set()  # pods whose choice was refused once: never chosen again
        self._said_skipped: set[str] = set()  # pods skipped, in the log and an Event (once per pod)
        self._ignored: set[str] = set()  # pods with a predicate-time that is none (logged once)
        self._unbound: set[str] = set()  # pods naming chips that no scheduler bound (logged once)
        self._unreadable: set[str] = set()  # pods of the last list that could not be decoded (logged once)
        self._over = False  # pods past MAX_PODS were left out since the cache was last under it (said once)
        # (resource, chips) -> a heap of (predicate-time, namespace, name, uid) of the pods that may want
        # them; entries of pods since changed, taken or gone are dropped when they come to the top.
        self._queues: dict[tuple[str, int], list[tuple[int, str, str, str]]] = {}
        self._version = 0  # counts changes of the pods and the taken ones
        self._followed: tuple[Holders, int, Holders] | None = None
        self._api: KubeApi | None = None
        self._first_read = anyio.Event()  # set once the watch's first read of the pods ended, answered or not
        self._listing: anyio.Event | None = None  # set when the read of the pods under way ends
        self._patches = _Patches()

    # what the agent calls -------------------------------------------------------------------------------
    def observe(self, inventory: Inventory) -> None:
        self._chips = {chip.device_id: chip for chip in inventory.chips}
        if not self._mounted_told:
            self._tell_mounted()

    async def remap(self, resource: str, containers: Sequence[Sequence[str]]) -> list[list[str]]:
        """The chips each container gets: Volcano's choice for the kubelet's IDs. Raises LookupError, with
        what to check, when no pod Volcano placed matches."""
        return [await self._one(resource, list(kubelet_ids)) for kubelet_ids in containers]

    def mounted(self) -> list[Mounted]:
        """Every pod on the node that got Volcano's choice: from this agent's Allocates, and from the pods'
        marks (an earlier agent's, too)."""
        return list(self._mounts.values())

    def _tell_mounted(self) -> None:
        """Tell the agent what the pods got. While every chip is Healthy every ID shows Healthy whatever
        the mapping, so the telling waits for the next chip that is not (a pass over every pod per Allocate
        saved); :meth:`observe` tells it then."""
        if self._mounted is None:
            return
        self._mounted_told = any(not chip.healthy for chip in self._chips.values())
        if self._mounted_told:
            self._mounted.update(self.mounted())

    def follow_mounted(self, holders: Holders) -> Holders:
        """``holders`` (the kubelet's PodResources view, by its IDs) by the chips really mounted; computed
        again only when the holders or the pods changed."""
        if self._followed is None or self._followed[0] is not holders or self._followed[1] != self._version:
            self._followed = (holders, self._version, follow_mounted(holders, self.mounted()))
        return self._followed[2]

    async def run(self, api: KubeApi) -> None:
        self._api = api
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._watch, api)
            tasks.start_soon(self._write_patches, api)

    # Allocate ----------------------------------------------------------------------------------------------
    async def _one(self, resource: str, kubelet_ids: list[str]) -> list[str]:
        count = len(kubelet_ids)
        whole_node = count >= sum(chip.resource == resource for chip in self._chips.values())
        if whole_node:
            pod, real = self._choose(resource, count), kubelet_ids
        else:
            pod, real = await self._chosen(resource, count)
        if pod is not None:
            self._take(pod, resource, real, kubelet_ids)
        return real

    async def _chosen(self, resource: str, count: int) -> tuple[PodView, list[str]]:
        """The pod this Allocate is for and its chips: the first pod in ``predicate-time`` order that can be
        it. A miss reads the pods once, then tries :attr:`_tries` times; LookupError, naming what was
        skipped, when none is found."""
        choosing = _Choosing()
        found = await self._first_acceptable(resource, count, choosing)
        if found is None:
            if not choosing.pods_read:
                choosing.pods_read = True
                await self._read_pods()
            for attempt in range(self._tries):
                choosing.passed.clear()  # a pod that was going may have gone since
                found = await self._first_acceptable(resource, count, choosing)
                if found is not None or attempt == self._tries - 1:
                    break
                await anyio.sleep(self._try_interval)
        if found is None:
            raise LookupError(self._no_pod(resource, count, choosing.skipped))
        return found

    async def _first_acceptable(
        self, resource: str, count: int, choosing: _Choosing
    ) -> tuple[PodView, list[str]] | None:
        """The first pod chosen whose choice passes the checks, and its chips. A pod that cannot be the one
        admitted (one naming a chip another pod holds, or one the kubelet lists holding that chip already) is
        skipped and the next one tried; before the first is skipped the pods are read once more and
        PodResources asked again, each unless this Allocate did already (a miss reads the pods, not
        PodResources), since Volcano may have seen the holder go before the watch did (an outage of the
        watch, its back-off), and a pod made again under the name of one that went is not that one. A choice
        of a chip the node does not have, or of an Unhealthy one, refuses the Allocate. A pod skipped or
        refused is never chosen again, but one skipped for a chip whose pod is going: it is passed over in
        this Allocate only."""
        while (pod := self._choose(resource, count, choosing.passed)) is not None:
            try:
                return pod, self._checked(pod, resource)
            except Skipped as skipped:
                if await self._look_again(choosing):
                    continue  # chosen again from what was read
                self._skip(pod, skipped, choosing)
            except LookupError:
                self._refused.add(pod.uid)
                raise
        return None

    async def _look_again(self, choosing: _Choosing) -> bool:
        """Before a pod is skipped: the pods read again and PodResources asked again, each unless this
        Allocate did it already; whether either was."""
        looked = False
        if not choosing.pods_read:
            choosing.pods_read = looked = True
            await self._read_pods()
        if not choosing.kubelets_asked and self._mounted is not None:
            choosing.kubelets_asked = looked = True
            await self._mounted.refresh_kubelet_holders()
        return looked

    def _skip(self, pod: PodView, skipped: Skipped, choosing: _Choosing) -> None:
        """``pod`` is not the one this Allocate is for: for good, or in this Allocate only when what stands
        in its way is going. Said once per pod, in the log and in an Event on the pod."""
        why = str(skipped)
        (choosing.passed if skipped.for_now else self._refused).add(pod.uid)
        if why not in choosing.skipped:  # one passed over is tried again at each try
            choosing.skipped.append(why)
        if pod.uid in self._said_skipped:
            return
        self._said_skipped.add(pod.uid)
        log.warning("Pod %s/%s is skipped: %s", pod.namespace, pod.name, why)
        if self._events is not None:
            self._events(
                PodEvent("Warning", SKIPPED_REASON, pod.namespace, pod.name, pod.uid, f"Skipped: {why}")
            )

    def _no_pod(self, resource: str, count: int, skipped: Sequence[str] = ()) -> str:
        refused = (
            f"no pod on this node placed by Volcano asks for {count} {resource} "
            f"(annotation {resource} with {count} chips, {PREDICATE_TIME} not taken, bound by the scheduler) "
            f"after {self._tries} tries; the kubelet fails the pod. Check that Volcano schedules the pod "
            "(schedulerName: volcano)"
        )
        if not skipped:
            return refused
        more = f" and {len(skipped) - _SHOWN_SKIPPED} more" if len(skipped) > _SHOWN_SKIPPED else ""
        return f"{refused}; skipped: {'; '.join(skipped[:_SHOWN_SKIPPED])}{more}"

    def _choose(self, resource: str, count: int, passed: AbstractSet[str] = frozenset()) -> PodView | None:
        """:func:`choose` over the cache, from the index: no scan of every pod on an Allocate. The pods in
        ``passed`` are left out but stay in the index."""
        queue = self._queues.get((resource, count), [])
        found = None
        set_aside = []
        while queue:
            predicate_time, _, _, uid = queue[0]
            pod = self._pods.get(uid)
            if (
                pod is not None
                and pod.predicate_time == predicate_time
                and pod.uid not in self._refused
                and choose((pod,), resource, count, self._taken.keys(), self._scheduler) is pod
            ):
                if uid not in passed:
                    found = pod
                    break
                set_aside.append(queue[0])
            heapq.heappop(queue)
        for entry in set_aside:
            heapq.heappush(queue, entry)
        return found

    def _store(self, pod: PodView) -> None:
        """A pod added or changed: cached, and queued for what it asks for. A pod that ended is forgotten:
        the kubelet freed its chips."""
        if pod.ended:
            self._forget(pod.uid)
            return
        if pod.uid not in self._pods and len(self._pods) >= MAX_PODS:
            self._full(1)
            return
        self._pods[pod.uid] = pod
        self._names[pod.namespace, pod.name] = pod.uid
        self._version += 1
        if pod.uid not in self._taken:
            self._mount(pod.uid, self._marks.get(pod.uid) if self._marks is not None else None)
        if pod.bad_predicate_time and pod.uid not in self._ignored:
            self._ignored.add(pod.uid)
            log.warning(
                "Pod %s/%s is ignored: its %s %r is not a number of at most 20 digits",
                pod.namespace,
                pod.name,
                PREDICATE_TIME,
                pod.annotations[PREDICATE_TIME][:40],
            )
        if pod.predicate_time is None or pod.terminating or pod.scheduler != self._scheduler:
            return
        if not pod.bound and pod.uid not in self._unbound and any(pod.chosen(r) for r in pod.limits):
            self._unbound.add(pod.uid)
            log.warning(
                "Pod %s/%s is ignored: it names chips but no scheduler bound it (it was created on the "
                "node); Volcano binds the pods it places",
                pod.namespace,
                pod.name,
            )
        for resource, asked in pod.limits.items():
            count = len(pod.chosen(resource))
            if asked <= 0 or not count:
                continue
            queue = self._queues.setdefault((resource, count), [])
            heapq.heappush(queue, (pod.predicate_time, pod.namespace, pod.name, pod.uid))
            if len(queue) > 2 * len(self._pods) + 16:  # mostly entries of pods since changed or gone
                self._queues[resource, count] = _queue(self._pods.values(), resource, count, self._scheduler)

    def _forget(self, uid: str) -> None:
        pod = self._pods.pop(uid, None)
        taken = self._taken.pop(uid, None)
        self._refused.discard(uid)
        self._said_skipped.discard(uid)
        self._ignored.discard(uid)
        self._unbound.discard(uid)
        if pod is None and taken is None:  # a pod of another node, or one already gone
            return
        if pod is not None and self._names.get((pod.namespace, pod.name)) == uid:
            del self._names[pod.namespace, pod.name]
        if self._over and len(self._pods) < MAX_PODS:
            self._full(0)
        if self._marks is not None:
            self._marks.pop(uid, None)
        self._mount(uid, None)
        self._version += 1
        self._tell_mounted()

    def _full(self, left_out: int) -> None:
        """``left_out`` pods past :data:`MAX_PODS` were not kept (0: the cache is under it again); said once
        each way."""
        if left_out and not self._over:
            log.warning(
                "The API server names more than %d pods on this node that have not ended (a node runs a few "
                "hundred): the pods past them are not kept, and an Allocate for one of them is refused; "
                "check the API server",
                MAX_PODS,
            )
        elif not left_out and self._over:
            log.info("The node's pods are under %d again: every new pod is kept", MAX_PODS)
        self._over = bool(left_out)

    def _mount(self, uid: str, mounted: Mounted | None) -> None:
        """``uid`` has the chips of ``mounted`` now (None: none)."""
        before = self._mounts.pop(uid, None)
        if before is not None:
            for chip in before.real:
                holding = self._on_chip.get((before.resource, chip))
                if holding is not None:
                    holding.discard(uid)
                    if not holding:
                        del self._on_chip[before.resource, chip]
        if mounted is not None:
            self._mounts[uid] = mounted
            for chip in mounted.real:
                self._on_chip.setdefault((mounted.resource, chip), set()).add(uid)
        CHIPS_TAKEN.set(len(self._on_chip))

    def _kubelets(self) -> Holders:
        """The kubelet's PodResources view, by the chips handed over for its IDs."""
        return self._mounted.kubelet_holders() if self._mounted is not None else Holders()

    def _check_free(self, pod: PodView, resource: str, chips: Sequence[str]) -> None:
        """ChipHeld when another pod has one of ``chips``: one this agent gave it to (or an earlier agent, by
        the pod's marks), or one the kubelet's PodResources lists on it (read through what each Allocate
        handed over for the kubelet's IDs); only for now (``for_now``) when that pod is being deleted. Also
        when PodResources lists ``pod`` itself on one: it was admitted before, and no Allocate is for it."""
        for chip in chips:
            for uid in self._on_chip.get((resource, chip), ()):
                if uid != pod.uid:
                    other = self._mounts[uid]
                    raise self._held(pod, resource, chip, uid, f"{other.namespace}/{other.pod}")
        kubelets = self._kubelets()
        for chip in chips:
            for holder in kubelets.by_device.get((resource, chip), ()):
                # Only a pod still here: PodResources may not have caught up with one that went.
                found = self._names.get((holder.namespace, holder.pod))
                if found == pod.uid:
                    raise ChipHeld(
                        f"pod {pod.namespace}/{pod.name} holds {chip} already, as the kubelet lists it: it "
                        f"was admitted before, and its {PREDICATE_TIME} says otherwise; check who wrote it"
                    )
                if found is not None:
                    raise self._held(pod, resource, chip, found, f"{holder.namespace}/{holder.pod}")

    def _held(self, pod: PodView, resource: str, chip: str, uid: str, holder: str) -> ChipHeld:
        """``pod`` names ``chip``, which the pod ``holder`` (``uid``) has: for good, or for now while that
        pod is being deleted (Volcano may place a pod on the chips of one that is going)."""
        named = (
            f"pod {pod.namespace}/{pod.name} names {cut(chip)} in its {resource} annotation, "
            f"which pod {holder}"
        )
        going = self._pods.get(uid)
        if going is not None and going.terminating:
            return ChipHeld(f"{named} has until it stops (it is being deleted)", for_now=True)
        return ChipHeld(f"{named} has; check who wrote that annotation (Volcano never picks a chip in use)")

    def _checked(self, pod: PodView, resource: str) -> list[str]:
        chosen = pod.chosen(resource)
        unknown = [device for device in chosen if device not in self._chips]
        if unknown:
            raise LookupError(
                f"Volcano chose {_named(unknown)} for pod {pod.namespace}/{pod.name}, which this node "
                "does not have; check the node's device-info ConfigMap"
            )
        self._check_free(pod, resource, chosen)
        unhealthy = [self._chips[device] for device in chosen if not self._chips[device].healthy]
        if unhealthy:  # not taken: the kubelet rejects the pod, and its controller makes a new one
            ids = ", ".join(chip.device_id for chip in unhealthy)
            reason = unhealthy[0].reason or "no reason reported"
            raise LookupError(
                f"Volcano chose {ids} for pod {pod.namespace}/{pod.name}, which is Unhealthy ({reason})"
            )
        return chosen

    def _take(self, pod: PodView, resource: str, real: list[str], kubelet_ids: list[str]) -> None:
        chips = [self._chips[device] for device in real if device in self._chips]
        key = (
            CONFIGURATION_NPU if chips and chips[0].generation is Generation.ASCEND950 else CONFIGURATION_910
        )
        self._version += 1
        self._taken[pod.uid] = Mounted(pod.namespace, pod.name, resource, tuple(kubelet_ids), tuple(real))
        self._mount(pod.uid, self._taken[pod.uid])
        # Debug: Allocate's own line names the chips, and the pod's marks name them for kubectl.
        log.debug(
            "Pod %s/%s gets %s (Volcano's choice; the kubelet's IDs %s)",
            pod.namespace,
            pod.name,
            ",".join(real),
            ",".join(kubelet_ids),
        )
        annotations = {PREDICATE_TIME: TAKEN, REAL: ",".join(real), KUBELET_IDS: ",".join(kubelet_ids)}
        self._patches.add(_Patch(pod, annotations, key, tuple(chips)))
        self._tell_mounted()

    async def _read_pods(self) -> None:
        """The cache missed: read the node's pods once, briefly; or, while a read of them is under way (the
        watch's first one: an Allocate right after the agent started), wait for that read instead."""
        with anyio.move_on_after(MISS_READ_TIMEOUT):
            if not self._first_read.is_set() or self._api is None:
                await self._first_read.wait()
                return
            if self._listing is not None:
                await self._listing.wait()
                return
            try:
                await self._list(self._api, limited=False)
            except (ApiUnavailable, ApiError):
                return

    # the cache -------------------------------------------------------------------------------------------
    async def _list(self, api: KubeApi, limited: bool = True) -> str | None:
        """Replace the cache with the node's pods; the list's resourceVersion. ``limited=False``: for
        Allocate, which does not wait for the rate limit."""
        taken_before = set(self._taken)
        self._listing = listing = anyio.Event()
        try:
            pods, version, unreadable, past = await list_node_pods(api, limited)
        finally:
            self._first_read.set()
            listing.set()
            if self._listing is listing:
                self._listing = None
        for name, problem in unreadable.items():
            if name not in self._unreadable:
                log.warning("Pod %s is ignored: %s", name, problem)
        self._unreadable = set(unreadable)
        if past:
            self._full(past)
        listed = {pod.uid for pod in pods}
        if self._marks is None:
            self._marks = {pod.uid: mounted for pod in pods for mounted in mounted_from((pod,))}
        else:
            self._marks = {uid: mounted for uid, mounted in self._marks.items() if uid in listed}
        self._pods, self._names, self._queues, self._mounts, self._on_chip = {}, {}, {}, {}, {}
        # A pod taken while the list was read is kept: the list may be older than the pod.
        self._taken = {
            uid: chips for uid, chips in self._taken.items() if uid in listed or uid not in taken_before
        }
        for uid, chips in self._taken.items():
            self._mount(uid, chips)
        for pod in pods:
            self._store(pod)  # one that ended is forgotten, taken or not
        self._refused &= self._pods.keys()
        self._said_skipped &= self._pods.keys()
        self._ignored &= self._pods.keys()
        self._unbound &= self._pods.keys()
        CHIPS_TAKEN.set(len(self._on_chip))
        self._tell_mounted()
        return version

    async def _watch(self, api: KubeApi) -> None:
        """List the node's pods, then watch them, each watch opened again from the newest version the last
        one saw (a pod deleted meanwhile arrives as DELETED); listed again only on 410 Gone."""
        backoff = api_backoff()
        cursor = WatchCursor()
        while True:
            try:
                if cursor.version is None:
                    # Unlimited: an Allocate that missed the cache waits for this list (at start, on 410).
                    cursor.version = await self._list(api, limited=False)
                async for kind, pod in api.watch(
                    "pods",
                    Pod,
                    cursor,
                    namespace=ALL_NS,
                    fields={"spec.nodeName": api.node},
                    server_timeout=WATCH_SECONDS,
                ):
                    view = view_of(pod)
                    if view is None:
                        continue
                    if kind == "DELETED" or not bound_to(api.node, pod):
                        self._forget(view.uid)
                    else:
                        self._store(view)
                        self._tell_mounted()
                    backoff.reset()
                    # Events that arrived together are read from one buffer without a pause: an Allocate
                    # waiting meanwhile must not wait for all of them.
                    await anyio.lowlevel.checkpoint()
            except ApiUnavailable as exc:
                await wait_before_retry(backoff, exc)
            except (ApiError, httpx2.HTTPError) as exc:
                log.debug("Pod watch ended: %s", exc)
                await wait_before_retry(backoff)

    # the pods' marks ---------------------------------------------------------------------------------------
    async def _write_patches(self, api: KubeApi) -> None:
        backoff = api_backoff()
        host_ip: str | None = None  # the Node's address, read before the first patch
        while True:
            await self._patches.wake.wait()
            self._patches.wake = anyio.Event()
            while self._patches.pending:
                if host_ip is None:
                    try:
                        host_ip = await _host_ip(api)
                    except ApiUnavailable as exc:
                        await wait_before_retry(backoff, exc)
                        continue
                uid = next(iter(self._patches.pending))
                patch = self._patches.pending.pop(uid)
                namespace, name = patch.pod.namespace, patch.pod.name
                try:
                    # Part of the Allocate that chose the pod (one a pod): never behind the rate limit.
                    await api.call_blocking(
                        "patch",
                        "pods",
                        functools.partial(_patch, name, namespace, patch.body(host_ip)),
                        limited=False,
                    )
                except ApiUnavailable as exc:
                    self._patches.pending.setdefault(uid, patch)
                    await wait_before_retry(backoff, exc)
                    continue
                except ApiError as exc:  # the pod is gone (404) or refused the patch
                    log.warning("Cannot mark pod %s/%s with its chips: %s", namespace, name, exc)
                    continue
                backoff.reset()


async def _host_ip(api: KubeApi) -> str:
    """The node's address for the pods' configuration; "" (said once) when the Node names none, is not
    there, or may not be read (RBAC without nodes get). Raises ApiUnavailable while the API server is down:
    the patch could not be written either."""
    try:
        address = await node_address(api, limited=False)
    except ApiError as exc:
        address, why = "", f"the Node cannot be read ({exc})"
    except ApiUnavailable as exc:
        if exc.failure.status != 403:
            raise
        address, why = "", "the agent may not get its Node (give it nodes get)"
    else:
        why = "the Node has no InternalIP address"
    if not address:
        log.warning("Pods' %s are written with host_ip empty: %s", CONFIGURATION_910, why)
    return address


def _named(devices: Sequence[str]) -> str:
    """Devices a pod's annotation names, as a message shows them: the first few, each cut.

    >>> _named(["Ascend910-9", "Ascend910-" + "9" * 100, "a", "b", "c"])
    'Ascend910-9, Ascend910-99...99... (110 characters), a, b and 1 more'
    """
    shown = [cut(device) for device in devices[:4]]
    more = f" and {len(devices) - 4} more" if len(devices) > 4 else ""
    return ", ".join(shown) + more


def _patch(name: str, namespace: str, patch: dict[str, Any], client: Client) -> Pod:
    return client.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)


def _queue(
    pods: Iterable[PodView], resource: str, count: int, scheduler: str
) -> list[tuple[int, str, str, str]]:
    queue = [
        (pod.predicate_time, pod.namespace, pod.name, pod.uid)
        for pod in pods
        if pod.predicate_time is not None and choose((pod,), resource, count, scheduler=scheduler) is pod
    ]
    heapq.heapify(queue)
    return queue
