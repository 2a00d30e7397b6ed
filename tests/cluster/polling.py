"""Waiting on what the real API server, the kubelet and the agent show where nothing sends an event: read
again every half second until it is ready or the time is up::

    slices = poll(lambda: node_slices(cluster), bool)           # the last read; the caller asserts on it
    entry = until(read_status, has_ready, "the claim's status")  # AssertionError with the last read
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
EVERY = 0.5


def poll(read: Callable[[], T], ready: Callable[[T], object], timeout: float = 60) -> T:
    """``read()`` until ``ready`` of it is true or ``timeout`` seconds have passed: the last value read."""
    deadline = time.monotonic() + timeout
    found = read()
    while not ready(found) and time.monotonic() < deadline:
        time.sleep(EVERY)
        found = read()
    return found


def until(read: Callable[[], T], ready: Callable[[T], object], what: str, timeout: float = 60) -> T:
    """:func:`poll`, failing with ``what`` and the last value read when it never became ready."""
    found = poll(read, ready, timeout)
    if not ready(found):
        raise AssertionError(f"{what} not within {timeout:g} s; last seen: {str(found)[:3000]}")
    return found
