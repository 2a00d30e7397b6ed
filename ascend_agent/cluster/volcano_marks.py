"""What Volcano and the pods' marks say, as plain data and pure functions (no I/O): a pod as ``--volcano``
sees it (:class:`PodView`), Volcano's choice for an Allocate (:func:`choose`), what a pod got
(:class:`Mounted`, from ``huawei.com/AscendReal`` and ``huawei.com/kltDev``) and the holders moved to the
chips really mounted (:func:`follow_mounted`)::

    pod = choose(pods, "huawei.com/Ascend910", 2, chips)      # the pod Volcano placed first, or None
    follow_mounted(holders, mounted_from(pods))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from lightkube.resources.core_v1 import Pod

from ascend_agent.cluster.deviceinfo import go_json
from ascend_agent.echo import cut
from ascend_agent.kube_names import DNS_SUBDOMAIN_MAX
from ascend_agent.model import UNKNOWN_SUPER_POD, Chip, Holder, Holders
from ascend_agent.naming import RESOURCE_DOMAIN

PREDICATE_TIME = "predicate-time"


TAKEN = "18446744073709551615"  # MaxUint64: the pod has its chips


MAX_PREDICATE_TIME = 2**64 - 1


# The scheduler whose pods' choices count (``spec.schedulerName``; ``--volcano-scheduler-name``).
VOLCANO_SCHEDULER = "volcano"


# What a pod without ``spec.schedulerName`` gets from the API server.
DEFAULT_SCHEDULER = "default-scheduler"


REAL = "huawei.com/AscendReal"


KUBELET_IDS = "huawei.com/kltDev"


# What a pod's view keeps of an annotation's value: the chips of a node's 16, or its vNPUs, take a few hundred
# characters. A longer value is cut, and the cut marked (it then names no chip).
MAX_VALUE = 1024
_CUT = "\u2026"


class Skipped(LookupError):
    """The pod cannot be the one the kubelet admits: the choice moves on to the next pod. ``for_now``: in this
    Allocate only, since what stands in its way is going (a pod being deleted)."""

    def __init__(self, message: str, for_now: bool = False) -> None:
        super().__init__(message)
        self.for_now = for_now


class ChipHeld(Skipped):
    """Volcano's choice names a chip another pod has, as far as the cache knows."""


@dataclass(frozen=True, slots=True)
class PodView:
    """What the choice needs of a pod."""

    namespace: str
    name: str
    uid: str
    annotations: Mapping[str, str]
    limits: Mapping[str, int]  # resource -> chips asked for, over the pod's containers
    terminating: bool = False  # being deleted, or ended
    scheduler: str = VOLCANO_SCHEDULER  # spec.schedulerName
    ended: bool = False  # Succeeded or Failed: the kubelet freed its chips
    # A scheduler bound it: the condition PodScheduled, which the API server sets as it takes a Binding (the
    # way Volcano binds), not a pod created with its node already named. The kubelet sets it too, for every
    # pod it syncs: hence ``admitted``.
    bound: bool = True
    pending: bool = True  # phase Pending: the kubelet admits a pod before it runs
    # The kubelet wrote the pod's status (``status.startTime``, set in its first write, which follows the
    # admission and its Allocates): no Allocate is for this pod any more, even while it waits for its image.
    admitted: bool = False
    # Volcano's ``predicate-time``; None when it is missing, says taken, or is not a predicate time.
    predicate_time: int | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "predicate_time", predicate_time(self.annotations.get(PREDICATE_TIME, "")))

    @classmethod
    def of(cls, pod: Pod) -> PodView:
        """What the choice needs of ``pod``, and no more: the annotations it reads (``predicate-time`` and
        those of the ``huawei.com`` domain), each at most :data:`MAX_VALUE` characters, and the limits of
        that domain. ValueError for a namespace, name or uid longer than a Kubernetes name."""
        meta = pod.metadata
        assert meta is not None
        namespace, name = meta.namespace or "", meta.name or ""
        uid = meta.uid or f"{namespace}/{name}"
        for what, value in (("namespace", namespace), ("name", name), ("uid", uid)):
            if len(value) > DNS_SUBDOMAIN_MAX:
                raise ValueError(f"its {what} {cut(value)!r} is longer than a Kubernetes name")
        limits: dict[str, int] = {}
        for container in (pod.spec.containers if pod.spec else None) or []:
            asked = (container.resources.limits if container.resources else None) or {}
            for resource, value in asked.items():
                text = str(value)
                if not _ours(resource) or len(text) > 20:
                    continue
                try:
                    limits[resource] = limits.get(resource, 0) + int(text)
                except ValueError:
                    continue
        phase = pod.status.phase if pod.status else None
        ended = phase in ("Succeeded", "Failed")
        conditions = (pod.status.conditions if pod.status else None) or []
        return cls(
            namespace=namespace,
            name=name,
            uid=uid,
            annotations={
                key: value if len(value) <= MAX_VALUE else value[:MAX_VALUE] + _CUT
                for key, value in (meta.annotations or {}).items()
                if key == PREDICATE_TIME or _ours(key)
            },
            limits=limits,
            terminating=meta.deletionTimestamp is not None or ended,
            scheduler=(pod.spec.schedulerName if pod.spec else None) or DEFAULT_SCHEDULER,
            ended=ended,
            bound=any(c.type == "PodScheduled" and c.status == "True" for c in conditions),
            pending=phase in (None, "", "Pending"),
            admitted=pod.status is not None and pod.status.startTime is not None,
        )

    def chosen(self, resource: str) -> list[str]:
        return list(_split(self.annotations.get(resource, "")))

    @property
    def bad_predicate_time(self) -> bool:
        """A ``predicate-time`` that is there but is no predicate time (the pod is ignored)."""
        value = self.annotations.get(PREDICATE_TIME)
        return value is not None and value != TAKEN and self.predicate_time is None


def _ours(key: str) -> bool:
    """An annotation or resource of the ``huawei.com`` domain (the resources, Volcano's choice, the marks)."""
    return key.startswith(f"{RESOURCE_DOMAIN}/") and len(key) <= DNS_SUBDOMAIN_MAX + 64


def predicate_time(value: str) -> int | None:
    """Volcano's ``predicate-time``: ASCII digits of a number within uint64; None for anything else, and
    for ``18446744073709551615`` (taken).

    >>> predicate_time("1700000000000"), predicate_time("18446744073709551615"), predicate_time("\u00b2")
    (1700000000000, None, None)
    >>> predicate_time("18446744073709551616"), predicate_time("9" * 5000), predicate_time("-1")
    (None, None, None)
    """
    if not value or not value.isascii() or not value.isdigit():
        return None
    digits = value.lstrip("0") or "0"
    if len(digits) > len(TAKEN):
        return None
    number = int(digits)
    return number if number < MAX_PREDICATE_TIME else None


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


def follow_mounted(holders: Holders, mounted: Iterable[Mounted]) -> Holders:
    """The holders by the chips really mounted: a pod that got Volcano's choice holds its ``AscendReal``
    chips, not the kubelet's IDs for it.

    >>> T = "huawei.com/Ascend910"
    >>> kubelets = Holders({(T, "Ascend910-0"): (Holder("ns", "p", "main"),)})
    >>> moved = follow_mounted(kubelets, [Mounted("ns", "p", T, ("Ascend910-0",), ("Ascend910-5",))])
    >>> moved.by_device
    {('huawei.com/Ascend910', 'Ascend910-5'): (Holder(namespace='ns', pod='p', container='main', claim=''),)}
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
    pods: Iterable[PodView],
    resource: str,
    count: int,
    skipped: AbstractSet[str] = frozenset(),
    scheduler: str = VOLCANO_SCHEDULER,
) -> PodView | None:
    """The pod this Allocate of ``count`` chips of ``resource`` is for: among the pods ``scheduler`` placed
    (and a scheduler bound) that the kubelet has not admitted yet, ask for ``count`` chips and whose choice
    names as many, the smallest ``predicate-time``. Pods whose uid is in ``skipped`` (taken, or refused once)
    are left out.

    >>> T = "huawei.com/Ascend910"
    >>> a = PodView("ns", "a", "1", {T: "Ascend910-3", "predicate-time": "20"}, {T: 1})
    >>> b = PodView("ns", "b", "2", {T: "Ascend910-5", "predicate-time": "10"}, {T: 1})
    >>> by_hand = PodView("ns", "c", "3", {T: "Ascend910-6", "predicate-time": "0"}, {T: 1}, scheduler="x")
    >>> on_node = PodView("ns", "d", "4", {T: "Ascend910-7", "predicate-time": "0"}, {T: 1}, bound=False)
    >>> waiting = PodView("ns", "e", "5", {T: "Ascend910-1", "predicate-time": "0"}, {T: 1}, admitted=True)
    >>> choose([a, b, by_hand, on_node, waiting], T, 1).name, choose([a, b], T, 2)
    ('b', None)
    """
    candidates = [
        pod
        for pod in pods
        if pod.predicate_time is not None
        and not pod.terminating
        and pod.bound
        and pod.pending
        and not pod.admitted
        and pod.scheduler == scheduler
        and pod.uid not in skipped
        and pod.limits.get(resource, 0) == count
        and len(pod.chosen(resource)) == count
    ]
    return min(candidates, key=lambda pod: (pod.predicate_time or 0, pod.namespace, pod.name), default=None)


def configuration(pod: PodView, chips: Sequence[Chip], host_ip: str = "") -> str:
    """The rank-table input Huawei's plugin writes: the pod, its uid, the node's address (``host_ip`` and
    ``server_ip``), the super pod (A3; -2 elsewhere), each chip's physical ID, device IP (empty when it has
    none, never ``-1``; ``127.0.0.1`` for a vNPU) and, on A3, SDID as ``super_device_id``; the server index.
    Keys in the order of Huawei's struct (``rack_id``, an A5 field, is left out)."""
    super_pod_id, server_index = UNKNOWN_SUPER_POD, UNKNOWN_SUPER_POD
    known = next((chip.super_pod for chip in chips if chip.super_pod is not None), None)
    if known is not None:
        super_pod_id, server_index = known.super_pod_id, known.server_index
    return go_json(
        {
            "pod_name": pod.name,
            "server_id": pod.uid,
            "host_ip": host_ip,
            "super_pod_id": super_pod_id,
            "devices": [_configured_device(chip) for chip in chips],
            "server_index": str(server_index),
            "server_ip": host_ip,
        }
    )


def _configured_device(chip: Chip) -> dict[str, str]:
    device = {"device_id": str(chip.phys_id), "device_ip": chip.rank_ip or ""}
    if chip.super_pod is not None:
        device["super_device_id"] = str(chip.super_pod.sdid)
    return device
