"""The health timer outlives any error of one query: a backend that raises once is asked again."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio
import pytest

from ascend_agent.config import Settings
from ascend_agent.model import Chip, Inventory
from ascend_agent.reconciler import Agent


class _FlakyBackend:
    """A backend whose first health query raises, as a bug or an exhausted node would make it."""

    def __init__(self) -> None:
        self.queries = 0
        self.asked_again = anyio.Event()

    @property
    def health_interval(self) -> float | None:
        return 0.01

    async def start(self) -> None:
        return None

    def watch_paths(self) -> Sequence[tuple[Path, Callable[[str], bool]]]:
        return []

    async def query(self) -> bool:
        self.queries += 1
        if self.queries == 2:  # the first timer query; the first of all is the agent's start-up one
            raise OSError(24, "Too many open files")
        if self.queries >= 3:
            self.asked_again.set()
        return False

    async def discover(self) -> Inventory:
        return Inventory(chips=(Chip.make(0, "910B4"),))

    async def close(self) -> None:
        return None


async def test_a_query_that_raises_does_not_end_health_checking(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _FlakyBackend()
    agent = Agent(Settings(kubelet_dir=short_dir / "kubelet", metrics_address=""), backend)
    with caplog.at_level(logging.ERROR, logger="ascend_agent.reconciler"):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(agent.run)
            with anyio.fail_after(10):
                await backend.asked_again.wait()
            tasks.cancel_scope.cancel()
    (line,) = [r.getMessage() for r in caplog.records if "Health query failed unexpectedly" in r.getMessage()]
    assert "OSError: [Errno 24] Too many open files" in line
    assert backend.queries >= 3
