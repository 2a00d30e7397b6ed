"""What Allocate handed over: held from the Allocate until PodResources listed it and then no longer does, or
until no answer listed it within the grace; an answer asked before the Allocate says nothing."""

from __future__ import annotations

from ascend_agent.handed_out import HandedOut

TWO = "huawei.com/Ascend310P-2c"
KEY = (TWO, "Ascend310P-2c-118-1")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_held_until_listed_and_then_no_longer() -> None:
    clock = Clock()
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
    clock = Clock()
    handed = HandedOut(clock, grace=60)
    handed.record(TWO, ["Ascend310P-2c-118-1", "Ascend310P-2c-117-1"])
    handed.observe({(TWO, "Ascend310P-2c-117-1")}, 159.0)
    assert handed.device_ids() == {"Ascend310P-2c-118-1", "Ascend310P-2c-117-1"}
    handed.observe({(TWO, "Ascend310P-2c-117-1")}, 161.0)
    assert handed.device_ids() == {"Ascend310P-2c-117-1"}


def test_handed_out_again_counts_from_the_new_allocate() -> None:
    clock = Clock()
    handed = HandedOut(clock, grace=60)
    handed.record(TWO, ["Ascend310P-2c-118-1"])
    handed.observe({KEY}, 101.0)
    clock.now = 200.0
    handed.record(TWO, ["Ascend310P-2c-118-1"])  # freed and handed to another pod meanwhile
    handed.observe(set(), 150.0)  # an answer from before the second Allocate
    handed.observe(set(), 200.1)
    assert handed.device_ids() == {"Ascend310P-2c-118-1"}
