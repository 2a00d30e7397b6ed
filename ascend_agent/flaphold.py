"""No flapping: a chip that turned Unhealthy ``threshold`` times within ``window`` seconds is held Unhealthy
until it has stayed Healthy for ``quiet`` seconds. A chip that recovers once comes back at once.

Pure bookkeeping over a clock that the caller passes in; the caller observes each chip's own health as often
as it likes (observing the same state again changes nothing) and logs the events::

    hold = FlapHold(threshold=3, window=600, quiet=600)
    step = hold.observe("Ascend910-3", healthy=False)
    step.held, step.event            # (False, None) on the first fault
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


class HoldEvent(enum.StrEnum):
    STARTED = "started"
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class HoldStep:
    """What one observation found: whether the chip is held now, and whether a hold started or ended."""

    held: bool
    event: HoldEvent | None = None


@dataclass
class _Track:
    turns: deque[float] = field(default_factory=deque)  # when it turned Unhealthy, within the window
    healthy: bool | None = None
    held: bool = False
    healthy_since: float | None = None


class FlapHold:
    """Per-device flap detection; ``threshold`` 0 turns holding off.

    >>> now = [0.0]
    >>> hold = FlapHold(threshold=2, window=60, quiet=30, clock=lambda: now[0])
    >>> [hold.observe("a", healthy).held for healthy in (False, True, False)]
    [False, False, True]
    >>> now[0] = 10; hold.observe("a", True).held
    True
    >>> now[0] = 40; hold.observe("a", True)
    HoldStep(held=False, event=<HoldEvent.ENDED: 'ended'>)
    """

    def __init__(
        self, threshold: int, window: float, quiet: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold = threshold
        self.window = window
        self.quiet = quiet
        self._clock = clock
        self._tracks: dict[str, _Track] = {}

    def observe(self, device: str, healthy: bool) -> HoldStep:
        """Record the chip's own health now; the answer says whether to report it held Unhealthy."""
        if self.threshold <= 0:
            return HoldStep(held=False)
        now = self._clock()
        track = self._tracks.setdefault(device, _Track())
        if not healthy and track.healthy is not False:
            track.turns.append(now)
        track.healthy = healthy
        while track.turns and track.turns[0] < now - self.window:
            track.turns.popleft()
        if not track.held:
            if not healthy and len(track.turns) >= self.threshold:
                track.held, track.healthy_since = True, None
                return HoldStep(held=True, event=HoldEvent.STARTED)
            return HoldStep(held=False)
        if not healthy:
            track.healthy_since = None
            return HoldStep(held=True)
        if track.healthy_since is None:
            track.healthy_since = now
        if now - track.healthy_since >= self.quiet:
            track.held, track.healthy_since = False, None
            track.turns.clear()
            return HoldStep(held=False, event=HoldEvent.ENDED)
        return HoldStep(held=True)

    def release_due(self) -> bool:
        """True when a held chip has been Healthy for the quiet period: observing it now ends its hold."""
        now = self._clock()
        return any(
            track.held and track.healthy_since is not None and now - track.healthy_since >= self.quiet
            for track in self._tracks.values()
        )

    def reason(self) -> str:
        """Why a held chip is Unhealthy, for ``list`` and the logs."""
        return (
            f"held Unhealthy: it turned Unhealthy {self.threshold} times within {self.window:g} s; "
            f"it comes back once Healthy for {self.quiet:g} s"
        )
