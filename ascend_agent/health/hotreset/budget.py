"""At most ``limit`` hot resets per chip within ``window`` seconds (Huawei: 3 per 6 h): a chip whose fault
comes back after each reset is left to a person instead of being reset for ever::

    budget = ResetBudget(limit=3, window=6 * 3600)
    budget.allows(3)        # True until chip 3 was reset 3 times within the window
    budget.spend(3)

>>> now = [0.0]
>>> budget = ResetBudget(limit=2, window=100, clock=lambda: now[0])
>>> budget.spend(1); budget.spend(1); budget.allows(1), budget.allows(2)
(False, True)
>>> now[0] = 101; budget.allows(1)
True
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class ResetBudget:
    """Each chip's resets (tries, failed ones too) within the sliding window; ``configure`` keeps them."""

    def __init__(self, limit: int, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._spent: dict[int, deque[float]] = {}

    def configure(self, limit: int, window: float) -> None:
        self.limit, self.window = limit, window

    def allows(self, phys_id: int) -> bool:
        return len(self._recent(phys_id)) < self.limit

    def spend(self, phys_id: int) -> None:
        self._recent(phys_id).append(self._clock())

    def used(self, phys_id: int) -> int:
        return len(self._recent(phys_id))

    def _recent(self, phys_id: int) -> deque[float]:
        spent = self._spent.setdefault(phys_id, deque())
        while spent and spent[0] <= self._clock() - self.window:
            spent.popleft()
        return spent
