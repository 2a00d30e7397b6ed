"""Chip health scripted through the fake backend's state file, one step at a time: each step also turns one
more marker chip Unhealthy for good (a marker turns once, so the flap hold never holds it), so the device list
that shows the step's marker is the one of that step::

    chips = ScriptedChips(kubelet, state, markers=(0, 2, 4, 5, 6, 7))  # chips 1 and 3 are scripted
    chips.script([3])  # the first device list in which chip 3 is Unhealthy (and marker 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tests.support.files import write_state
from tests.support.kubelet_standin import KubeletStandin, Update


class ScriptedChips:
    def __init__(self, kubelet: KubeletStandin, state: Path, markers: Sequence[int]) -> None:
        self.kubelet, self.state, self.seen = kubelet, state, 0
        self._unused = list(markers)
        self.markers: list[int] = []

    def script(self, unhealthy: list[int]) -> Update:
        """Make ``unhealthy`` (and the markers so far) Unhealthy; the device list of this step."""
        marker = self._unused.pop(0)
        self.markers.append(marker)
        write_state(self.state, {"unhealthy": [*unhealthy, *self.markers]})
        update = self.kubelet.wait_update(
            lambda u: u.health().get(f"Ascend910-{marker}") == "Unhealthy",
            after=self.seen,
            what=f"step {marker}",
        )
        self.seen = self.kubelet.updates.index(update) + 1
        return update
