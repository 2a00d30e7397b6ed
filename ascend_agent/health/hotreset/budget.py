"""At most ``limit`` hot resets per chip within ``window`` seconds (Huawei: 3 per 6 h): a chip whose fault
comes back after each reset is left to a person instead of being reset for ever. With a ``path`` the resets
are kept in a file beside the agent's other state on the node, so a restarted agent does not start with a
full budget (the wall clock, which a restart keeps; written atomically after each reset, read bounded)::

    budget = ResetBudget(limit=3, window=6 * 3600, path=Path("/var/lib/kubelet/plugins/ascend-agent/x.json"))
    budget.load()           # the resets of the agent before, within the window (blocking: a worker thread)
    budget.allows(3)        # True until chip 3 was reset 3 times within the window
    budget.spend(3)
    budget.save()           # blocking too

>>> now = [0.0]
>>> budget = ResetBudget(limit=2, window=100, clock=lambda: now[0])
>>> budget.spend(1); budget.spend(1); budget.allows(1), budget.allows(2)
(False, True)
>>> now[0] = 101; budget.allows(1)
True
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ascend_agent.files import open_no_follow, replace_file

log = logging.getLogger(__name__)

# The file's name in the agent's own directory (``pluginDir``).
BUDGET_FILE = "hot-reset-budget.json"
# Bounds on what is kept and read back: chips, resets per chip, bytes.
MAX_CHIPS = 1024
MAX_RESETS_PER_CHIP = 64
MAX_FILE_BYTES = 256 * 1024


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
        self._problem = ""

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
    def load(self) -> None:
        """Take in the resets the file records within the window (with those of this process, if any). A
        missing file is an empty budget; one that cannot be read or makes no sense is one warning, and the
        budget starts from what this process spent."""
        if self.path is None:
            return
        try:
            recorded = _read(self.path)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            self._warn(f"cannot read the hot reset budget {self.path} ({exc}); counting from now")
            return
        now = self._clock()
        for phys_id, times in recorded.items():
            # A time ahead of now (the clock was set back) counts as now: it leaves no earlier than it would.
            kept = sorted(min(t, now) for t in times if t > now - self.window)
            merged = sorted([*kept, *self._spent.get(phys_id, ())])[-MAX_RESETS_PER_CHIP:]
            if merged:
                self._spent[phys_id] = deque(merged)
        used = {phys_id: len(self._recent(phys_id)) for phys_id in recorded}
        if any(used.values()):
            log.info(
                "Hot reset budget from %s: %s",
                self.path,
                ", ".join(f"chip {p} reset {n} times within {self.window:g} s" for p, n in used.items() if n),
            )

    def save(self) -> None:
        """Write the resets within the window (atomically: a reader sees the old file or the new one); a
        failure is one warning per change of its reason, and the budget stays in memory."""
        if self.path is None:
            return
        document = {
            "resets": {str(p): list(self._recent(p)) for p in sorted(self._spent) if self._recent(p)},
        }
        try:
            replace_file(self.path, json.dumps(document, separators=(",", ":")) + "\n")
        except OSError as exc:
            self._warn(
                f"cannot write the hot reset budget {self.path} ({exc.strerror or exc}); a restarted agent "
                "will not know the resets since"
            )
            return
        self._problem = ""

    def _warn(self, problem: str) -> None:
        if problem != self._problem:
            log.warning("%s", problem)
        self._problem = problem


def _read(path: Path) -> dict[int, list[float]]:
    """The file's resets by physical id; ValueError says what is wrong with it."""
    descriptor = open_no_follow(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ValueError("not a regular file")
        data = os.read(descriptor, MAX_FILE_BYTES + 1)
    finally:
        os.close(descriptor)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ValueError("not JSON") from None
    resets = document.get("resets") if isinstance(document, dict) else None
    if not isinstance(resets, dict) or len(resets) > MAX_CHIPS:
        raise ValueError('not {"resets": {"<physical id>": [<unix time>, ...]}}')
    recorded: dict[int, list[float]] = {}
    for key, times in resets.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 6):
            raise ValueError(f"{key!r:.20} is not a physical id")
        if not isinstance(times, list) or not all(_is_time(t) for t in times):
            raise ValueError(f"chip {key}: not a list of times")
        recorded[int(key)] = [float(t) for t in times[-MAX_RESETS_PER_CHIP:]]
    return recorded


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
