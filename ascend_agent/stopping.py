"""SIGTERM and SIGINT that come while the ``run`` command is still starting, before the agent's own signal
handling is in place: remembered, so that the agent stops at once and exits 0, as documented, instead of
dying by the signal::

    catch_early()                 # first thing in the run command
    ...
    if stop_requested(): ...      # once the agent's own handlers are in place
"""

from __future__ import annotations

import signal
from types import FrameType

_received: list[int] = []


def _remember(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)


def catch_early() -> None:
    """From now until the agent's own handlers replace it, SIGTERM and SIGINT are only remembered."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _remember)


def stop_requested() -> bool:
    """True when SIGTERM or SIGINT came before the agent's own handlers were in place."""
    return bool(_received)
