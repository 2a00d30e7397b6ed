"""The health pipeline makes the hot reset the first time ``hotReset`` is on, at start or at a reload, hands
back the one a reload made (its task is the caller's to start), and keeps it from then on."""

from __future__ import annotations

from dataclasses import replace

from ascend_agent.config import Settings
from ascend_agent.health.hotreset.manager import HotReset
from ascend_agent.health.pipeline import HealthPipeline

OFF = Settings(backend="fake", hot_reset="off")
IDLE = replace(OFF, hot_reset="idle")
DRY_RUN = replace(OFF, hot_reset="dry-run")


class _Factory:
    def __init__(self) -> None:
        self.made: list[HotReset] = []

    def __call__(self, settings: Settings) -> HotReset:
        async def nothing() -> None:
            return None

        resets = HotReset(
            settings, resetter=lambda: None, held=lambda: None, refresh_holders=nothing, wake=lambda: None
        )
        self.made.append(resets)
        return resets


async def test_off_at_start_then_turned_on_by_a_reload() -> None:
    factory = _Factory()
    health = HealthPipeline(OFF, make_resets=factory)
    assert (health.resets, factory.made) == (None, [])
    assert health.configure(OFF) is None
    made = health.configure(IDLE)
    assert made is not None and factory.made == [made] and health.resets is made
    assert made.mode == "idle"


async def test_once_made_it_stays_and_is_configured_not_made_again() -> None:
    factory = _Factory()
    health = HealthPipeline(DRY_RUN, make_resets=factory)
    (made,) = factory.made
    assert health.resets is made
    for settings in (OFF, IDLE):
        assert health.configure(settings) is None, "only a hot reset made by this reload is handed back"
        assert health.resets is made and made.mode == settings.hot_reset
    assert factory.made == [made]


async def test_without_a_factory_there_is_no_hot_reset() -> None:
    health = HealthPipeline(IDLE)
    assert health.resets is None
    assert health.configure(DRY_RUN) is None and health.resets is None
