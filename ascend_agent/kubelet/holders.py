"""Which pod holds which chip, as the agent knows it: the kubelet's PodResources view (by the kubelet's IDs),
read through what each Allocate handed over for those IDs (``--volcano`` hands over Volcano's choice, not the
kubelet's IDs), and what Allocate handed over that PodResources has not shown yet (the vNPU layout must not
destroy it)::

    holdings = Holdings(PodHolders(socket, interval), follow_mounted=None)
    holdings.allocated("huawei.com/Ascend910", [("Ascend910-0", "Ascend910-3")])   # the plugins' on_allocated
    holdings.by_chip()          # Holders by the devices really handed over (the metrics' pod labels)
    holdings.held_devices()     # frozenset of device IDs held now; None while PodResources does not answer

As a DRA driver, ``claimed`` gives the device IDs its prepared claims hold (PodResources names claims' devices
by their DRA names, and lists a pod only once it runs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ascend_agent.config import Settings
from ascend_agent.kubelet.handed_out import HANDED_OUT_FILE, HandedOut, read_handed_out
from ascend_agent.kubelet.podresources import PodHolders
from ascend_agent.model import Holder, Holders


@dataclass(slots=True)
class _ByChip:
    """One :meth:`Holdings.by_chip` and what it was made of: PodResources' answer and the map's version it
    was read through, the holders moved by the map (``on_devices``) and the rest (``others``), then the rest
    as ``follow_mounted`` gave it back and the result. ``follow_mounted`` returns the object it returned
    before while nothing it reads changed, so an unchanged node makes nothing again."""

    holders: Holders
    handed: HandedOut
    version: int
    on_devices: Holders
    others: Holders
    followed: Holders | None = None
    result: Holders = field(default_factory=Holders)

    def made_of(self, holders: Holders, handed: HandedOut) -> bool:
        return self.holders is holders and self.handed is handed and self.version == handed.version


class Holdings:
    """``pods`` is the PodResources poller (its :meth:`~PodHolders.run` is the caller's task);
    ``follow_mounted``, with ``--volcano``, moves the holders of the kubelet's IDs no Allocate of this agent
    (or of an earlier one, from its file) answered to the chips the pods' marks name."""

    def __init__(self, pods: PodHolders, follow_mounted: Callable[[Holders], Holders] | None = None) -> None:
        self.pods = pods
        self.follow_mounted = follow_mounted
        self.handed_out = HandedOut()
        self.claimed: Callable[[], frozenset[str]] | None = None
        pods.on_answer = self._observe
        self._last: _ByChip | None = None  # the last by_chip, made again only when what it reads changed

    def allocated(self, resource: str, pairs: Iterable[tuple[str, str]]) -> None:
        """An Allocate handed over, for each of the kubelet's IDs, a device ((kubelet ID, device) ``pairs``):
        held from now on; PodResources is asked again soon."""
        self.handed_out.record(resource, pairs)
        self.pods.poke()

    def by_chip(self, holders: Holders | None = None) -> Holders:
        """PodResources' holders (the last answer by default) by the devices really handed over: for each of
        the kubelet's IDs, the device an Allocate handed over for it; with ``--volcano``, for an ID no
        Allocate on record answered, the chip the pod's marks name."""
        holders = self.pods.holders if holders is None else holders
        handed = self.handed_out
        last = self._last
        if last is None or not last.made_of(holders, handed):
            last = self._last = _ByChip(holders, handed, handed.version, *handed.through(holders))
        others = last.others if self.follow_mounted is None else self.follow_mounted(last.others)
        if last.followed is not others:
            last.followed = others
            last.result = _join(last.on_devices, others) if last.on_devices.by_device else others
        return last.result

    def held_devices(self) -> frozenset[str] | None:
        """The device IDs pods hold, as PodResources last said, what Allocate handed over that it has not
        shown freed yet, and what prepared claims hold; None while PodResources does not answer."""
        if self.pods.error is not None:
            return None
        listed = frozenset(device_id for _, device_id in self.by_chip().by_device)
        claimed = self.claimed() if self.claimed is not None else frozenset()
        return listed | self.handed_out.device_ids() | claimed

    def _observe(self, holders: Holders, asked_at: float) -> None:
        self.handed_out.observe(holders.by_device.keys(), asked_at)


async def by_chip_once(settings: Settings, holders: Holders, timeout: float) -> tuple[Holders, str]:
    """:meth:`Holdings.by_chip` once, for ``list`` and the doctor: ``holders`` read through the running (or
    last) agent's file of what it handed out, and with ``--volcano`` the rest moved by the pods' marks (the
    node's pods read once, each request bounded by ``timeout``); and why the marks could not be read."""
    on_devices, others = read_handed_out(settings.effective_plugin_dir / HANDED_OUT_FILE).through(holders)
    problem = ""
    if settings.volcano:
        from ascend_agent.cluster import on_mounted_chips

        others, problem = await on_mounted_chips(settings, others, timeout)
    return (_join(on_devices, others) if on_devices.by_device else others), problem


def _join(first: Holders, second: Holders) -> Holders:
    """The holders of both, per device (the claims' from ``second``)."""
    by_device: dict[tuple[str, str], set[Holder]] = {
        key: set(found) for key, found in first.by_device.items()
    }
    for key, found in second.by_device.items():
        by_device.setdefault(key, set()).update(found)
    return Holders({key: tuple(sorted(found)) for key, found in by_device.items()}, second.by_claimed)
