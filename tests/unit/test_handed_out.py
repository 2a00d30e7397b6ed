"""What Allocate handed over: held from the Allocate until PodResources listed it and then no longer does, or
until no answer listed it within the grace; an answer asked before the Allocate says nothing."""

from __future__ import annotations

from pathlib import Path

from ascend_agent.cluster.volcano import VolcanoPods
from ascend_agent.cluster.volcano_marks import PodView
from ascend_agent.kubelet.handed_out import HandedOut
from ascend_agent.kubelet.holders import Holdings
from ascend_agent.kubelet.podresources import PodHolders
from ascend_agent.model import Chip, Holder, Holders, Inventory
from tests.support.clock import ManualClock

TWO = "huawei.com/Ascend310P-2c"
KEY = (TWO, "Ascend310P-2c-118-1")


def test_held_until_listed_and_then_no_longer() -> None:
    clock = ManualClock(100.0)
    handed = HandedOut(clock, grace=60)
    handed.observe(set(), 100.0)
    handed.record(TWO, ["Ascend310P-2c-118-1"])
    handed.observe(set(), 99.5)  # asked before the Allocate
    handed.observe(set(), 100.2)  # the kubelet has not recorded the pod yet
    assert handed.device_ids() == {"Ascend310P-2c-118-1"}
    handed.observe({KEY}, 100.5)
    handed.observe({KEY}, 130.0)
    assert handed.device_ids() == {"Ascend310P-2c-118-1"}
    handed.observe(set(), 131.0)  # the pod is gone
    assert handed.device_ids() == frozenset()


def test_one_never_listed_is_let_go_after_the_grace() -> None:
    clock = ManualClock(100.0)
    handed = HandedOut(clock, grace=60)
    handed.record(TWO, ["Ascend310P-2c-118-1", "Ascend310P-2c-117-1"])
    handed.observe({(TWO, "Ascend310P-2c-117-1")}, 159.0)
    assert handed.device_ids() == {"Ascend310P-2c-118-1", "Ascend310P-2c-117-1"}
    handed.observe({(TWO, "Ascend310P-2c-117-1")}, 161.0)
    assert handed.device_ids() == {"Ascend310P-2c-117-1"}


def test_handed_out_again_counts_from_the_new_allocate() -> None:
    clock = ManualClock(100.0)
    handed = HandedOut(clock, grace=60)
    handed.record(TWO, ["Ascend310P-2c-118-1"])
    handed.observe({KEY}, 101.0)
    clock.now = 200.0
    handed.record(TWO, ["Ascend310P-2c-118-1"])  # freed and handed to another pod meanwhile
    handed.observe(set(), 150.0)  # an answer from before the second Allocate
    handed.observe(set(), 200.1)
    assert handed.device_ids() == {"Ascend310P-2c-118-1"}


async def test_with_volcano_what_was_handed_over_is_seen_under_the_chip_really_mounted(
    short_dir: Path,
) -> None:
    """``--volcano``: the kubelet charged ``Ascend910-0`` and Allocate handed over chip 3, Volcano's choice.
    PodResources lists the pod under ``Ascend910-0``; that is chip 3 being seen, and the pod gone from
    PodResources frees chip 3 at once (not after the grace). The vNPU layout is told chip 3 is held, not
    ``Ascend910-0``."""
    t = "huawei.com/Ascend910"
    pods = VolcanoPods()
    pods.observe(Inventory(tuple(Chip.make(n, "910B3") for n in range(8))))
    pods._store(PodView("team-a", "train", "uid-train", {t: "Ascend910-3", "predicate-time": "1"}, {t: 1}))
    holdings = Holdings(PodHolders(short_dir / "pod-resources.sock", 5.0), pods.follow_mounted)
    clock = ManualClock(100.0)
    holdings.handed_out = HandedOut(clock=clock)

    assert await pods.remap(t, [["Ascend910-0"]]) == [["Ascend910-3"]]
    holdings.allocated(t, ["Ascend910-3"])  # what the plugin layer calls with the devices handed over
    clock.now += 1
    listed = Holders({(t, "Ascend910-0"): (Holder("team-a", "train", "main"),)})
    holdings.pods.holders = listed
    holdings.pods.on_answer(listed, clock.now)
    assert holdings.held_devices() == {"Ascend910-3"}

    clock.now += 1
    holdings.pods.holders = Holders()
    holdings.pods.on_answer(Holders(), clock.now)
    assert holdings.handed_out.device_ids() == frozenset(), "PodResources showed chip 3 freed"
