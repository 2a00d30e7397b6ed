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

from ascend_agent.config import Settings
from ascend_agent.kubelet.handed_out import HANDED_OUT_FILE, HandedOut, read_handed_out
from ascend_agent.kubelet.podresources import PodHolders
from ascend_agent.model import Holder, Holders


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
        # The last holders read through the map (PodResources' answer, the map's version, the two parts), and
        # the last result: each is made again only when what it is made of changed.
        self._through: tuple[Holders, HandedOut, int, Holders, Holders] | None = None
        self._joined: tuple[Holders, Holders, Holders] | None = None

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
        through = self._through
        if (
            through is None
            or through[0] is not holders
            or through[1] is not handed
            or through[2] != handed.version
        ):
            through = self._through = (holders, handed, handed.version, *handed.through(holders))
        on_devices, others = through[3], through[4]
        if self.follow_mounted is not None:
            others = self.follow_mounted(others)
        if not on_devices.by_device:
            return others
        joined = self._joined
        if joined is None or joined[0] is not on_devices or joined[1] is not others:
            joined = self._joined = (on_devices, others, _join(on_devices, others))
        return joined[2]

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
