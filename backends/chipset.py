"""What the devfs backend learns once per chip set (the chips npu-smi lists, not every health query):
``npu-smi info -m`` where the table's names are redacted or its ids are not the physical ids (Ascend 950), or
the hot reset needs the logic ids; ``info -t board`` of one A3 die for the SoC, and with the hot reset on a
910B's board id (a board without HCCS resets its chips alone) and the A3 card pairs the driver resets
together (:mod:`.dcmi_pairs`)::

    chip_set = ChipSet(settings)
    await chip_set.learn(executable, table)      # asks again only when the chip set changed
    chip_set.chip_map, chip_set.a3_model, chip_set.logic_ids, chip_set.board_id, chip_set.paired_cards
    chip_set.retry_pairing()                     # a pairing not read: asked again in a task of its own
    await chip_set.close()                       # that task stopped, its child killed
"""

from __future__ import annotations

import asyncio
import logging
import time

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
from ascend_agent.model import NO_PAIRED_CARD, Generation, UnknownModelError, classify, normalise_model
from ascend_agent.observability import log_fields

log = logging.getLogger("ascend_agent.backends.devfs")

# The model of an A3 die when `npu-smi info -t board` does not name its SoC.
A3_MODEL = "910_93"
# A pairing that could not be read is asked again after this many seconds (a child process each time, in a
# task of its own: no health query waits for it).
PAIRING_RETRY = 60.0


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
        # With the hot reset on, on A3: each card's paired card as the driver says (NO_PAIRED_CARD: none),
        # or why it could not be read.
        self.paired_cards: dict[int, int] = {}
        self.pairing_problem = ""
        self._pairing_retry_at = 0.0
        self._a3_cards: list[int] = []
        self._pairing_retry: asyncio.Task[None] | None = None

    async def learn(self, executable: str, table: InfoTable) -> None:
        """Once per chip set (not every health query): ``npu-smi info -m`` where the table's names are
        redacted or its ids are not the physical ids (Ascend 950), and ``info -t board`` of one A3 die for
        the SoC."""
        chip_set = tuple((row.npu_id, row.chip, row.name) for row in table.chips)
        if chip_set == self._set:
            return
        if self._pairing_retry is not None:
            self._pairing_retry.cancel()  # the other chip set's
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
        self.paired_cards, self.pairing_problem = {}, ""
        self._a3_cards = sorted({table.chips[index].npu_id for index in dies})
        if dies and resetting:
            await self._pair()

    def retry_pairing(self) -> None:
        """Ask the driver for the A3 card pairs again, :data:`PAIRING_RETRY` s after it could not say, in a
        task of its own: the health query that calls this goes on (a driver that fails or hangs would hold
        it up to the npu-smi timeout). What the task reads is in ``paired_cards`` when it ends."""
        if not self.pairing_problem or time.monotonic() < self._pairing_retry_at:
            return
        if self._pairing_retry is not None and not self._pairing_retry.done():
            return
        self._pairing_retry_at = time.monotonic() + PAIRING_RETRY
        self._pairing_retry = asyncio.get_running_loop().create_task(self._pair(), name="A3 card pairs")

    def pairing(self) -> tuple[object, ...]:
        """What the pairing now is, to compare: the pairs and why they could not be read."""
        return tuple(sorted(self.paired_cards.items())), self.pairing_problem

    async def close(self) -> None:
        """Stop a retry of the pairing under way; its child is killed."""
        retry, self._pairing_retry = self._pairing_retry, None
        if retry is not None:
            retry.cancel()
            await asyncio.wait([retry])

    async def _pair(self) -> None:
        """The A3 card pairs, from the driver's library; one line when read, one warning when not."""
        from ascend_agent.backends.dcmi_pairs import PairingError, read_paired_cards

        cards = self._a3_cards
        try:
            pairs = await read_paired_cards(self._settings.host_root, cards, self._settings.npu_smi_timeout)
        except PairingError as exc:
            if str(exc) != self.pairing_problem:
                log.warning(
                    "Cannot read from the driver which A3 card is reset with which (%s): the hot reset "
                    "resets no A3 chip (its dry run takes the node's A3 chips as one group)",
                    exc,
                    extra=log_fields(reason=str(exc)),
                )
            self.pairing_problem = str(exc)
            self._pairing_retry_at = time.monotonic() + PAIRING_RETRY
            return
        self.paired_cards, self.pairing_problem = pairs, ""
        shown = ", ".join(
            f"{card} with {other}" if other != NO_PAIRED_CARD else f"{card} alone"
            for card, other in pairs.items()
        )
        log.info("A3 cards the driver resets together: %s", shown)

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
