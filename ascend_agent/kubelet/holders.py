"""Which pod holds which chip, as the agent knows it: the kubelet's PodResources view (by the kubelet's IDs),
moved to the chips really mounted under ``--volcano``, and what Allocate handed over that PodResources has
not shown yet (the vNPU layout must not destroy it)::

    holdings = Holdings(PodHolders(socket, interval), follow_mounted=None)
    holdings.allocated("huawei.com/Ascend910", ["Ascend910-3"])     # the device plugin's on_allocated
    holdings.by_chip()          # Holders by the devices really handed over (the metrics' pod labels)
    holdings.held_devices()     # frozenset of device IDs held now; None while PodResources does not answer

As a DRA driver, ``claimed`` gives the device IDs its prepared claims hold (PodResources names claims' devices
by their DRA names, and lists a pod only once it runs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ascend_agent.kubelet.handed_out import HandedOut
from ascend_agent.kubelet.podresources import PodHolders
from ascend_agent.model import Holders


class Holdings:
    """``pods`` is the PodResources poller (its :meth:`~PodHolders.run` is the caller's task);
    ``follow_mounted``, with ``--volcano``, moves its holders to the chips mounted."""

    def __init__(self, pods: PodHolders, follow_mounted: Callable[[Holders], Holders] | None = None) -> None:
        self.pods = pods
        self.follow_mounted = follow_mounted
        self.handed_out = HandedOut()
        self.claimed: Callable[[], frozenset[str]] | None = None
        pods.on_answer = self._observe

    def allocated(self, resource: str, device_ids: Sequence[str]) -> None:
        """An Allocate handed ``device_ids`` over: held from now on; PodResources is asked again soon."""
        self.handed_out.record(resource, device_ids)
        self.pods.poke()

    def by_chip(self, holders: Holders | None = None) -> Holders:
        """PodResources' holders (the last answer by default) by the devices really handed over: with
        ``--volcano`` the chips mounted, not the kubelet's IDs (what Allocate recorded too)."""
        holders = self.pods.holders if holders is None else holders
        return self.follow_mounted(holders) if self.follow_mounted is not None else holders

    def held_devices(self) -> frozenset[str] | None:
        """The device IDs pods hold, as PodResources last said, what Allocate handed over that it has not
        shown freed yet, and what prepared claims hold; None while PodResources does not answer."""
        if self.pods.error is not None:
            return None
        listed = frozenset(device_id for _, device_id in self.by_chip().by_device)
        claimed = self.claimed() if self.claimed is not None else frozenset()
        return listed | self.handed_out.device_ids() | claimed

    def _observe(self, holders: Holders, asked_at: float) -> None:
        self.handed_out.observe(self.by_chip(holders).by_device.keys(), asked_at)
