"""The process table ``npu-smi info`` prints after its chips: which chips run processes, for the hot reset's
idle check (a chip is idle only where the table says so)::

    processes = parse_processes(text)
    processes.count(npu_id=0, chip=0)     # 1; 0 where its NPU runs none; None where the table does not say
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_PROCESS_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s*\|\s*(\d+)\s*\|")
_NO_PROCESS = re.compile(r"No\s+running\s+processes\s+found\s+in\s+NPU\s+(\d+)", re.IGNORECASE)
_HEADER = re.compile(r"^\s*\|.*Process\s+id")


@dataclass(frozen=True, slots=True)
class Processes:
    """The process table of ``npu-smi info``: processes per (NPU id, chip), and the NPU ids it says run
    none. ``listed`` is False when the output has no process table at all."""

    per_chip: Mapping[tuple[int, int], int] = field(default_factory=dict)
    idle_npus: frozenset[int] = frozenset()
    listed: bool = False

    def count(self, npu_id: int, chip: int) -> int | None:
        """How many processes run on the chip; 0 only where the table says its NPU runs none; None where
        the table does not say (a cut table, no table)."""
        found = self.per_chip.get((npu_id, chip))
        if found is not None:
            return found
        return 0 if npu_id in self.idle_npus else None


def parse_processes(text: str) -> Processes:
    """The process table after the chips of ``npu-smi info``; empty (``listed`` False) when there is none.

    >>> table = parse_processes(open("tests/fixtures/npu-smi/910B3x8-26.1.0-info-with-process.txt").read())
    >>> table.count(0, 0), table.count(1, 0), table.count(9, 0)
    (1, 0, None)
    """
    lines = text.splitlines()
    headers = (i for i, line in enumerate(lines) if _HEADER.match(line))
    start = next(headers, None)
    if start is None:
        return Processes()
    per_chip: dict[tuple[int, int], int] = {}
    idle: set[int] = set()
    for line in lines[start + 1 :]:
        row = _PROCESS_ROW.match(line.strip())
        if row is not None:
            key = (int(row.group(1)), int(row.group(2)))
            per_chip[key] = per_chip.get(key, 0) + 1
            continue
        none = _NO_PROCESS.search(line)
        if none is not None:
            idle.add(int(none.group(1)))
    busy_npus = {npu for npu, _ in per_chip}
    return Processes(per_chip, frozenset(idle - busy_npus), listed=True)
