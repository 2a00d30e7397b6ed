"""What the kubelet sees under each of its IDs with ``--volcano``: a permutation over the chips that sends
every held ID to the chip mounted under it; a pod's mapping goes once PodResources stops listing it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ascend_agent.cluster.volcano_marks import Mounted
from ascend_agent.kubelet.mounted import MountedChips, shown_chips
from ascend_agent.model import Chip, Health, Holder, Holders

T = "huawei.com/Ascend910"
IDS = [f"Ascend910-{i}" for i in range(8)]


@given(st.permutations(IDS), st.permutations(IDS), st.integers(0, 8))
def test_a_permutation_that_keeps_every_held_id_on_its_chip(
    kubelet_ids: list[str], chips: list[str], held: int
) -> None:
    pairs = list(zip(kubelet_ids[:held], chips[:held], strict=True))
    shown = shown_chips(pairs, IDS)
    assert sorted(shown) == IDS and sorted(shown.values()) == IDS
    assert all(shown[device_id] == chip for device_id, chip in pairs)
    mounted = {chip for _, chip in pairs}
    for device_id in set(IDS) - {device_id for device_id, _ in pairs}:
        assert shown[device_id] not in mounted, "a free ID shows a chip no pod has mounted"
        if device_id not in mounted:
            assert shown[device_id] == device_id


def test_conflicting_pairs_are_left_out() -> None:
    shown = shown_chips([("Ascend910-0", "Ascend910-3"), ("Ascend910-1", "Ascend910-3")], IDS)
    assert shown["Ascend910-0"] == "Ascend910-3" and shown["Ascend910-1"] == "Ascend910-1"
    assert shown_chips([("Ascend910-0", "Ascend910-9")], IDS) == {i: i for i in IDS}


def _devices(unhealthy: int) -> dict[str, Chip]:
    chips = [Chip.make(i, "910B3") for i in range(8)]
    return {
        c.device_id: c.with_health(Health.UNHEALTHY, "fault") if c.phys_id == unhealthy else c for c in chips
    }


def test_the_mapping_goes_once_podresources_lists_the_pod_no_more() -> None:
    woken: list[bool] = []
    mounted = MountedChips(on_change=lambda: woken.append(True))
    pod = Mounted("team-a", "train-0", T, ("Ascend910-0",), ("Ascend910-3",))
    mounted.update([pod])
    mounted.update([pod])
    assert woken == [True], "woken once per change"
    devices = _devices(unhealthy=3)
    held = Holders({(T, "Ascend910-0"): (Holder("team-a", "train-0", "main"),)})

    def unhealthy(holders: Holders, answering: bool) -> list[str]:
        listed = mounted.listed(T, devices, holders, answering) or devices
        assert sorted(listed) == IDS
        return [device_id for device_id, chip in listed.items() if not chip.healthy]

    assert unhealthy(Holders(), answering=True) == ["Ascend910-0"], "not listed yet: just allocated"
    assert unhealthy(held, answering=True) == ["Ascend910-0"]
    assert unhealthy(Holders(), answering=False) == ["Ascend910-0"], "PodResources not answering"
    assert unhealthy(Holders(), answering=True) == ["Ascend910-3"], "listed before, no more: gone"
    assert mounted.listed("huawei.com/Ascend310P", devices, held, answering=True) is None
