"""Chips an admin takes out of service by hand (``ManuallySeparateNPU`` in the device-info ConfigMap): the
cluster side sets the list, the agent applies it to each discovery, so they turn Unhealthy the way a fault
does, with the reason ``separated by the ConfigMap``. The kubelet path only reads this in-memory set.

    >>> from ascend_agent.model import Chip
    >>> separation = ManualSeparation()
    >>> separation.update(frozenset({"Ascend910-1"}))
    True
    >>> chips = (Chip.make(0, "910B3"), Chip.make(1, "910B3"))
    >>> [chip.reason for chip in separation.apply(Inventory(chips)).chips]
    ['', 'separated by the ConfigMap']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ascend_agent.model import Health, Inventory

REASON = "separated by the ConfigMap"


class ManualSeparation:
    """The device IDs an admin separates; ``on_change`` runs (on the event loop) when the set changes."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self.ids: frozenset[str] = frozenset()
        self.on_change = on_change

    def update(self, ids: frozenset[str]) -> bool:
        """Take the admin's list as read; True (and ``on_change`` called) when it differs."""
        if ids == self.ids:
            return False
        self.ids = ids
        self.on_change()
        return True

    def apply(self, inventory: Inventory) -> Inventory:
        """``inventory`` with the separated chips Unhealthy; a chip Unhealthy already keeps its own reason
        and gains this one."""
        if not self.ids or not any(chip.device_id in self.ids for chip in inventory.chips):
            return inventory
        chips = tuple(
            chip
            if chip.device_id not in self.ids
            else chip.with_health(Health.UNHEALTHY, f"{chip.reason}; {REASON}" if chip.reason else REASON)
            for chip in inventory.chips
        )
        return replace(inventory, chips=chips)
