"""SIGTERM and SIGINT that come while the ``run`` command is still starting, before the agent's own signal
handling is in place: remembered, so that the agent stops at once and exits 0, as documented, instead of
dying by the signal. Once it is stopping, they are ignored::

    catch_early()                 # first thing in the entry point (__main__), before the heavy imports
    ...
    if stop_requested(): ...      # once the agent's own handlers are in place
    ...
    ignore_while_stopping()       # once they are gone again
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


def ignore_while_stopping() -> None:
    """The agent is stopping: SIGTERM and SIGINT are ignored until the process exits, so that a second one (a
    script's clean-up after the terminal's Ctrl-C) cannot cut the removal of the sockets short. Ignored, not
    remembered: the interpreter resets the handlers it installed as it exits, and a signal then would kill."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
