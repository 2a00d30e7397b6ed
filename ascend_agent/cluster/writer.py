"""Writing desired state to the API server without ever queueing: the newest state wins.

    labels = LatestWriter("node labels", apply=patch_labels)   # apply raises ApiUnavailable: retried
    tasks.start_soon(labels.run)
    labels.set({"huawei.com/npu.count": "8"})                  # called often: only the last is written

A failed write is retried with exponential back-off (0.5 s doubling, capped at 30 s) and full jitter (each
wait is drawn between 0.05 s and all of the current step), or after as long as the API server asked
(``Retry-After`` of a 429 or 503) when that is longer, always with the newest state at that moment; a success
resets the back-off. A state equal to the last one written is not written again, unless :meth:`refresh`
asks for it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio

from ascend_agent.backoff import Backoff, Refusal, wait_before_retry
from ascend_agent.cluster.client import ApiUnavailable

log = logging.getLogger("ascend_agent.cluster")

T = TypeVar("T")

FIRST_DELAY = 0.5
MAX_DELAY = 30.0

_UNSET = object()


def api_backoff(
    first: float = FIRST_DELAY, cap: float = MAX_DELAY, rng: Callable[[], float] = random.random
) -> Backoff:
    """The cluster side's back-off: 0.5 s doubling to 30 s, with full jitter (each wait drawn between a tenth
    of ``first`` and the step): thousands of agents that lost the API server together come back spread out.

    >>> b = api_backoff(first=1, cap=4, rng=lambda: 1.0)
    >>> [b.next() for _ in range(4)]
    [1.0, 2.0, 4.0, 4.0]
    >>> b = api_backoff(first=1, cap=4, rng=lambda: 0.5)
    >>> [b.next() for _ in range(4)]
    [0.5, 1.0, 2.0, 2.0]
    """
    return Backoff(first, cap, jitter=True, rng=rng)


class LatestWriter(Generic[T]):
    """Applies the newest state set, one write at a time, retrying with back-off until it is written."""

    def __init__(
        self, name: str, apply: Callable[[T], Awaitable[None]], backoff: Backoff | None = None
    ) -> None:
        self.name = name
        self._apply = apply
        self._backoff = backoff or api_backoff()
        self._desired: object = _UNSET
        self._written: object = _UNSET
        self._changed = anyio.Event()
        self.writes = 0
        self.failures = 0
        self._refreshes = 0

    def set(self, state: T) -> None:
        """Make ``state`` the one to write; it replaces any state not written yet. Never blocks."""
        self._desired = state
        self._changed.set()

    def refresh(self) -> None:
        """Write the desired state again even if it was written (a periodic rewrite, an object deleted)."""
        self._written = _UNSET
        self._refreshes += 1
        self._changed.set()

    @property
    def pending(self) -> bool:
        return self._desired is not _UNSET and self._desired != self._written

    async def run(self) -> None:
        """Write until cancelled."""
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            state = self._desired
            if state is _UNSET or state == self._written:
                continue
            refreshes = self._refreshes
            try:
                await self._apply(state)  # type: ignore[arg-type]
            except ApiUnavailable as exc:
                self.failures += 1
                await self._retry_later(exc)
            except Exception as exc:  # a bug in one feature must not end its writes for good
                self.failures += 1
                log.error("Writing %s failed (%s: %s); retrying", self.name, type(exc).__name__, exc)
                await self._retry_later(None)
            else:
                self.writes += 1
                # A refresh asked for while this write was under way asks for another one.
                self._written = state if refreshes == self._refreshes else _UNSET
                self._backoff.reset()

    async def _retry_later(self, failure: Refusal | None) -> None:
        await wait_before_retry(self._backoff, failure)
        self._changed.set()
