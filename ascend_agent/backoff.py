"""Exponential back-off, for every retry the agent makes: each wait doubles up to a cap, optionally with
full jitter (drawn between a tenth of ``first`` and all of the current step, so that agents that failed
together do not come back together), and a success starts it over::

    backoff = Backoff(first=0.1, cap=5.0, jitter=False)
    await anyio.sleep(backoff.next())   # 0.1, 0.2, 0.4 ... 5.0, 5.0
    backoff.reset()                     # after a success
    await wait_before_retry(backoff, exc)   # as long as the API server asked (Retry-After), if longer

    >>> b = Backoff(first=1, cap=4, jitter=False)
    >>> [b.next() for _ in range(4)]
    [1, 2, 4, 4]
    >>> b.next(at_least=10)
    10
    >>> Backoff(first=1, cap=4, rng=lambda: 0.0).next()   # never 0: a tight loop is never made
    0.1
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

import anyio

# The shortest jittered wait, as a share of ``first``.
_FLOOR = 0.1


class Refusal(Protocol):
    """A failure that says how long the server asked the client to wait (0: it asked nothing)."""

    @property
    def retry_after(self) -> float: ...


class Backoff:
    def __init__(
        self, first: float, cap: float, jitter: bool = True, rng: Callable[[], float] = random.random
    ) -> None:
        self.first, self.cap, self._jitter, self._rng = first, cap, jitter, rng
        self._step = first

    def next(self, at_least: float = 0) -> float:
        """The wait before the next attempt; ``at_least`` when that is longer."""
        step = self._step
        self._step = min(self.cap, step * 2)
        wait = max(self.first * _FLOOR, self._rng() * step) if self._jitter else step
        return max(wait, at_least)

    def reset(self) -> None:
        self._step = self.first


async def wait_before_retry(backoff: Backoff, failure: Refusal | None = None) -> None:
    """Sleep the back-off's next wait, or as long as ``failure`` says the server asked when that is longer."""
    await anyio.sleep(backoff.next(failure.retry_after if failure is not None else 0))
