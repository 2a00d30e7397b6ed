"""Reset groups: the chips a chip's hot reset takes down with it, which must all be idle before it runs.

As Huawei's device plugin groups them (``hot_reset_manager.go``): a 910A's HCCS ring of 4; a 910B's HCCS box
of 8 (16 on a Box16 board of more than 8 chips), or the chip alone on boards without HCCS (300I A2, 800I A2
PCIe: board ids 0x28, 0x29, 0x33, 0x3c); on A3 both dies of its card and both dies of the paired card (the
card half the node away: 0 with 4, 1 with 5, as Huawei's ResetInfo example pairs them); on a 300I Duo the
card; anything else the chip alone::

    groups = reset_groups(inventory.chips)
    groups[3]                     # frozenset({0, 1, 2, 3}): the physical ids reset with chip 3 (910A)

>>> chips = [Chip.make(i, "910B3", npu_id=i) for i in range(8)]
>>> sorted(reset_groups(chips)[5])
[0, 1, 2, 3, 4, 5, 6, 7]
>>> sorted(reset_groups([Chip.make(i, "910B3", npu_id=i, board_id=0x33) for i in range(8)])[5])
[5]
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


def paired_card(npu_id: int, cards: Sequence[int]) -> int | None:
    """The A3 card paired with ``npu_id`` among the node's ``cards`` (the one half the node away); None
    where the node has an odd number of cards.

    >>> paired_card(1, range(8)), paired_card(6, range(8)), paired_card(0, range(3))
    (5, 2, None)
    """
    ordered = sorted(set(cards))
    if len(ordered) % 2 or npu_id not in ordered:
        return None
    half = len(ordered) // 2
    return ordered[(ordered.index(npu_id) + half) % len(ordered)]


def _key_for(generation: Generation, chips: Sequence[Chip]) -> Callable[[Chip], Hashable]:
    if generation is Generation.ASCEND910A:
        return lambda chip: chip.phys_id // RING_910A
    if generation is Generation.ASCEND910B:
        if any(chip.board_id in NO_HCCS_BOARDS for chip in chips):
            return lambda chip: ("alone", chip.phys_id)
        size = BOX16_910B if len(chips) > BOX_910B else BOX_910B
        return lambda chip: chip.phys_id // size
    if generation is Generation.ASCEND910A3:
        cards = [_card(chip) for chip in chips]

        def pair(chip: Chip) -> Hashable:
            card = _card(chip)
            other = paired_card(card, cards)
            return card if other is None else min(card, other)

        return pair
    if generation is Generation.ASCEND310P:
        return _card
    return lambda chip: ("alone", chip.phys_id)


def _card(chip: Chip) -> int:
    return chip.npu_id if chip.npu_id is not None else chip.phys_id


def _grouped(chips: Sequence[Chip], key: Callable[[Chip], Hashable]) -> Mapping[int, frozenset[int]]:
    members: dict[Hashable, set[int]] = {}
    for chip in chips:
        members.setdefault(key(chip), set()).add(chip.phys_id)
    return {chip.phys_id: frozenset(members[key(chip)]) for chip in chips}
