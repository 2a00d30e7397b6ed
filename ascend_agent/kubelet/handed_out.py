"""The devices Allocate handed over that the kubelet's PodResources has not shown freed yet.

Right after an Allocate nothing else says a device is in use: PodResources is asked again only shortly after
(and lists the pod only once the kubelet recorded it), and npu-smi's container column stays empty until the
container opens the device. So a device handed over counts as held until PodResources shows it freed: an
answer asked after the Allocate listed it and a later one lists it no more; or no answer listed it for
``UNSEEN_GRACE`` after the Allocate (the kubelet dropped the pod before recording it)::

    handed = HandedOut()
    handed.record("huawei.com/Ascend310P-2c", ["Ascend310P-2c-118-1"])   # after each Allocate
    handed.observe(listed, asked_at)      # each PodResources answer: (resource, device ID) pairs it lists
    handed.device_ids()                   # frozenset({"Ascend310P-2c-118-1"})
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

# The kubelet records an allocation as it admits the pod, well within this after Allocate answered.
UNSEEN_GRACE = 60.0


@dataclass(slots=True)
class _Handed:
    at: float
    seen: bool = False


class HandedOut:
    """(resource, device ID) -> when Allocate handed it over, and whether PodResources has listed it since."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, grace: float = UNSEEN_GRACE) -> None:
        self._clock = clock
        self._grace = grace
        self._handed: dict[tuple[str, str], _Handed] = {}

    def record(self, resource: str, device_ids: Iterable[str]) -> None:
        """Allocate handed ``device_ids`` of ``resource`` to a container (again: counted from now)."""
        now = self._clock()
        for device_id in device_ids:
            self._handed[(resource, device_id)] = _Handed(now)

    def observe(self, listed: Collection[tuple[str, str]], asked_at: float) -> None:
        """A PodResources answer, asked at ``asked_at`` (this clock), listing these (resource, device ID)s.
        An answer asked before a device was handed over says nothing of it."""
        for key, handed in list(self._handed.items()):
            if asked_at < handed.at:
                continue
            if key in listed:
                handed.seen = True
            elif handed.seen or asked_at - handed.at > self._grace:
                del self._handed[key]

    def device_ids(self) -> frozenset[str]:
        """The device IDs still counted as held."""
        return frozenset(device_id for _, device_id in self._handed)
