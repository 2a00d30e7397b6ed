"""The client side's rate limit on the API server: a token bucket that holds ``burst`` tokens and gains
``rate`` a second; each request takes one, waiting (asleep, never blocking the event loop) while none is
left. Waiters are served in the order they came::

    bucket = TokenBucket(rate=5.0, burst=10)
    await bucket.take()          # at once while tokens are left, else after the wait for the next one

    >>> now = [0.0]
    >>> bucket = TokenBucket(rate=2.0, burst=3, clock=lambda: now[0])
    >>> [bucket.reserve() for _ in range(5)]   # three at once, then one every half second
    [0.0, 0.0, 0.0, 0.5, 1.0]
    >>> now[0] = 10.0                          # a quiet spell fills the bucket again, up to burst
    >>> [bucket.reserve() for _ in range(4)]
    [0.0, 0.0, 0.0, 0.5]
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio


class TokenBucket:
    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)  # below 0: that many are promised to callers still waiting
        self._at = clock()

    def reserve(self) -> float:
        """Take a token now: the seconds to wait before it may be used (0: at once)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def take(self) -> None:
        """Wait for a token. Cancelled while waiting, the token is given back."""
        delay = self.reserve()
        if delay <= 0:
            return
        try:
            await anyio.sleep(delay)
        except anyio.get_cancelled_exc_class():
            self._tokens += 1
            raise
