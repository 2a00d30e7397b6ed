"""A config reload that restarts the backend makes its file watches again: an edit written between the
reload's read of the file and the new watch is in no event, and must still be applied."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from ascend_agent import reconciler as agent_module
from ascend_agent.backends import Backend, backend_for
from ascend_agent.config import Settings, SettingsSource
from ascend_agent.model import Inventory
from ascend_agent.reconciler import Agent


def _write_config(path: Path, settings: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(yaml.safe_dump(settings))
    os.replace(temporary, path)


class _EditedWhileStarting:
    """The fake backend, whose start runs a second edit of the config file first: it lands after the reload
    read the file and before the agent watches the file again, with no turn of the event loop between."""

    def __init__(self, inner: Backend, edit: Callable[[], None]) -> None:
        self._inner = inner
        self._edit = edit

    @property
    def health_interval(self) -> float | None:
        return self._inner.health_interval

    async def start(self) -> None:
        self._edit()
        await self._inner.start()

    def watch_paths(self) -> Sequence[tuple[Path, Callable[[str], bool]]]:
        return self._inner.watch_paths()

    async def query(self) -> bool:
        return await self._inner.query()

    async def discover(self) -> Inventory:
        return await self._inner.discover()

    async def close(self) -> None:
        await self._inner.close()


class _Applied(logging.Handler):
    """Sets ``event`` when the agent logs that a config with ``what`` changed was applied."""

    def __init__(self, what: str, event: anyio.Event) -> None:
        super().__init__()
        self._what = what
        self._event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == f"Config applied: {self._what} changed":
            self._event.set()


@pytest.fixture
def root_logging() -> Iterator[None]:
    """A reload configures logging (the root logger's handlers): put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


async def test_an_edit_between_the_reload_and_the_new_watch_is_applied(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch, root_logging: None
) -> None:
    path = short_dir / "config.yaml"
    written: dict[str, Any] = {
        "backend": "fake",
        "kubeletDir": str(short_dir / "kubelet"),
        "metricsAddress": "",
    }
    _write_config(path, written)
    source = SettingsSource(overrides={}, config_file=path)
    settings = source.load()

    def second_edit() -> None:
        _write_config(path, {**written, "fakeChips": 4, "replicas": 2})

    def new_backend(new: Settings) -> Backend:
        return _EditedWhileStarting(backend_for(new), second_edit)

    monkeypatch.setattr(agent_module, "backend_for", new_backend)
    agent = Agent(settings, backend_for(settings), source)
    replicas_applied = anyio.Event()
    handler = _Applied("replicas", replicas_applied)
    logging.getLogger("ascend_agent.reconciler").addHandler(handler)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(agent.run)
            _write_config(path, {**written, "fakeChips": 4})  # a new backend
            agent.reload()
            with anyio.fail_after(10):
                await replicas_applied.wait()
            tasks.cancel_scope.cancel()
    finally:
        logging.getLogger("ascend_agent.reconciler").removeHandler(handler)
    assert agent.settings.fake_chips == 4
    assert agent.settings.replicas == 2
