"""``--volcano``: Volcano chooses the chips. Volcano's ``ascend-for-volcano`` writes its choice on the pod it
places (``huawei.com/Ascend910: Ascend910-3,Ascend910-5`` and a ``predicate-time``); on Allocate the agent
answers with those chips instead of the kubelet's IDs and marks the pod as Huawei's device plugin does.

    pods = VolcanoPods(mounted=MountedChips(on_change=agent.wake))   # told what each pod got
    pods.observe(inventory)                          # the chips, to check Volcano's choice against
    tasks.start_soon(pods.run, api)                  # the node's pods, watched; the pods' patches
    await pods.remap("huawei.com/Ascend910", [["Ascend910-0", "Ascend910-1"]])   # [["Ascend910-3", ...]]

Among the node's pods that are not terminating, ask for the resource in a container limit, carry the
resource's annotation with as many chips as the kubelet asked for, and whose ``predicate-time`` is not
``18446744073709551615`` (taken), the one with the smallest ``predicate-time`` gets this Allocate. Pods come
from a watch (re-listed at least every :data:`RELIST_INTERVAL`); a miss reads the pods once from the API
server, and the choice is tried 3 times 1 s apart before Allocate is refused (the kubelet retries the pod).
A request for every chip of the resource keeps the kubelet's IDs, as Huawei's plugin does.

The pod is then patched (RBAC: pods list, watch, patch) with ``predicate-time: "18446744073709551615"``,
``huawei.com/AscendReal`` (the chips mounted), ``huawei.com/kltDev`` (the kubelet's IDs) and
``ascend.kubectl.kubernetes.io/ascend-910-configuration`` (``ascend-npu-configuration`` for 950). The patch is
written beside Allocate from a worker thread (:meth:`~ascend_agent.cluster.client.KubeApi.call_blocking`),
retried until it lands; the pod counts as taken from the moment Allocate chose it.
"""

from __future__ import annotations

import functools
import heapq
import logging
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
from lightkube import ALL_NS, ApiError, Client
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from ascend_agent.cluster.client import ApiUnavailable, KubeApi
from ascend_agent.cluster.deviceinfo import go_json
from ascend_agent.cluster.writer import api_backoff
from ascend_agent.kubelet_view import MountedChips
from ascend_agent.model import UNKNOWN_SUPER_POD, Chip, Generation, Inventory
from ascend_agent.podresources import Holder, Holders

log = logging.getLogger("ascend_agent.cluster")

PREDICATE_TIME = "predicate-time"
TAKEN = "18446744073709551615"  # MaxUint64: the pod has its chips
REAL = "huawei.com/AscendReal"
KUBELET_IDS = "huawei.com/kltDev"
CONFIGURATION_910 = "ascend.kubectl.kubernetes.io/ascend-910-configuration"
CONFIGURATION_NPU = "ascend.kubectl.kubernetes.io/ascend-npu-configuration"
TRIES = 3
TRY_INTERVAL = 1.0
# A watch that silently stopped delivering cannot leave the cache older than this.
RELIST_INTERVAL = 60
# A cache miss reads the pods once; it waits at most this long for them.
MISS_READ_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class PodView:
    """What the choice needs of a pod."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]
    limits: Mapping[str, int]  # resource -> chips asked for, over the pod's containers
    terminating: bool = False
    # Volcano's ``predicate-time``; None when it is missing, not a number, or says taken.
    predicate_time: int | None = field(init=False)

    def __post_init__(self) -> None:
        value = self.annotations.get(PREDICATE_TIME, "")
        object.__setattr__(
            self, "predicate_time", None if value == TAKEN or not value.isdigit() else int(value)
        )

    @classmethod
    def of(cls, pod: Pod) -> PodView:
        meta = pod.metadata
        assert meta is not None
        limits: dict[str, int] = {}
        for container in (pod.spec.containers if pod.spec else None) or []:
            asked = (container.resources.limits if container.resources else None) or {}
            for resource, value in asked.items():
                try:
                    limits[resource] = limits.get(resource, 0) + int(str(value))
                except ValueError:
                    continue
        phase = pod.status.phase if pod.status else None
        return cls(
            namespace=meta.namespace or "",
            name=meta.name or "",
            uid=meta.uid or f"{meta.namespace}/{meta.name}",
            annotations=dict(meta.annotations or {}),
            limits=limits,
            terminating=meta.deletionTimestamp is not None or phase in ("Succeeded", "Failed"),
        )

    def chosen(self, resource: str) -> list[str]:
        return list(_split(self.annotations.get(resource, "")))


@dataclass(frozen=True, slots=True)
class Mounted:
    """A pod that got Volcano's choice: the kubelet's IDs for it and the chips really mounted."""

    namespace: str
    pod: str
    resource: str
    kubelet_ids: tuple[str, ...]
    real: tuple[str, ...]


def mounted_from(pods: Iterable[PodView]) -> list[Mounted]:
    """What the pods' marks (``huawei.com/AscendReal``, ``huawei.com/kltDev``) say they got."""
    found = []
    for pod in pods:
        if REAL in pod.annotations and KUBELET_IDS in pod.annotations:
            resource = next((r for r in pod.limits if r in pod.annotations), None)
            if resource is not None:
                real, kubelet_ids = _split(pod.annotations[REAL]), _split(pod.annotations[KUBELET_IDS])
                found.append(Mounted(pod.namespace, pod.name, resource, kubelet_ids, real))
    return found


async def node_pods(api: KubeApi) -> list[PodView]:
    """The pods bound to the agent's node, read once."""
    pods, _ = await _listed(api)
    return pods


def follow_mounted(holders: Holders, mounted: Iterable[Mounted]) -> Holders:
    """The holders by the chips really mounted: a pod that got Volcano's choice holds its ``AscendReal``
    chips, not the kubelet's IDs for it.

    >>> T = "huawei.com/Ascend910"
    >>> kubelets = Holders({(T, "Ascend910-0"): (Holder("ns", "p", "main"),)})
    >>> moved = follow_mounted(kubelets, [Mounted("ns", "p", T, ("Ascend910-0",), ("Ascend910-5",))])
    >>> moved.by_device
    {('huawei.com/Ascend910', 'Ascend910-5'): (Holder(namespace='ns', pod='p', container='main'),)}
    """
    by_device = {key: set(found) for key, found in holders.by_device.items()}
    for pod in mounted:
        containers: set[str] = set()
        for device in pod.kubelet_ids:
            found = by_device.get((pod.resource, device), set())
            mine = {holder for holder in found if (holder.namespace, holder.pod) == (pod.namespace, pod.pod)}
            containers.update(holder.container for holder in mine)
            found -= mine
        for device in pod.real:
            by_device.setdefault((pod.resource, device), set()).update(
                Holder(pod.namespace, pod.pod, container) for container in containers
            )
    return Holders({key: tuple(sorted(found)) for key, found in by_device.items() if found})


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def choose(
    pods: Iterable[PodView], resource: str, count: int, taken: AbstractSet[str] = frozenset()
) -> PodView | None:
    """The pod this Allocate of ``count`` chips of ``resource`` is for: the smallest ``predicate-time``.

    >>> T = "huawei.com/Ascend910"
    >>> a = PodView("ns", "a", "1", {T: "Ascend910-3", "predicate-time": "20"}, {T: 1})
    >>> b = PodView("ns", "b", "2", {T: "Ascend910-5", "predicate-time": "10"}, {T: 1})
    >>> choose([a, b], T, 1).name, choose([a, b], T, 2)
    ('b', None)
    """
    candidates = [
        pod
        for pod in pods
        if pod.predicate_time is not None
        and not pod.terminating
        and pod.uid not in taken
        and pod.limits.get(resource, 0) > 0
        and len(pod.chosen(resource)) == count
    ]
    return min(candidates, key=lambda pod: (pod.predicate_time or 0, pod.namespace, pod.name), default=None)


def configuration(pod: PodView, chips: Sequence[Chip]) -> str:
    """The rank-table input Huawei's plugin writes: the pod, its uid, the super pod (A3; -2 elsewhere), each
    chip's physical ID, device IP (empty when it has none, ``127.0.0.1`` for a vNPU) and, on A3, SDID as
    ``super_device_id``; the server index. Keys in the order of Huawei's struct."""
    super_pod_id, server_index = UNKNOWN_SUPER_POD, UNKNOWN_SUPER_POD
    known = next((chip.super_pod for chip in chips if chip.super_pod is not None), None)
    if known is not None:
        super_pod_id, server_index = known.super_pod_id, known.server_index
    return go_json(
        {
            "pod_name": pod.name,
            "server_id": pod.uid,
            "super_pod_id": super_pod_id,
            "devices": [_configured_device(chip) for chip in chips],
            "server_index": str(server_index),
        }
    )


def _configured_device(chip: Chip) -> dict[str, str]:
    device = {"device_id": str(chip.phys_id), "device_ip": chip.rank_ip or ""}
    if chip.super_pod is not None:
        device["super_device_id"] = str(chip.super_pod.sdid)
    return device


@dataclass(slots=True)
class _Patches:
    """The pods' patches not written yet, by pod uid; the newest for a pod wins."""

    pending: dict[str, tuple[str, str, dict[str, Any]]] = field(default_factory=dict)
    wake: anyio.Event = field(default_factory=anyio.Event)

    def add(self, pod: PodView, patch: dict[str, Any]) -> None:
        self.pending[pod.uid] = (pod.namespace, pod.name, patch)
        self.wake.set()


class VolcanoPods:
    """The cluster feature of ``--volcano``: the node's pods, Volcano's choice on Allocate, the pods'
    marks."""

    def __init__(
        self,
        tries: int = TRIES,
        try_interval: float = TRY_INTERVAL,
        mounted: MountedChips | None = None,
    ) -> None:
        # Told what the pods got whenever it may have changed: the health the kubelet sees follows it.
        self._mounted = mounted
        self._mounted_told = True  # False while what the pods got changed since MountedChips was told
        self._tries = tries
        self._try_interval = try_interval
        self._chips: dict[str, Chip] = {}
        self._pods: dict[str, PodView] = {}
        self._taken: dict[str, Mounted] = {}  # uid -> what it got (until the pod goes)
        # (resource, chips) -> a heap of (predicate-time, namespace, name, uid) of the pods that may want
        # them; entries of pods since changed, taken or gone are dropped when they come to the top.
        self._queues: dict[tuple[str, int], list[tuple[int, str, str, str]]] = {}
        self._version = 0  # counts changes of the pods and the taken ones
        self._followed: tuple[Holders, int, Holders] | None = None
        self._api: KubeApi | None = None
        self._first_read = anyio.Event()  # set once the watch's first read of the pods ended, answered or not
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
        marked = [pod for pod in self._pods.values() if pod.uid not in self._taken]
        return [*self._taken.values(), *mounted_from(marked)]

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
        pod = self._choose(resource, count)
        if pod is None and not whole_node:
            await self._read_pods()
            for attempt in range(self._tries):
                pod = self._choose(resource, count)
                if pod is not None or attempt == self._tries - 1:
                    break
                await anyio.sleep(self._try_interval)
        if whole_node:
            real = kubelet_ids
        elif pod is None:
            raise LookupError(
                f"no pod on this node placed by Volcano asks for {count} {resource} "
                f"(annotation {resource} with {count} chips, {PREDICATE_TIME} not taken) after {self._tries} "
                "tries; the kubelet retries. Check that Volcano schedules the pod (schedulerName: volcano)"
            )
        else:
            real = self._checked(pod, resource)
        if pod is not None:
            self._take(pod, resource, real, kubelet_ids)
        return real

    def _choose(self, resource: str, count: int) -> PodView | None:
        """:func:`choose` over the cache, from the index: no scan of every pod on an Allocate."""
        queue = self._queues.get((resource, count))
        while queue:
            predicate_time, _, _, uid = queue[0]
            pod = self._pods.get(uid)
            if (
                pod is not None
                and pod.predicate_time == predicate_time
                and choose((pod,), resource, count, self._taken.keys()) is pod
            ):
                return pod
            heapq.heappop(queue)
        return None

    def _store(self, pod: PodView) -> None:
        """A pod added or changed: cached, and queued for what it asks for."""
        self._pods[pod.uid] = pod
        self._version += 1
        if pod.predicate_time is None or pod.terminating:
            return
        for resource, asked in pod.limits.items():
            count = len(pod.chosen(resource))
            if asked <= 0 or not count:
                continue
            queue = self._queues.setdefault((resource, count), [])
            heapq.heappush(queue, (pod.predicate_time, pod.namespace, pod.name, pod.uid))
            if len(queue) > 2 * len(self._pods) + 16:  # mostly entries of pods since changed or gone
                self._queues[resource, count] = _queue(self._pods.values(), resource, count)

    def _forget(self, uid: str) -> None:
        self._version += 1
        self._pods.pop(uid, None)
        self._taken.pop(uid, None)
        self._tell_mounted()

    def _checked(self, pod: PodView, resource: str) -> list[str]:
        chosen = pod.chosen(resource)
        unknown = [device for device in chosen if device not in self._chips]
        if unknown:
            raise LookupError(
                f"Volcano chose {', '.join(unknown)} for pod {pod.namespace}/{pod.name}, which this node "
                "does not have; check the node's device-info ConfigMap"
            )
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
        # Debug: Allocate's own line names the chips, and the pod's marks name them for kubectl.
        log.debug(
            "Pod %s/%s gets %s (Volcano's choice; the kubelet's IDs %s)",
            pod.namespace,
            pod.name,
            ",".join(real),
            ",".join(kubelet_ids),
        )
        annotations = {
            PREDICATE_TIME: TAKEN,
            REAL: ",".join(real),
            KUBELET_IDS: ",".join(kubelet_ids),
            key: configuration(pod, chips),
        }
        self._patches.add(pod, {"metadata": {"annotations": annotations}})
        self._tell_mounted()

    async def _read_pods(self) -> None:
        """The cache missed: read the node's pods once, briefly; or, while the watch's first read of them is
        under way (an Allocate right after the agent started), wait for that read instead."""
        with anyio.move_on_after(MISS_READ_TIMEOUT):
            if not self._first_read.is_set() or self._api is None:
                await self._first_read.wait()
                return
            try:
                await self._list(self._api)
            except (ApiUnavailable, ApiError):
                return

    # the cache -------------------------------------------------------------------------------------------
    async def _list(self, api: KubeApi) -> str | None:
        """Replace the cache with the node's pods; the list's resourceVersion."""
        try:
            pods, version = await _listed(api)
        finally:
            self._first_read.set()
        self._pods, self._queues = {}, {}
        for pod in pods:
            self._store(pod)
        self._taken = {uid: chips for uid, chips in self._taken.items() if uid in self._pods}
        self._tell_mounted()
        return version

    async def _watch(self, api: KubeApi) -> None:
        backoff = api_backoff()
        while True:
            try:
                version = await self._list(api)
                watch = api.client.watch(
                    Pod,
                    namespace=ALL_NS,
                    fields={"spec.nodeName": api.node},
                    resource_version=version,
                    server_timeout=RELIST_INTERVAL,
                )
                async for kind, pod in api.stream("pods", watch):
                    view = PodView.of(pod)
                    if kind == "DELETED" or not _on(api.node, pod):
                        self._forget(view.uid)
                    else:
                        self._store(view)
                        self._tell_mounted()
                    backoff.reset()
                    # Events that arrived together are read from one buffer without a pause: an Allocate
                    # waiting meanwhile must not wait for all of them.
                    await anyio.lowlevel.checkpoint()
            except ApiUnavailable:
                await anyio.sleep(backoff.next())
            except (ApiError, httpx2.HTTPError) as exc:
                log.debug("Pod watch ended: %s", exc)
                await anyio.sleep(backoff.next())

    # the pods' marks ---------------------------------------------------------------------------------------
    async def _write_patches(self, api: KubeApi) -> None:
        backoff = api_backoff()
        while True:
            await self._patches.wake.wait()
            self._patches.wake = anyio.Event()
            while self._patches.pending:
                uid = next(iter(self._patches.pending))
                namespace, name, patch = self._patches.pending.pop(uid)
                try:
                    await api.call_blocking(
                        "patch", "pods", functools.partial(_patch, name, namespace, patch)
                    )
                except ApiUnavailable:
                    self._patches.pending.setdefault(uid, (namespace, name, patch))
                    await anyio.sleep(backoff.next())
                    continue
                except ApiError as exc:  # the pod is gone (404) or refused the patch
                    log.warning("Cannot mark pod %s/%s with its chips: %s", namespace, name, exc)
                    continue
                backoff.reset()


def _patch(name: str, namespace: str, patch: dict[str, Any], client: Client) -> Pod:
    return client.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)


def _queue(pods: Iterable[PodView], resource: str, count: int) -> list[tuple[int, str, str, str]]:
    queue = [
        (pod.predicate_time, pod.namespace, pod.name, pod.uid)
        for pod in pods
        if pod.predicate_time is not None and choose((pod,), resource, count) is pod
    ]
    heapq.heapify(queue)
    return queue


async def _listed(api: KubeApi) -> tuple[list[PodView], str | None]:
    """The pods bound to the agent's node, and the list's resourceVersion."""
    listing = api.client.list(Pod, namespace=ALL_NS, fields={"spec.nodeName": api.node})
    pods, version = await api.call("list", "pods", _collect(listing))
    return [PodView.of(pod) for pod in pods if _on(api.node, pod)], version


async def _collect(pods: Any) -> tuple[list[Pod], str | None]:
    """Every pod of lightkube's list iterator, and the list's resourceVersion."""
    found = [pod async for pod in pods]
    try:
        version: str | None = pods.resourceVersion
    except Exception:  # an answer without one: the watch starts from now
        version = None
    return found, version


def _on(node: str, pod: Pod) -> bool:
    """Bound to this node (an API server that ignores the field selector lists every pod)."""
    return pod.spec is not None and pod.spec.nodeName == node
