"""A clock for code that takes one (``clock: Callable[[], float]``): it stands still until a test moves it.

clock = ManualClock()
hold = FlapHold(..., clock=clock)
clock.now += 600      # ten minutes pass at once
"""

from __future__ import annotations


class ManualClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
