"""Preferred allocation: the rules of the chips' topology (HCCS meshes, NUMA), and properties that hold for
any input."""

from __future__ import annotations

from collections.abc import Iterable
from random import Random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_agent.allocation import Layout, Topology, preferred, topology_for
from ascend_agent.model import Chip
from ascend_agent.naming import replica_ids

ATLAS800 = "910ProB"
A2 = "910B4"
A3 = "910_9392"
DUO = "310P3"


def board(model: str, count: int, numa: dict[int, int] | None = None) -> list[Chip]:
    """Chips as devfs gives them: on A3 two dies per NPU id (Phy-IDs 2n and 2n+1 on NPU n, as the sample)."""
    npu = (lambda i: i // 2) if model == A3 else (lambda i: i)
    return [Chip.make(i, model, numa_node=(numa or {}).get(i), npu_id=npu(i)) for i in range(count)]


def ids(*phys_ids: int, family: str = "Ascend910") -> list[str]:
    return [f"{family}-{i}" for i in phys_ids]


def numa_halves(count: int = 8) -> dict[int, int]:
    return {i: i * 2 // count for i in range(count)}


# --- topology_for and replica_ids ------------------------------------------------------------------------


def test_replica_ids() -> None:
    assert replica_ids("Ascend910-3", 1) == ("Ascend910-3",)
    assert replica_ids("Ascend910-3", 3) == ("Ascend910-3-0", "Ascend910-3-1", "Ascend910-3-2")
    with pytest.raises(ValueError):
        replica_ids("Ascend910-3", 0)


@pytest.mark.parametrize(
    ("model", "count", "layout", "groups"),
    [
        (ATLAS800, 8, Layout.RINGS, [0, 0, 0, 0, 1, 1, 1, 1]),
        (ATLAS800, 4, Layout.RINGS, [0, 0, 0, 0]),
        (ATLAS800, 16, Layout.RINGS, [0] * 8 + [1] * 8),
        (A2, 8, Layout.MESH, []),
        (A3, 8, Layout.MODULES, [0, 0, 1, 1, 2, 2, 3, 3]),
        (DUO, 4, Layout.FLAT, []),
    ],
)
def test_layout_and_groups(model: str, count: int, layout: Layout, groups: list[int]) -> None:
    topology = topology_for(board(model, count))
    assert topology.layout is layout
    assert [topology.group_of[chip] for chip in topology.order if chip in topology.group_of] == groups


def test_box16_keeps_rings_of_eight_when_only_the_second_ring_is_listed() -> None:
    chips = [Chip.make(i, ATLAS800) for i in range(8, 16)]
    assert set(topology_for(chips).group_of.values()) == {1}


def test_mixed_generations_and_no_chips_are_flat() -> None:
    assert topology_for([Chip.make(0, ATLAS800), Chip.make(1, A2)]).layout is Layout.FLAT
    assert topology_for([]) == Topology(Layout.FLAT, {}, {}, {}, {})


def test_topology_maps() -> None:
    topology = topology_for(board(A2, 2, {0: 0, 1: 1}), replicas=2)
    assert topology.numa_of == {"Ascend910-0": 0, "Ascend910-1": 1}
    assert topology.order == {"Ascend910-0": 0, "Ascend910-1": 1}
    assert topology.chip_of == {
        "Ascend910-0-0": "Ascend910-0",
        "Ascend910-0-1": "Ascend910-0",
        "Ascend910-1-0": "Ascend910-1",
        "Ascend910-1-1": "Ascend910-1",
    }
    assert topology_for(board(DUO, 1, {0: 3})).numa_of == {"Ascend310P-0": 3}


# --- the rules, one table per layout ------------------------------------------------------------------------

Case = tuple[list[int], list[int], int, list[int]]  # free phys ids, must_include phys ids, size -> expected


def check(model: str, count: int, case: Case, numa: dict[int, int] | None = None) -> None:
    free, must, size, expected = case
    topology = topology_for(board(model, count, numa))
    assert preferred(topology, ids(*free), ids(*must), size) == ids(*expected)


RINGS_CASES: dict[str, Case] = {
    # The facts' example: ring 0-3 whole, ring 4-7 with three free.
    "1 chip from the ring with 3 free, not 4": ([0, 1, 2, 3, 5, 6, 7], [], 1, [5]),
    "2 chips from the ring with 4 free, not 3": ([0, 1, 2, 3, 5, 6, 7], [], 2, [0, 1]),
    "4 chips take the whole free ring": ([0, 1, 2, 3, 5, 6, 7], [], 4, [0, 1, 2, 3]),
    "3 chips fill the ring with 3 free": ([0, 1, 2, 3, 5, 6, 7], [], 3, [5, 6, 7]),
    "8 chips take the node": (list(range(8)), [], 8, list(range(8))),
    # Huawei's priority for 1 chip: 1 free, then 3, 2, 4 (the winner is always in ring 4-7).
    "1 chip: 1 free before 3": ([0, 1, 2, 7], [], 1, [7]),
    "1 chip: 3 free before 2": ([0, 1, 5, 6, 7], [], 1, [5]),
    "1 chip: 2 free before 4": ([0, 1, 2, 3, 6, 7], [], 1, [6]),
    # ... and for 2 chips: 2 free, then 4, then 3.
    "2 chips: 2 free before 4": ([0, 1, 2, 3, 6, 7], [], 2, [6, 7]),
    "2 chips: 4 free before 3": ([0, 1, 2, 4, 5, 6, 7], [], 2, [4, 5]),
    "2 chips: 2 free before 3": ([0, 1, 2, 6, 7], [], 2, [6, 7]),
    "ties go to the lower ring": (list(range(8)), [], 2, [0, 1]),
    "must_include pins its ring": (list(range(8)), [6], 2, [6, 4]),
    "must_include pins its ring for 4": (list(range(8)), [6], 4, [6, 4, 5, 7]),
    "must_include in both rings for 8": (list(range(8)), [1, 6], 8, [1, 6, 0, 2, 3, 4, 5, 7]),
    "must_include outside available comes first": ([0, 1, 2, 3], [7], 2, [7, 0]),
    "no whole ring: fewest rings, then tight": ([0, 1, 2, 5, 6, 7], [], 4, [0, 1, 2, 5]),
    "no ring with 2 free: best effort": ([0, 4], [], 2, [0, 4]),
    "more than there is": ([2, 5], [], 4, [2, 5]),
}


@pytest.mark.parametrize("case", RINGS_CASES.values(), ids=RINGS_CASES.keys())
def test_atlas800_rings(case: Case) -> None:
    check(ATLAS800, 8, case)


HALF_NODE_CASES: dict[str, Case] = {
    "2 chips in the only ring": ([0, 1, 2, 3], [], 2, [0, 1]),
    "4 chips: the whole node": ([0, 1, 2, 3], [], 4, [0, 1, 2, 3]),
    "1 chip": ([1, 2, 3], [], 1, [1]),
    "must_include": ([0, 1, 2, 3], [3], 2, [3, 0]),
}


@pytest.mark.parametrize("case", HALF_NODE_CASES.values(), ids=HALF_NODE_CASES.keys())
def test_half_node(case: Case) -> None:
    check(ATLAS800, 4, case)


BOX16_CASES: dict[str, Case] = {
    "8 chips take a whole ring": (list(range(16)), [], 8, list(range(8))),
    "8 chips take the ring that is whole": (list(range(1, 16)), [], 8, list(range(8, 16))),
    "10 chips split 5 + 5": (list(range(16)), [], 10, [0, 1, 2, 3, 4, 8, 9, 10, 11, 12]),
    "12 chips split 6 + 6": (list(range(16)), [], 12, [0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13]),
    "9 chips split 5 + 4": (list(range(16)), [], 9, [0, 1, 2, 3, 4, 8, 9, 10, 11]),
    "16 chips": (list(range(16)), [], 16, list(range(16))),
    "4 chips leave the other ring whole": ([*range(10), 12, 13, 14, 15], [], 4, [8, 9, 12, 13]),
    "1 chip stays off the whole ring": ([*range(8), 15], [], 1, [15]),
    "10 chips, one ring short: best effort": ([*range(8), 12, 13, 14, 15], [], 10, [*range(8), 12, 13]),
    "must_include in the second ring": (list(range(16)), [9], 2, [9, 8]),
}


@pytest.mark.parametrize("case", BOX16_CASES.values(), ids=BOX16_CASES.keys())
def test_box16(case: Case) -> None:
    check(ATLAS800, 16, case)


MESH_CASES: dict[str, Case] = {
    "3 chips fit NUMA 0 exactly": ([0, 1, 2, 4, 5, 6, 7], [], 3, [0, 1, 2]),
    "4 chips fit NUMA 1 only": ([0, 1, 2, 4, 5, 6, 7], [], 4, [4, 5, 6, 7]),
    "2 chips where fewest stay behind": ([0, 1, 2, 3, 5, 6], [], 2, [5, 6]),
    "ties go to the lower node": (list(range(8)), [], 2, [0, 1]),
    "5 chips: two nodes, the full one whole": ([0, 1, 2, 4, 5, 6, 7], [], 5, [0, 4, 5, 6, 7]),
    "8 chips": (list(range(8)), [], 8, list(range(8))),
    "must_include pins its node": (list(range(8)), [5], 3, [5, 4, 6]),
    "must_include on both nodes": ([0, 1, 4, 5], [0, 4], 3, [0, 4, 1]),
}


@pytest.mark.parametrize("case", MESH_CASES.values(), ids=MESH_CASES.keys())
def test_mesh_numa(case: Case) -> None:
    check(A2, 8, case, numa_halves())


def test_mesh_without_numa_takes_the_lowest_ids() -> None:
    check(A2, 8, ([1, 3, 5, 7], [], 2, [1, 3]))


def test_mesh_chips_of_unknown_numa_come_after_known_nodes() -> None:
    check(A2, 4, ([0, 1, 2, 3], [], 2, [2, 3]), {2: 0, 3: 0})


MODULES_CASES: dict[str, Case] = {
    "2 chips: a whole module": (list(range(8)), [], 2, [0, 1]),
    "2 chips: a fully free module, not two halves": ([0, 2, 3, 5], [], 2, [2, 3]),
    "4 chips: two whole modules": ([1, 2, 3, 4, 5, 7], [], 4, [2, 3, 4, 5]),
    "1 chip: the free half of a used module": ([0, 1, 2, 3, 5], [], 1, [5]),
    "3 chips: a whole module and a free half": ([0, 1, 2, 3, 5], [], 3, [0, 1, 5]),
    "5 chips: two whole modules and a free half": ([0, 1, 2, 3, 5, 6, 7], [], 5, [0, 1, 2, 3, 5]),
    "1 chip, no half-used module: splits one": (list(range(4)), [], 1, [0]),
    "4 chips, one whole module: best effort": ([0, 2, 4, 5, 6], [], 4, [0, 2, 4, 5]),
    "must_include takes its partner": (list(range(8)), [3], 2, [3, 2]),
    "must_include with its partner busy": ([1, 3, 4, 5], [1], 2, [1, 3]),
}


@pytest.mark.parametrize("case", MODULES_CASES.values(), ids=MODULES_CASES.keys())
def test_a3_modules(case: Case) -> None:
    check(A3, 8, case)


def test_a3_modules_follow_the_npu_id_not_the_phys_id_parity() -> None:
    # Phy-IDs 0 and 2 are the dies of NPU 7, 1 and 3 those of NPU 4.
    chips = [Chip.make(i, A3, npu_id=(7, 4, 7, 4)[i]) for i in range(4)]
    topology = topology_for(chips)
    assert [topology.group_of[f"Ascend910-{i}"] for i in range(4)] == [1, 0, 1, 0]
    assert preferred(topology, ids(0, 1, 2, 3), [], 2) == ids(1, 3)
    assert preferred(topology, ids(0, 1, 2, 3), ids(2), 2) == ids(2, 0)


def test_950_is_a_mesh_over_numa() -> None:
    topology = topology_for(board("950PR", 8, numa_halves()))
    assert topology.layout is Layout.MESH
    assert preferred(topology, ids(0, 1, 4, 5, 6, family="npu"), [], 3) == ids(4, 5, 6, family="npu")


def test_flat_uses_numa_when_known() -> None:
    topology = topology_for(board(DUO, 4, {0: 0, 1: 1, 2: 0, 3: 1}))
    assert preferred(topology, ids(0, 1, 2, 3, family="Ascend310P"), [], 2) == ids(0, 2, family="Ascend310P")


# --- replicas -----------------------------------------------------------------------------------------------


def all_replicas(topology: Topology) -> list[str]:
    return sorted(topology.chip_of)


def test_replicas_spread_over_a_ring_first() -> None:
    topology = topology_for(board(ATLAS800, 8), replicas=4)
    assert preferred(topology, all_replicas(topology), [], 4) == [f"Ascend910-{i}-0" for i in range(4)]


def test_replicas_second_round_only_after_every_chip_has_one() -> None:
    topology = topology_for(board(ATLAS800, 8), replicas=4)
    got = preferred(topology, all_replicas(topology), [], 10)
    assert got == ["Ascend910-0-0", "Ascend910-0-1", "Ascend910-1-0", "Ascend910-1-1"] + [
        f"Ascend910-{i}-0" for i in range(2, 8)
    ]


def test_replica_in_must_include_counts_for_its_chip() -> None:
    topology = topology_for(board(ATLAS800, 8), replicas=2)
    got = preferred(topology, all_replicas(topology), ["Ascend910-5-0"], 2)
    assert got == ["Ascend910-5-0", "Ascend910-4-0"]


def test_chip_is_available_when_any_replica_is() -> None:
    topology = topology_for(board(ATLAS800, 8), replicas=2)
    available = ["Ascend910-0-1", "Ascend910-4-0", "Ascend910-4-1", "Ascend910-5-1", "Ascend910-6-0"]
    assert preferred(topology, available, [], 2) == ["Ascend910-4-0", "Ascend910-5-1"]


def test_replicas_of_one_chip_when_nothing_else_is_free() -> None:
    topology = topology_for(board(DUO, 2), replicas=4)
    available = ["Ascend310P-1-3", "Ascend310P-1-0", "Ascend310P-1-2"]
    assert preferred(topology, available, [], 2) == ["Ascend310P-1-0", "Ascend310P-1-2"]


def test_replica_index_sorts_numerically() -> None:
    topology = topology_for(board(DUO, 1), replicas=12)
    available = ["Ascend310P-0-10", "Ascend310P-0-9", "Ascend310P-0-11"]
    assert preferred(topology, available, [], 2) == ["Ascend310P-0-9", "Ascend310P-0-10"]


# --- edges --------------------------------------------------------------------------------------------------


def test_unknown_ids_only_as_last_resort() -> None:
    topology = topology_for(board(ATLAS800, 8))
    assert preferred(topology, ["zz", "Ascend910-0", "aa"], [], 2) == ["Ascend910-0", "aa"]
    assert preferred(topology, ["zz", "Ascend910-0", "aa"], [], 5) == ["Ascend910-0", "aa", "zz"]


def test_unknown_must_include_comes_first() -> None:
    topology = topology_for(board(ATLAS800, 8))
    assert preferred(topology, ids(0, 1), ["other"], 2) == ["other", "Ascend910-0"]


@pytest.mark.parametrize("size", [0, -1])
def test_no_size_no_ids(size: int) -> None:
    assert preferred(topology_for(board(ATLAS800, 8)), ids(0, 1), ids(0), size) == []


def test_size_below_must_include_returns_part_of_it() -> None:
    topology = topology_for(board(ATLAS800, 8))
    assert preferred(topology, ids(0, 1, 2), ids(2, 1, 0), 2) == ids(0, 1)


def test_duplicates_are_ignored() -> None:
    topology = topology_for(board(ATLAS800, 8))
    assert preferred(topology, ids(5, 5, 6, 6, 0), ids(5, 5), 3) == ids(5, 0, 6)


def test_inconsistent_topology_does_not_raise() -> None:
    topology = Topology(Layout.RINGS, {"a": 0}, {}, {"a": "a", "b": "b", "c": "x"}, {"b": 1})
    assert sorted(preferred(topology, ["a", "b", "c", "d"], ["b"], 3)) == ["a", "b", "c"]
    assert preferred(Topology(Layout.MODULES, {}, {}, {"a": "a"}, {}), ["a"], [], 1) == ["a"]


# --- properties ---------------------------------------------------------------------------------------------

MODELS = [ATLAS800, A2, A3, DUO]


@st.composite
def requests(draw: st.DrawFn) -> tuple[Topology, list[str], list[str], int]:
    model = draw(st.sampled_from(MODELS))
    phys_ids = draw(st.sets(st.integers(0, 15), min_size=1, max_size=16))
    numa = {i: draw(st.none() | st.integers(0, 3)) for i in phys_ids}
    chips = [Chip.make(i, model, numa_node=numa[i]) for i in phys_ids]
    topology = topology_for(chips, replicas=draw(st.integers(1, 8)))
    universe = [*sorted(topology.chip_of), "stray-0", "stray-1", f"{chips[0].device_id}-x"]
    available = draw(st.lists(st.sampled_from(universe), max_size=len(universe) + 4))
    must = draw(st.lists(st.sampled_from(universe), max_size=6))
    size = draw(st.integers(-1, len(universe) + 2))
    return topology, available, must, size


def known(topology: Topology, devices: Iterable[str]) -> set[str]:
    return {device for device in devices if device in topology.chip_of}


@settings(max_examples=400, deadline=None)
@given(requests(), st.randoms(use_true_random=False))
def test_properties(request: tuple[Topology, list[str], list[str], int], random: Random) -> None:
    topology, available, must, size = request
    got = preferred(topology, available, must, size)
    pool = set(available) | set(must)
    assert len(got) == len(set(got)) == max(0, min(size, len(pool)))
    assert set(got) <= pool
    if size >= len(set(must)):
        assert set(must) <= set(got)
        assert set(got[: len(set(must))]) == set(must)
        if set(got) - known(topology, got) - set(must):
            assert known(topology, available) <= set(got)
    shuffled_available, shuffled_must = list(available), list(must)
    random.shuffle(shuffled_available)
    random.shuffle(shuffled_must)
    assert preferred(topology, shuffled_available, shuffled_must, size) == got


@settings(max_examples=200, deadline=None)
@given(requests())
def test_replicas_are_spread(request: tuple[Topology, list[str], list[str], int]) -> None:
    topology, available, _, size = request
    got = preferred(topology, available, [], size)
    per_chip: dict[str, int] = {}
    for device in known(topology, got):
        per_chip[topology.chip_of[device]] = per_chip.get(topology.chip_of[device], 0) + 1
    chips_free = {topology.chip_of[device] for device in known(topology, available)}
    if per_chip and max(per_chip.values()) > 1:
        assert set(per_chip) == chips_free
