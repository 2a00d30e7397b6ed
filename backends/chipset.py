"""What the devfs backend learns once per chip set (the chips npu-smi lists, not every health query):
``npu-smi info -m`` where the table's names are redacted or its ids are not the physical ids (Ascend 950), or
the hot reset needs the logic ids; ``info -t board`` of one A3 die for the SoC, and with the hot reset on a
910B's board id (a board without HCCS resets its chips alone)::

    chip_set = ChipSet(settings)
    await chip_set.learn(executable, table)      # asks again only when the chip set changed
    chip_set.chip_map, chip_set.a3_model, chip_set.logic_ids, chip_set.board_id
"""

from __future__ import annotations

import logging

from ascend_agent.backends.npusmi import (
    ChipRow,
    InfoTable,
    MapRow,
    NpuSmiError,
    NpuSmiParseError,
    Shape,
    a3_dies,
    board_model,
    parse_info_map,
    parse_key_values,
)
from ascend_agent.backends.tool import run_npu_smi
from ascend_agent.config import HOT_RESET_OFF, Settings
from ascend_agent.model import Generation, UnknownModelError, classify, normalise_model
from ascend_agent.observability import log_fields

log = logging.getLogger("ascend_agent.backends.devfs")

# The model of an A3 die when `npu-smi info -t board` does not name its SoC.
A3_MODEL = "910_93"


class ChipSet:
    """The chip set's facts, kept until npu-smi lists another set of chips."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._set: tuple[tuple[int, int, str], ...] = ()
        self.chip_map: tuple[MapRow, ...] = ()
        self.a3_model = A3_MODEL
        # With the hot reset on: the logic ids (`info -m`) for ResetInfo, and a 910B's board id, which
        # tells a board without HCCS (its chips reset alone).
        self.logic_ids: dict[tuple[int, int], int] = {}
        self.board_id: int | None = None

    async def learn(self, executable: str, table: InfoTable) -> None:
        """Once per chip set (not every health query): ``npu-smi info -m`` where the table's names are
        redacted or its ids are not the physical ids (Ascend 950), and ``info -t board`` of one A3 die for
        the SoC."""
        chip_set = tuple((row.npu_id, row.chip, row.name) for row in table.chips)
        if chip_set == self._set:
            return
        self._set = chip_set
        self.chip_map = ()
        redacted = any(not known_model(row.name) for row in table.chips)
        resetting = self._settings.hot_reset != HOT_RESET_OFF
        if table.shape is Shape.NPU_ID or redacted or resetting:
            self.chip_map = await self._info_map(executable)
            if redacted and not self.chip_map:
                self._set = ()  # the names are needed: ask again next query
        self.logic_ids = {
            (row.npu_id, row.chip_id): row.logic_id for row in self.chip_map if row.logic_id is not None
        }
        dies = sorted(a3_dies(table))
        self.a3_model = await self._board_model(executable, table.chips[dies[0]]) if dies else A3_MODEL
        names = [normalise_model(row.name) for row in table.chips]
        is_910b = any(known_model(n) and classify(n) is Generation.ASCEND910B for n in names)
        self.board_id = await self._board_id_of(executable, table.chips[0]) if resetting and is_910b else None

    async def _info_map(self, executable: str) -> tuple[MapRow, ...]:
        try:
            return parse_info_map(
                await run_npu_smi(executable, ["info", "-m"], self._settings.npu_smi_timeout)
            )
        except (NpuSmiError, NpuSmiParseError) as exc:
            log.debug("npu-smi info -m gave no chip map: %s", exc, extra=log_fields(reason=str(exc)))
            return ()

    async def _board_model(self, executable: str, die: ChipRow) -> str:
        """``910_93xx`` when the board names a known A3 SoC, else ``910_93``."""
        args = ["info", "-t", "board", "-i", str(die.npu_id), "-c", str(die.chip)]
        try:
            board = parse_key_values(await run_npu_smi(executable, args, self._settings.npu_smi_timeout))
        except (NpuSmiError, NpuSmiParseError) as exc:
            log.info("A3 chips; npu-smi %s did not name the SoC (%s): model %s", " ".join(args), exc,
                     A3_MODEL)  # fmt: skip
            return A3_MODEL
        model = board_model(board)
        if model is None:
            log.info("A3 chips; the board names SoC %r, not a known A3 one: model %s",
                     board.get("NPU Name", ""), A3_MODEL)  # fmt: skip
            return A3_MODEL
        return model

    async def _board_id_of(self, executable: str, row: ChipRow) -> int | None:
        """The board id ``npu-smi info -t board`` names (``Board ID : 0x33``); None when it names none."""
        args = ["info", "-t", "board", "-i", str(row.npu_id)]
        try:
            board = parse_key_values(await run_npu_smi(executable, args, self._settings.npu_smi_timeout))
            return int(board.get("Board ID", ""), 16)
        except (NpuSmiError, NpuSmiParseError, ValueError) as exc:
            log.info("npu-smi %s named no board id (%s): 910B chips reset as one HCCS box",
                     " ".join(args), exc)  # fmt: skip
            return None


def known_model(name: str) -> bool:
    """Whether ``name`` is a chip model the agent can classify (npu-smi may print a redacted one)."""
    try:
        classify(name)
    except UnknownModelError:
        return False
    return True
