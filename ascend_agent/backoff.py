"""Exponential back-off, for every retry the agent makes: each wait doubles up to a cap, optionally with
jitter (drawn between half and all of the current step), and a success starts it over::

    backoff = Backoff(first=0.1, cap=5.0, jitter=False)
    await anyio.sleep(backoff.next())   # 0.1, 0.2, 0.4 ... 5.0, 5.0
    backoff.reset()                     # after a success

    >>> b = Backoff(first=1, cap=4, jitter=False)
    >>> [b.next() for _ in range(4)]
    [1, 2, 4, 4]
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    def __init__(
        self, first: float, cap: float, jitter: bool = True, rng: Callable[[], float] = random.random
    ) -> None:
        self.first, self.cap, self._jitter, self._rng = first, cap, jitter, rng
        self._step = first

    def next(self) -> float:
        """The wait before the next attempt."""
        step = self._step
        self._step = min(self.cap, step * 2)
        return step / 2 + self._rng() * step / 2 if self._jitter else step

    def reset(self) -> None:
        self._step = self.first
