"""The flap hold over a clock the test moves: no sleeping."""

from __future__ import annotations

import doctest

from ascend_agent.health import flaphold
from ascend_agent.health.flaphold import FlapHold, HoldEvent, HoldStep
from tests.support.clock import ManualClock


def _hold(clock: ManualClock, threshold: int = 3, window: float = 600, quiet: float = 600) -> FlapHold:
    return FlapHold(threshold=threshold, window=window, quiet=quiet, clock=clock)


def _flap(hold: FlapHold, clock: ManualClock, times: int, step: float = 10) -> list[HoldStep]:
    steps = []
    for _ in range(times):
        steps.append(hold.observe("a", healthy=False))
        clock.now += step
        steps.append(hold.observe("a", healthy=True))
        clock.now += step
    return steps


def test_doctests() -> None:
    assert doctest.testmod(flaphold).failed == 0


def test_a_chip_that_recovers_once_comes_back_at_once() -> None:
    clock = ManualClock()
    hold = _hold(clock)
    assert _flap(hold, clock, 2) == [HoldStep(held=False)] * 4


def test_the_third_turn_within_the_window_starts_a_hold() -> None:
    clock = ManualClock()
    hold = _hold(clock)
    _flap(hold, clock, 2)
    assert hold.observe("a", healthy=False) == HoldStep(held=True, event=HoldEvent.STARTED)
    clock.now += 1
    assert hold.observe("a", healthy=False) == HoldStep(held=True), "the same state again is no new event"
    assert hold.observe("a", healthy=True) == HoldStep(held=True)
    assert hold.observe("b", healthy=True) == HoldStep(held=False), "devices are held one by one"


def test_the_hold_ends_after_the_quiet_period_healthy() -> None:
    clock = ManualClock()
    hold = _hold(clock, quiet=300)
    _flap(hold, clock, 2)
    hold.observe("a", healthy=False)
    assert hold.seconds_to_release() is None, "held, but not Healthy: nothing to wait for"
    clock.now += 5
    hold.observe("a", healthy=True)
    assert hold.seconds_to_release() == 300
    clock.now += 299
    assert hold.seconds_to_release() == 1
    assert hold.observe("a", healthy=True) == HoldStep(held=True)
    clock.now += 1
    assert hold.seconds_to_release() == 0
    assert hold.observe("a", healthy=True) == HoldStep(held=False, event=HoldEvent.ENDED)
    assert hold.seconds_to_release() is None
    assert hold.observe("a", healthy=False) == HoldStep(held=False), "the count starts over after a hold"


def test_a_fault_during_the_quiet_period_restarts_it() -> None:
    clock = ManualClock()
    hold = _hold(clock, quiet=300)
    _flap(hold, clock, 3)
    clock.now += 200
    assert hold.observe("a", healthy=False).held
    clock.now += 10
    hold.observe("a", healthy=True)
    clock.now += 290
    assert hold.observe("a", healthy=True) == HoldStep(held=True)
    clock.now += 10
    assert hold.observe("a", healthy=True).event is HoldEvent.ENDED


def test_turns_older_than_the_window_do_not_count() -> None:
    clock = ManualClock()
    hold = _hold(clock, window=100)
    _flap(hold, clock, 2, step=20)  # turns at 0 and 40
    clock.now += 40  # the third turn at 120: the one at 0 is out of the window
    assert hold.observe("a", healthy=False) == HoldStep(held=False)
    clock.now += 10
    hold.observe("a", healthy=True)
    assert hold.observe("a", healthy=False).event is HoldEvent.STARTED


def test_threshold_zero_never_holds() -> None:
    clock = ManualClock()
    hold = _hold(clock, threshold=0)
    assert not any(step.held for step in _flap(hold, clock, 10))
    assert hold.seconds_to_release() is None


def test_the_reason_names_the_settings() -> None:
    reason = _hold(ManualClock(), threshold=3, window=600, quiet=120).reason()
    assert (
        reason
        == "held Unhealthy: it turned Unhealthy 3 times within 600 s; it comes back once Healthy for 120 s"
    )
