"""The health the kubelet is told of each chip, from what the backend discovered, in this order: the fault
table grades each chip's codes (:mod:`.grading`), the hot reset sees each chip's own health
(:mod:`.hotreset`), the flap hold (:mod:`.flaphold`), the admin's separation (:mod:`.separation`), the reset
group under reset; the vNPUs of a chip follow it::

    health = HealthPipeline(settings, grading=grading, separation=separation, make_resets=make_resets,
                            wake=agent.wake)
    inventory = health.apply(await backend.discover())
    health.configure(reloaded)       # a config reload: the flap hold, the hot reset, faultPolicy
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ascend_agent.config import HOT_RESET_OFF, Settings
from ascend_agent.health.flaphold import ChipHold
from ascend_agent.health.grading import FaultGrading
from ascend_agent.health.separation import ManualSeparation
from ascend_agent.model import Chip, Health, Inventory

if TYPE_CHECKING:
    from ascend_agent.health.hotreset.manager import HotReset


class HealthPipeline:
    """The stages the agent keeps for its lifetime (a backend made anew by a config reload keeps the chips
    held and their history); ``wake`` runs when the admin's separation or the fault table changes.
    ``make_resets(settings)`` makes the hot reset the first time ``hotReset`` is on, at start or at a
    reload; it then stays (a reload that turns it off keeps the budget spent). Without it there is none."""

    def __init__(
        self,
        settings: Settings,
        *,
        grading: FaultGrading | None = None,
        separation: ManualSeparation | None = None,
        make_resets: Callable[[Settings], HotReset] | None = None,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        # The fault table grading each chip's codes: built in, or the cluster side's mindx-dl-fault-config.
        self.grading = grading or FaultGrading.builtin(settings.fault_policy)
        self.grading.on_change = wake
        # Chips an admin separates in the device-info ConfigMap: the cluster side sets them, Unhealthy here.
        self.separation = separation or ManualSeparation()
        self.separation.on_change = wake
        self._make_resets = make_resets
        self.resets: HotReset | None = None
        self._resets_if_on(settings)
        self.hold = ChipHold(settings.flap_threshold, settings.flap_window, settings.flap_quiet)

    def apply(self, discovered: Inventory) -> Inventory:
        """``discovered`` as the kubelet is to see it."""
        inventory = self.grading.apply(discovered)
        if self.resets is not None:
            self.resets.observe(inventory, self.separation.ids)
        inventory = replace(inventory, chips=self.hold.apply(inventory.chips))
        # The admin's separation over the chips' own health, the flap hold included.
        inventory = self.separation.apply(inventory)
        if self.resets is not None:
            inventory = self.resets.apply(inventory)
        return replace(inventory, vnpus=follow_chips(inventory.chips, inventory.vnpus))

    def configure(self, settings: Settings) -> HotReset | None:
        """The settings of a config reload; what each stage saw so far is kept. The hot reset when this
        reload made it (``hotReset`` turned on): its task is the caller's to start."""
        self.hold.configure(settings.flap_threshold, settings.flap_window, settings.flap_quiet)
        self.grading.configure(dict(settings.fault_policy))
        if self.resets is not None:
            self.resets.configure(settings)
            return None
        return self._resets_if_on(settings)

    def _resets_if_on(self, settings: Settings) -> HotReset | None:
        if self._make_resets is not None and settings.hot_reset != HOT_RESET_OFF:
            self.resets = self._make_resets(settings)
        return self.resets


def follow_chips(chips: Sequence[Chip], parts: Sequence[Chip]) -> tuple[Chip, ...]:
    """The vNPUs of a chip the agent itself made Unhealthy (the flap hold, the admin's separation) are
    Unhealthy with it, held when it is held; they carry its fault class."""
    by_phys = {chip.phys_id: chip for chip in chips}
    followed = []
    for part in parts:
        chip = by_phys.get(part.phys_id)
        if chip is not None and part.fault_class != chip.fault_class:
            part = replace(part, fault_class=chip.fault_class)
        if chip is not None and chip.held:
            part = replace(part, held=True).with_health(Health.UNHEALTHY, chip.reason)
        elif chip is not None and not chip.healthy and part.healthy:
            part = part.with_health(Health.UNHEALTHY, chip.reason)
        followed.append(part)
    return tuple(followed)
