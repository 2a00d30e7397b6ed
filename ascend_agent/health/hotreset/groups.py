"""Reset groups: the chips a chip's hot reset takes down with it, which must all be idle before it runs.

As Huawei's device plugin groups them (``hot_reset_manager.go``): a 910A's HCCS ring of 4; a 910B's HCCS box
of 8 (16 on a Box16 board of more than 8 chips), or the chip alone on boards without HCCS (300I A2, 800I A2
PCIe: board ids 0x28, 0x29, 0x33, 0x3c); on A3 both dies of its card and both dies of the card the driver
pairs with it (``Chip.paired_card``, read from the driver; none: the card alone; not read on some die: every
A3 chip of the node, one group, never guessed); on a 300I Duo the card; anything else the chip alone::

    groups = reset_groups(inventory.chips)
    groups[3]                     # frozenset({0, 1, 2, 3}): the physical ids reset with chip 3 (910A)

>>> chips = [Chip.make(i, "910B3", npu_id=i) for i in range(8)]
>>> sorted(reset_groups(chips)[5])
[0, 1, 2, 3, 4, 5, 6, 7]
>>> sorted(reset_groups([Chip.make(i, "910B3", npu_id=i, board_id=0x33) for i in range(8)])[5])
[5]
>>> dies = [Chip.make(i, "910_9392", npu_id=i // 2, paired_card=(i // 2 + 4) % 8) for i in range(16)]
>>> sorted(reset_groups(dies)[3])
[2, 3, 10, 11]
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence

from ascend_agent.model import Chip, Generation

RING_910A = 4
BOX_910B = 8
BOX16_910B = 16
# 910B boards without HCCS, whose chips reset alone (Huawei's constants.go).
NO_HCCS_BOARDS = frozenset({0x28, 0x29, 0x33, 0x3C})


def reset_groups(chips: Sequence[Chip]) -> dict[int, frozenset[int]]:
    """Each chip's reset group by physical id (vNPUs are left out: their chip stands for them)."""
    whole = [chip for chip in chips if chip.vnpu is None]
    groups: dict[int, frozenset[int]] = {}
    for generation in {chip.generation for chip in whole}:
        same = [chip for chip in whole if chip.generation is generation]
        groups.update(_grouped(same, _key_for(generation, same)))
    return groups


def _key_for(generation: Generation, chips: Sequence[Chip]) -> Callable[[Chip], Hashable]:
    if generation is Generation.ASCEND910A:
        return lambda chip: chip.phys_id // RING_910A
    if generation is Generation.ASCEND910B:
        if any(chip.board_id in NO_HCCS_BOARDS for chip in chips):
            return lambda chip: ("alone", chip.phys_id)
        size = BOX16_910B if len(chips) > BOX_910B else BOX_910B
        return lambda chip: chip.phys_id // size
    if generation is Generation.ASCEND910A3:
        if not all(paired_known(chip) for chip in chips):
            return lambda chip: "every A3 chip: the pairs were not read"
        cards = {_card(chip) for chip in chips}

        def pair(chip: Chip) -> Hashable:
            card, other = _card(chip), chip.paired_card
            return min(card, other) if other is not None and other in cards else card

        return pair
    if generation is Generation.ASCEND310P:
        return _card
    return lambda chip: ("alone", chip.phys_id)


def paired_known(chip: Chip) -> bool:
    """Whether the chips a reset of ``chip`` takes down are known: on A3, once the driver named its card's
    pair (``paired_card``, none counts); every other model's groups need nothing read."""
    return chip.generation is not Generation.ASCEND910A3 or chip.paired_card is not None


def _card(chip: Chip) -> int:
    return chip.npu_id if chip.npu_id is not None else chip.phys_id


def _grouped(chips: Sequence[Chip], key: Callable[[Chip], Hashable]) -> Mapping[int, frozenset[int]]:
    members: dict[Hashable, set[int]] = {}
    for chip in chips:
        members.setdefault(key(chip), set()).add(chip.phys_id)
    return {chip.phys_id: frozenset(members[key(chip)]) for chip in chips}
