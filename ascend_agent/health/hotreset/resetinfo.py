"""The node annotation ``ResetInfo`` as Huawei's device plugin writes it: the chips a hot reset could not
fix, for a person to reset (``ManualResetDevs``), in Go's field names (Huawei's struct has no json tags)::

    document = reset_info([ResetDevice(card_id=1, device_id=0, associated_card_id=5, phys_id=2,
                                       logic_id=2)])
    # {"ThirdPartyResetDevs":[],"ManualResetDevs":[{"CardId":1,"DeviceId":0,"AssociatedCardId":5,...}]}

>>> reset_info([])
'{"ThirdPartyResetDevs":[],"ManualResetDevs":[]}'
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from ascend_agent.model import Chip, Generation

ANNOTATION = "ResetInfo"
# Huawei's value for a card without a paired card (every model but A3) and for an id not known.
NO_CARD = -1


@dataclass(frozen=True, slots=True, order=True)
class ResetDevice:
    """One chip in ``ResetInfo``: its card (npu-smi ``-i``), its place on the card (``-c``), the A3 paired
    card (-1 elsewhere), its physical id and the driver's logic id (-1 where not read)."""

    card_id: int
    device_id: int
    associated_card_id: int
    phys_id: int
    logic_id: int

    @classmethod
    def of(cls, chip: Chip) -> ResetDevice:
        """``chip`` as ``ResetInfo`` lists it; its paired card as the driver named it (never guessed)."""
        card = chip.npu_id if chip.npu_id is not None else chip.phys_id
        paired = chip.paired_card if chip.generation is Generation.ASCEND910A3 else None
        return cls(
            card_id=card,
            device_id=chip.chip_on_card,
            associated_card_id=NO_CARD if paired is None else paired,
            phys_id=chip.phys_id,
            logic_id=NO_CARD if chip.logic_id is None else chip.logic_id,
        )

    def as_go(self) -> dict[str, int]:
        return {
            "CardId": self.card_id,
            "DeviceId": self.device_id,
            "AssociatedCardId": self.associated_card_id,
            "PhyID": self.phys_id,
            "LogicID": self.logic_id,
        }


def reset_info(manual: Iterable[ResetDevice]) -> str:
    """The annotation's value: no third-party resets (the agent makes none), and ``manual`` in order."""
    document = {
        "ThirdPartyResetDevs": [],
        "ManualResetDevs": [device.as_go() for device in sorted(manual)],
    }
    return json.dumps(document, separators=(",", ":"))
