"""At most ``limit`` hot resets per chip within ``window`` seconds (Huawei: 3 per 6 h): a chip whose fault
comes back after each reset is left to a person instead of being reset for ever. With a ``path`` the resets
are kept in a file beside the agent's other state on the node, so a restarted agent does not start with a
full budget (the wall clock, which a restart keeps; written atomically after each reset, read bounded)::

    budget = ResetBudget(limit=3, window=6 * 3600, path=Path("/var/lib/kubelet/plugins/ascend-agent/x.json"))
    await budget.load()     # the resets the file records within the window, with this process's
    budget.allows(3)        # True until chip 3 was reset 3 times within the window
    budget.spend(3)
    await budget.save()     # merged with what the file holds now

Two instances of the agent may write the file at once: a DRA driver's rolling update runs the new pod beside
the old one, with no instance lock between them. Each save therefore reads the file under a lock beside it
(``hot-reset-budget.json.lock``), keeps every reset either instance recorded, and writes the union; each load
takes in the other's resets too, so a chip's budget counts the resets of both pods.

>>> now = [0.0]
>>> budget = ResetBudget(limit=2, window=100, clock=lambda: now[0])
>>> budget.spend(1); budget.spend(1); budget.allows(1), budget.allows(2)
(False, True)
>>> now[0] = 101; budget.allows(1)
True
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import anyio

from ascend_agent.state_file import StateFile

log = logging.getLogger(__name__)

# The file's name in the agent's own directory (``pluginDir``).
BUDGET_FILE = "hot-reset-budget.json"
VERSION = 1
_KEY = "chips"
# Bounds on what is kept and read back: chips, resets per chip, bytes.
MAX_CHIPS = 1024
MAX_RESETS_PER_CHIP = 64
MAX_FILE_BYTES = 256 * 1024
# The longest a read or write of the file is waited for (a hung filesystem): the reset goes on without it.
FILE_TIMEOUT = 10.0
# The largest physical id a chip has, far above any node's.
_MAX_PHYS_ID = 999_999

Recorded = dict[int, list[float]]  # physical id -> the times of its resets


class ResetBudget:
    """Each chip's resets (tries, failed ones too) within the sliding window; ``configure`` keeps them.
    ``clock`` is the wall clock (seconds since the epoch), which a restart keeps."""

    def __init__(
        self,
        limit: int,
        window: float,
        clock: Callable[[], float] = time.time,
        path: Path | None = None,
    ) -> None:
        self.limit = limit
        self.window = window
        self.path = path
        self._clock = clock
        self._spent: dict[int, deque[float]] = {}
        lost = "a restarted agent will not know the resets since"
        self._file = None if path is None else StateFile(path, MAX_FILE_BYTES, "a hot reset budget", lost)

    def configure(self, limit: int, window: float) -> None:
        self.limit, self.window = limit, window

    def allows(self, phys_id: int) -> bool:
        return len(self._recent(phys_id)) < self.limit

    def spend(self, phys_id: int) -> None:
        recent = self._recent(phys_id)
        recent.append(self._clock())
        while len(recent) > MAX_RESETS_PER_CHIP:
            recent.popleft()

    def used(self, phys_id: int) -> int:
        return len(self._recent(phys_id))

    def _recent(self, phys_id: int) -> deque[float]:
        spent = self._spent.setdefault(phys_id, deque())
        while spent and spent[0] <= self._clock() - self.window:
            spent.popleft()
        return spent

    # the file -------------------------------------------------------------------------------------------
    async def load(self) -> None:
        """Take in the resets the file records within the window (with those of this process: another
        instance's since are counted too). A missing file is an empty budget; one that cannot be read or
        makes no sense is one warning, and the budget counts from what this process spent."""
        if self._file is None:
            return
        recorded: list[tuple[int, list[float]]] = []
        with anyio.move_on_after(FILE_TIMEOUT) as reading:
            recorded = await self._file.read(_KEY, (VERSION,), _chip, "counting the resets from now")
        if reading.cancelled_caught:
            log.warning("Cannot read %s within %g s; counting the resets from now", self.path, FILE_TIMEOUT)
        before = {phys_id: len(self._recent(phys_id)) for phys_id, _ in recorded}
        self._take_in(recorded)
        added = {phys_id: self.used(phys_id) - before[phys_id] for phys_id, _ in recorded}
        if any(added.values()):
            log.info(
                "Hot reset budget from %s: %s",
                self.path,
                ", ".join(
                    f"chip {p} reset {n} times within {self.window:g} s" for p, n in added.items() if n
                ),
            )

    async def save(self) -> None:
        """Write the resets within the window, with those the file holds now (another instance's), which are
        taken in too; atomically (a reader sees the old file or the new one). A failure is one warning per
        change of its reason, and the budget stays in memory."""
        if self._file is None:
            return
        now = self._clock()
        mine = {phys_id: list(self._recent(phys_id)) for phys_id in sorted(self._spent)}
        merged = functools.partial(_merged_text, mine, now - self.window, now)
        recorded: list[tuple[int, list[float]]] = []
        with anyio.move_on_after(FILE_TIMEOUT) as writing:
            recorded, _ = await self._file.update(_KEY, (VERSION,), _chip, merged)
        if writing.cancelled_caught:
            log.warning(
                "Cannot write %s within %g s; it is written at the next reset", self.path, FILE_TIMEOUT
            )
        self._take_in(recorded)

    def _take_in(self, recorded: Iterable[tuple[int, list[float]]]) -> None:
        """The resets of ``recorded`` within the window added to each chip's (a time ahead of now, the clock
        set back since, counts as now: it leaves no later than a reset made now)."""
        now = self._clock()
        merged = _union(
            {phys_id: list(spent) for phys_id, spent in self._spent.items()}, recorded, now - self.window, now
        )
        for phys_id, times in merged.items():
            self._spent[phys_id] = deque(times)


def _merged_text(mine: Recorded, since: float, now: float, recorded: list[tuple[int, list[float]]]) -> str:
    """The file's text: ``mine`` and ``recorded`` (the file's), each chip's resets after ``since``."""
    merged = _union(mine, recorded, since, now)
    chips = [{"physId": phys_id, "resets": times} for phys_id, times in sorted(merged.items()) if times]
    return json.dumps({"version": VERSION, _KEY: chips[-MAX_CHIPS:]}, separators=(",", ":")) + "\n"


def _union(
    first: Mapping[int, list[float]], second: Iterable[tuple[int, list[float]]], since: float, now: float
) -> Recorded:
    """Each chip's resets in either, a reset both hold once (each instance reads what the other wrote: the
    larger count of each time), after ``since``, a time ahead of ``now`` taken as ``now``; the latest
    ``MAX_RESETS_PER_CHIP``."""
    times: dict[int, Counter[float]] = {phys_id: Counter(spent) for phys_id, spent in first.items()}
    for phys_id, spent in second:
        times[phys_id] = times.get(phys_id, Counter()) | Counter(spent)
    return {
        phys_id: sorted(min(t, now) for t in spent.elements() if min(t, now) > since)[-MAX_RESETS_PER_CHIP:]
        for phys_id, spent in times.items()
    }


def _chip(entry: object) -> tuple[int, list[float]]:
    """One chip of the file: ``{"physId": 5, "resets": [<unix time>, ...]}``."""
    if not isinstance(entry, dict):
        raise TypeError("a chip is not an object")
    phys_id, times = entry["physId"], entry["resets"]
    if not (isinstance(phys_id, int) and not isinstance(phys_id, bool) and 0 <= phys_id <= _MAX_PHYS_ID):
        raise ValueError(f"{str(phys_id)[:20]!r} is not a physical id")
    if not isinstance(times, list) or not all(_is_time(t) for t in times):
        raise ValueError(f"chip {phys_id}: resets is not a list of times")
    return phys_id, [float(t) for t in times[-MAX_RESETS_PER_CHIP:]]


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
