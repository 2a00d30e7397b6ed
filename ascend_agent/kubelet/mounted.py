"""``--volcano``: the health the kubelet sees under each of its device IDs follows the chip really mounted
there. Volcano's choice mounts chip 3 for a pod the kubelet charged with ``Ascend910-0``; a fault on chip 3
must turn ``Ascend910-0`` Unhealthy, the ID the kubelet knows the pod by.

What each Allocate handed over for the kubelet's IDs comes first (``handed_pairs``: the agent's
:class:`~ascend_agent.kubelet.handed_out.HandedOut`, whose entries go when PodResources shows their IDs
freed); then what the cluster side says each pod got (:meth:`MountedChips.update`, from the pods'
``huawei.com/kltDev`` and ``huawei.com/AscendReal``: an earlier agent's Allocates, or this one's). The
reconciler asks :meth:`MountedChips.listed` for what each ID shows, from memory::

    mounted = MountedChips(on_change=agent.wake)
    mounted.handed_pairs = holdings.handed_out.pairs
    mounted.update([Mounted("team-a", "train-0", T, ("Ascend910-0",), ("Ascend910-3",))])
    mounted.listed(T, devices, holders, answering=True)   # {"Ascend910-0": <chip 0, health of chip 3>, ...}

Each ID shows the health of one chip, and each chip is shown under one ID (a permutation), so the kubelet's
counts stay those of the chips: an ID held by a pod shows the chip mounted under it; a free ID whose own chip
is not mounted shows its own chip; a free ID whose own chip is mounted under another ID shows the chip of
that ID when it is free in turn (following the chain until a chip no pod has mounted). A pod's mapping goes
with the pod: once the cluster side forgets it (deleted), or PodResources, having listed it, lists it no
more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING

from ascend_agent.model import Chip, Holders

if TYPE_CHECKING:
    from ascend_agent.cluster.volcano_marks import Mounted


def shown_chips(mounted_under: Iterable[tuple[str, str]], ids: Collection[str]) -> dict[str, str]:
    """Device ID -> the ID of the chip whose health it shows: a permutation of ``ids`` that sends each
    (kubelet's ID, chip mounted) pair's ID to its chip. A pair naming an ID outside ``ids``, or an ID or chip
    an earlier pair took, is left out.

    >>> ids = [f"Ascend910-{i}" for i in range(4)]
    >>> shown = shown_chips([("Ascend910-0", "Ascend910-3")], ids)
    >>> [shown[i][-1] for i in ids]
    ['3', '1', '2', '0']
    >>> shown = shown_chips([("Ascend910-0", "Ascend910-3"), ("Ascend910-3", "Ascend910-1")], ids)
    >>> [shown[i][-1] for i in ids]
    ['3', '0', '2', '1']
    """
    under: dict[str, str] = {}
    taken: set[str] = set()
    for device_id, chip in mounted_under:
        if device_id in ids and chip in ids and device_id not in under and chip not in taken:
            under[device_id] = chip
            taken.add(chip)
    mounted_at = {chip: device_id for device_id, chip in under.items()}
    shown = {}
    for device_id in ids:
        if device_id in under:
            shown[device_id] = under[device_id]
            continue
        chip = device_id  # free: follow the chain to a chip no pod has mounted
        while chip in mounted_at:
            chip = mounted_at[chip]
        shown[device_id] = chip
    return shown


class MountedChips:
    """The chips each pod got under the kubelet's IDs, as the cluster side last said; the agent's view."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self.on_change = on_change
        # The kubelet's PodResources view by the chips really handed over, which the agent keeps: the cluster
        # side skips a choice naming a chip another pod holds.
        self.kubelet_holders: Callable[[], Holders] = Holders
        # Asks the kubelet's PodResources again, now (before a choice is skipped on its word).
        self.refresh_kubelet_holders: Callable[[], Awaitable[object]] = _asked
        # (the kubelet's ID, the device an Allocate handed over for it) of a resource, newest first.
        self.handed_pairs: Callable[[str], Iterable[tuple[str, str]]] = lambda resource: ()
        self._mounted: tuple[Mounted, ...] = ()
        self._listed_before: set[Mounted] = set()

    def update(self, mounted: Iterable[Mounted]) -> None:
        """The pods that got Volcano's choice now; wakes the agent when it changed."""
        now = tuple(mounted)
        if now != self._mounted:
            self._mounted = now
            self.on_change()

    def listed(
        self, resource: str, devices: Mapping[str, Chip], holders: Holders, answering: bool
    ) -> dict[str, Chip] | None:
        """What ListAndWatch advertises for ``devices`` (ID -> chip, one per chip): each ID with the health
        of the chip it shows; None when every ID shows its own chip. ``holders`` is the kubelet's
        PodResources view, ``answering`` whether it answered last time (if not, no pod counts as gone)."""
        live = [pod for pod in self._live(holders, answering) if pod.resource == resource]
        pairs = [*self.handed_pairs(resource)]
        pairs.extend(
            pair
            for pod in live
            if len(pod.kubelet_ids) == len(pod.real)
            for pair in zip(pod.kubelet_ids, pod.real, strict=True)
        )
        shown = shown_chips(pairs, devices.keys())
        if all(chip == device_id for device_id, chip in shown.items()):
            return None
        return {
            device_id: chip.with_health(devices[shown[device_id]].health, devices[shown[device_id]].reason)
            for device_id, chip in devices.items()
        }

    def _live(self, holders: Holders, answering: bool) -> list[Mounted]:
        """The pods still there: a pod PodResources listed once and lists no more has gone."""
        self._listed_before &= set(self._mounted)
        live = []
        for pod in self._mounted:
            if answering and _held(pod, holders):
                self._listed_before.add(pod)
            if not answering or pod not in self._listed_before or _held(pod, holders):
                live.append(pod)
        return live


async def _asked() -> None:
    """No PodResources to ask."""


def _held(pod: Mounted, holders: Holders) -> bool:
    return any(
        (holder.namespace, holder.pod) == (pod.namespace, pod.pod)
        for device_id in pod.kubelet_ids
        for holder in holders.by_device.get((pod.resource, device_id), ())
    )
