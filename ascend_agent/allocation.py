"""Topology-aware preferred allocation (GetPreferredAllocation); pure functions, no I/O.

An Atlas 800 training node (910A) has two HCCS rings, 0-3 and 4-7. With chip 4 busy, one chip is taken from
the ring that has three free, so ring 0 stays whole for a 4-chip job:

>>> topology = topology_for([Chip.make(i, "910ProB") for i in range(8)])
>>> free = [f"Ascend910-{i}" for i in (0, 1, 2, 3, 5, 6, 7)]
>>> preferred(topology, free, [], 1)
['Ascend910-5']
>>> preferred(topology, free, [], 4)
['Ascend910-0', 'Ascend910-1', 'Ascend910-2', 'Ascend910-3']
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ascend_agent.model import Chip, Generation
from ascend_agent.naming import replica_ids

_BOX16_RING_SIZE = 8
_ATLAS800_RING_SIZE = 4
_MODULE_SIZE = 2  # dies per A3 NPU id

_ChipKey = tuple[int, int, str]
_DeviceKey = tuple[int, _ChipKey, int, str]
_GroupOf = Callable[[str], int | None]


class Layout(enum.StrEnum):
    """How the chips of a node are wired together; it decides the allocation policy."""

    RINGS = "rings"
    MESH = "mesh"
    MODULES = "modules"
    FLAT = "flat"


@dataclass(frozen=True, slots=True)
class Topology:
    """What :func:`preferred` needs to know about a node's chips; build it with :func:`topology_for`.

    ``group_of`` maps a chip device id to its ring (RINGS) or module (MODULES) index, ``numa_of`` to its NUMA
    node where known, ``chip_of`` maps every advertised device id to its chip device id, and ``order`` maps a
    chip device id to its physical id for deterministic tie-breaking.
    """

    layout: Layout
    group_of: Mapping[str, int]
    numa_of: Mapping[str, int]
    chip_of: Mapping[str, str]
    order: Mapping[str, int]


def topology_for(chips: Sequence[Chip], replicas: int = 1) -> Topology:
    """The topology of one resource's chips, each advertised ``replicas`` times.

    The layout follows the generation: 910A rings, 910B and Ascend 950 mesh, A3 modules (the dies of one NPU
    id), anything else (or a mix) flat.

    >>> dies = [Chip.make(i, "910_9392", npu_id=(0, 0, 5, 5)[i]) for i in range(4)]
    >>> topology = topology_for(dies, replicas=2)
    >>> topology.layout, topology.group_of["Ascend910-3"], topology.chip_of["Ascend910-3-1"]
    (<Layout.MODULES: 'modules'>, 1, 'Ascend910-3')
    """
    ordered = sorted(chips, key=lambda chip: chip.phys_id)
    layout = _layout_of(ordered)
    group_of: dict[str, int] = {}
    if layout is Layout.RINGS:
        # Counting the phys ids too keeps a Box16 on rings of 8 when only some of its chips are listed.
        box16 = len(ordered) > _BOX16_RING_SIZE or ordered[-1].phys_id >= _BOX16_RING_SIZE
        ring_size = _BOX16_RING_SIZE if box16 else _ATLAS800_RING_SIZE
        group_of = {chip.device_id: chip.phys_id // ring_size for chip in ordered}
    elif layout is Layout.MODULES:
        group_of = _modules(ordered)
    return Topology(
        layout=layout,
        group_of=group_of,
        numa_of={chip.device_id: chip.numa_node for chip in ordered if chip.numa_node is not None},
        chip_of={
            device: chip.device_id for chip in ordered for device in replica_ids(chip.device_id, replicas)
        },
        order={chip.device_id: chip.phys_id for chip in ordered},
    )


def _modules(chips: Sequence[Chip]) -> dict[str, int]:
    """A3: the dies of one NPU id form a module, numbered in NPU id order; a chip without an NPU id pairs
    with its phys-id neighbour."""
    key_of = {
        chip.device_id: (0, chip.npu_id) if chip.npu_id is not None else (1, chip.phys_id // _MODULE_SIZE)
        for chip in chips
    }
    index = {key: n for n, key in enumerate(sorted(set(key_of.values())))}
    return {device: index[key] for device, key in key_of.items()}


def preferred(
    topology: Topology, available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """The ``size`` device ids to hand to the kubelet, ``must_include`` first; never raises.

    Replicas are spread: every chosen chip gets one replica before any chip gets a second. Ids the topology
    does not know are used only when nothing else is left.

    >>> topology = topology_for([Chip.make(i, "310P3") for i in range(2)], replicas=2)
    >>> preferred(topology, ["Ascend310P-0-1", "Ascend310P-1-0", "Ascend310P-1-1"], ["Ascend310P-0-0"], 2)
    ['Ascend310P-0-0', 'Ascend310P-1-0']
    """
    if size <= 0:
        return []
    must = sorted(set(must_include), key=lambda device: _device_key(topology, device))
    if len(must) >= size:
        return must[:size]
    replicas_of: dict[str, list[str]] = {}
    unknown: list[str] = []
    for device in set(available).difference(must):
        chip = topology.chip_of.get(device)
        if chip is None:
            unknown.append(device)
        else:
            replicas_of.setdefault(chip, []).append(device)
    free = {
        chip: sorted(replicas_of[chip], key=_replica_order)
        for chip in sorted(replicas_of, key=lambda chip: _chip_key(topology, chip))
    }
    must_count = Counter(topology.chip_of[device] for device in must if device in topology.chip_of)
    taken = _spread(
        topology, {chip: len(replicas) for chip, replicas in free.items()}, must_count, size - len(must)
    )
    picked = [device for chip, replicas in free.items() for device in replicas[: taken[chip]]]
    unknown.sort()
    return must + picked + unknown[: size - len(must) - len(picked)]


def _layout_of(chips: Sequence[Chip]) -> Layout:
    generations = {chip.generation for chip in chips}
    if len(generations) != 1:
        return Layout.FLAT
    return {
        Generation.ASCEND910A: Layout.RINGS,
        Generation.ASCEND910B: Layout.MESH,
        Generation.ASCEND950: Layout.MESH,
        Generation.ASCEND910A3: Layout.MODULES,
    }.get(generations.pop(), Layout.FLAT)


def _chip_key(topology: Topology, chip: str) -> _ChipKey:
    phys_id = topology.order.get(chip)
    return (0, phys_id, chip) if phys_id is not None else (1, 0, chip)


def _device_key(topology: Topology, device: str) -> _DeviceKey:
    chip = topology.chip_of.get(device)
    if chip is None:
        return (1, (0, 0, ""), 0, device)
    return (0, _chip_key(topology, chip), *_replica_order(device))


def _replica_order(device: str) -> tuple[int, str]:
    # Replica ids of one chip share its prefix, so the shorter id has the smaller replica number.
    return (len(device), device)


def _spread(topology: Topology, free: Mapping[str, int], must_count: Counter[str], need: int) -> Counter[str]:
    """How many of each chip's ``free`` replicas to take (chips in phys id order), spread by the chip policy.

    Round ``level`` gives chips that hold fewer than ``level`` ids another replica.
    """
    taken: Counter[str] = Counter()
    left = sum(free.values())
    level = 1
    while need > 0 and left > 0:
        pinned = {chip for chip, count in must_count.items() if count >= level}
        candidates = [
            chip for chip, count in free.items() if taken[chip] < count and must_count[chip] < level
        ]
        if candidates:
            n = min(need, len(candidates))
            taken.update(_choose_chips(topology, pinned, candidates, n))
            need -= n
            left -= n
        level += 1
    return taken


def _choose_chips(topology: Topology, pinned: set[str], candidates: list[str], n: int) -> list[str]:
    """``n`` of the ``candidates`` (sorted by phys id) to join the ``pinned`` chips."""
    if topology.layout in (Layout.RINGS, Layout.MODULES):
        group_of = topology.group_of.get
        chosen = _split_evenly(Counter(topology.group_of.values()), group_of, pinned, candidates, n)
        if chosen is not None:
            return chosen
    else:
        group_of = topology.numa_of.get
    return _fewest_groups(group_of, pinned, candidates, n)


def _group_order(group: int | None) -> tuple[bool, int]:
    return (group is None, group or 0)


def _by_group(candidates: list[str], group_of: _GroupOf) -> dict[int | None, list[str]]:
    grouped: dict[int | None, list[str]] = {}
    for chip in candidates:
        grouped.setdefault(group_of(chip), []).append(chip)
    return grouped


def _leftover_key(left: int, whole: bool) -> tuple[int, bool, int]:
    """How much a group minds giving up chips and keeping ``left`` free; smaller is better.

    This reproduces Huawei's ring priorities (1 chip: rings with 1 free, then 3, 2, 4; 2 chips: 2, 4, 3): an
    odd remainder strands a chip only a 1-chip job can use; a broken whole group costs the next big job.
    """
    return (left % 2, whole, left)


def _split_evenly(
    capacity: Counter[int], group_of: _GroupOf, pinned: set[str], candidates: list[str], n: int
) -> list[str] | None:
    """Rings or modules: the fewest groups of ``capacity``, each holding an even share of the chips.

    None when the pinned chips or the free chips do not allow it.
    """
    group_size = max(capacity.values(), default=0)
    if group_size == 0:
        return None
    total = n + len(pinned)
    parts = -(-total // group_size)
    base, extra = divmod(total, parts)
    shares = [base + 1] * extra + [base] * (parts - extra)
    held = Counter(group_of(chip) for chip in pinned)
    if len(held) > parts:
        return None
    free = _by_group(candidates, group_of)
    chosen: list[str] = []
    for group in sorted(held, key=lambda group: (-held[group], _group_order(group))):
        share = shares.pop(0)
        chips = free.pop(group, [])
        if not held[group] <= share <= held[group] + len(chips):
            return None
        chosen += chips[: share - held[group]]
    for share in shares:
        options = [(group, chips) for group, chips in free.items() if len(chips) >= share]
        if not options:
            return None
        group, chips = _best_group(options, share, capacity)
        del free[group]
        chosen += chips[:share]
    return chosen


def _best_group(
    options: list[tuple[int | None, list[str]]], share: int, capacity: Counter[int]
) -> tuple[int | None, list[str]]:
    def cost(option: tuple[int | None, list[str]]) -> tuple[tuple[int, bool, int], tuple[bool, int]]:
        group, chips = option
        whole = group is not None and len(chips) == capacity[group]
        return (_leftover_key(len(chips) - share, whole), _group_order(group))

    return min(options, key=cost)


def _fewest_groups(group_of: _GroupOf, pinned: set[str], candidates: list[str], n: int) -> list[str]:
    """Best effort: fill the pinned chips' groups first, then touch as few further groups as possible."""
    pinned_groups = {group_of(chip) for chip in pinned}
    free = _by_group(candidates, group_of)
    inside = [(group, chips) for group, chips in free.items() if group in pinned_groups]
    outside = [(group, chips) for group, chips in free.items() if group not in pinned_groups]
    chosen = _fill(inside, n)
    return chosen + _fill(outside, n - len(chosen))


def _fill(groups: list[tuple[int | None, list[str]]], need: int) -> list[str]:
    """The tightest single group that covers ``need``; failing that the largest group whole, and again."""
    pool = sorted(groups, key=lambda item: _group_order(item[0]))
    chosen: list[str] = []
    while need > 0 and pool:
        fitting = [item for item in pool if len(item[1]) >= need]
        if fitting:
            chosen += min(fitting, key=lambda item: len(item[1]))[1][:need]
            break
        largest = max(pool, key=lambda item: len(item[1]))
        pool.remove(largest)
        chosen += largest[1]
        need -= len(largest[1])
    return chosen
