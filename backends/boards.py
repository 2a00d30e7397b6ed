"""Each card's firmware version and serial number, from ``npu-smi info -t board -i <npu id>``, read once per
card, one card a health query, for ``ascend_agent_chip_info``::

    boards = CardBoards(settings)
    await boards.read_next(executable, {0, 1})   # after a good health query: the next card not read yet
    boards.of(0)             # BoardFacts(firmware_version='7.8.0.6.201', serial='1025C9048791')
"""

from __future__ import annotations

import logging
import time
from collections.abc import Set
from dataclasses import dataclass

from ascend_agent.backends.npusmi import NpuSmiError, NpuSmiParseError, parse_key_values
from ascend_agent.backends.tool import run_npu_smi
from ascend_agent.config import Settings
from ascend_agent.observability import log_fields

log = logging.getLogger(__name__)

# A card whose board record could not be read (npu-smi busy or slow at the start) is asked again this late.
RETRY_AFTER = 600
# npu-smi prints NA for what a board does not say.
_UNSAID = frozenset({"", "NA", "N/A", "-"})


@dataclass(frozen=True, slots=True)
class BoardFacts:
    """What a card's board record says; None where it says nothing (or was not read)."""

    firmware_version: str | None = None
    serial: str | None = None


UNREAD = BoardFacts()


def board_facts(record: dict[str, str]) -> BoardFacts:
    """The firmware version and serial number of a board record (``parse_key_values``).

    >>> board_facts({"Serial Number": "1025C9048791", "Firmware Version": "7.8.0.6.201"})
    BoardFacts(firmware_version='7.8.0.6.201', serial='1025C9048791')
    >>> board_facts({"Serial Number": "NA"})
    BoardFacts(firmware_version=None, serial=None)
    """

    def said(key: str) -> str | None:
        value = record.get(key, "").strip()
        return None if value in _UNSAID else value

    return BoardFacts(firmware_version=said("Firmware Version"), serial=said("Serial Number"))


class CardBoards:
    """The board facts of the cards seen, one card read per health query until each is known; a card whose
    record could not be read is asked again :data:`RETRY_AFTER` s later (said once)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._facts: dict[int, BoardFacts] = {}
        self._failed_at: dict[int, float] = {}

    def of(self, npu_id: int) -> BoardFacts:
        return self._facts.get(npu_id, UNREAD)

    async def read_next(self, executable: str, npu_ids: Set[int]) -> None:
        """Read the board record of the first card of ``npu_ids`` not known yet (none when all are), bounded
        by the npu-smi timeout."""
        now = time.monotonic()
        unread = sorted(
            npu_id
            for npu_id in set(npu_ids) - set(self._facts)
            if now - self._failed_at.get(npu_id, -RETRY_AFTER) >= RETRY_AFTER
        )
        if not unread:
            return
        npu_id = unread[0]
        args = ["info", "-t", "board", "-i", str(npu_id)]
        try:
            record = parse_key_values(await run_npu_smi(executable, args, self._settings.npu_smi_timeout))
        except (NpuSmiError, NpuSmiParseError, OSError) as exc:  # OSError: out of descriptors
            if npu_id not in self._failed_at:
                log.info(
                    "npu-smi %s gave no board record (%s): card %d's firmware version and serial number are "
                    "left out of ascend_agent_chip_info (asked again every %d s)",
                    " ".join(args),
                    exc,
                    npu_id,
                    RETRY_AFTER,
                    extra=log_fields(ids=[npu_id], reason=str(exc)),
                )
            self._failed_at[npu_id] = time.monotonic()
            return
        self._facts[npu_id] = board_facts(record)
