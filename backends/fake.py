"""Synthetic chips with scriptable faults, for development and CI.

``--fake-chips 8 --fake-model 910B4`` gives eight healthy chips split over two NUMA nodes; a state file
(``--fake-state``) scripts faults, re-read on every discovery::

    {"unhealthy": [3], "absent": [7]}

An absent chip stays listed as Unhealthy, as a chip that fell off the bus does on a real node. The file
must exist when the backend starts; one removed later, or turned invalid, leaves the previous state in place.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import aiofiles

from ascend_agent.backends._container import container_base
from ascend_agent.config import ConfigError, Settings, decode_utf8
from ascend_agent.model import (
    Chip,
    DeviceNode,
    Generation,
    Health,
    Inventory,
    UnknownModelError,
    classify,
)
from ascend_agent.observability import ProblemLog, log_fields

log = logging.getLogger(__name__)

_MANAGEMENT_DEVICES = tuple(
    DeviceNode(host_path=path, container_path=path)
    for path in ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
)
_NUMA_NODES = 2
# HBM per chip (die on A3) in MiB, as npu-smi's table prints it; 310 chips have none.
_HBM_MB = {
    Generation.ASCEND910A: 32768,
    Generation.ASCEND910B: 65536,
    Generation.ASCEND910A3: 65536,
    Generation.ASCEND950: 131072,
}
_HBM_MB_BY_MODEL = {"910B4": 32768}


@dataclass(frozen=True, slots=True)
class FaultState:
    """The faults a state file scripts: physical ids that are unhealthy or absent."""

    unhealthy: frozenset[int] = frozenset()
    absent: frozenset[int] = frozenset()


def parse_state(text: str, source: str) -> FaultState:
    """``{"unhealthy": [..], "absent": [..]}``; :class:`ValueError` says what is wrong with ``source``."""
    try:
        document = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"fake state file {source} is not valid JSON (line {exc.lineno})") from None
    if not isinstance(document, dict):
        raise ValueError(
            f'fake state file {source} must be an object like {{"unhealthy": [1], "absent": []}}'
        )
    unknown = set(document) - {"unhealthy", "absent"}
    if unknown:
        raise ValueError(
            f"fake state file {source}: unknown key {sorted(unknown)[0]!r} (keys: unhealthy, absent)"
        )
    lists: dict[str, frozenset[int]] = {}
    for key in ("unhealthy", "absent"):
        ids = document.get(key, [])
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"fake state file {source}: {key} must be a list of physical ids")
        lists[key] = frozenset(ids)
    return FaultState(**lists)


class FakeBackend:
    """The Backend protocol over synthetic chips."""

    def __init__(self, settings: Settings) -> None:
        try:
            classify(settings.fake_model)
        except UnknownModelError:
            raise ConfigError(
                f"--fake-model {settings.fake_model!r} is not an Ascend chip "
                "(try 910B4, 910A, 910_9392, 950PR, 310P3, 310)"
            ) from None
        self._settings = settings
        # A3 boards have two dies per NPU id; every other model one chip per NPU id.
        self._dies_per_npu = 2 if classify(settings.fake_model) is Generation.ASCEND910A3 else 1
        self._state = FaultState()
        self._state_problem = ProblemLog()
        self._out_of_range = ProblemLog()

    @property
    def health_interval(self) -> float | None:
        return None

    def watch_paths(self) -> Sequence[tuple[Path, Callable[[str], bool]]]:
        state = self._settings.fake_state
        if state is None:
            return []
        return [(state.parent, lambda name: name == state.name)]

    async def query(self) -> bool:
        return False

    async def start(self) -> None:
        await self._load_state()

    async def _load_state(self) -> None:
        """Read the state file, raising :class:`ConfigError` when it is missing, unreadable or invalid."""
        path = self._settings.fake_state
        if path is None:
            return
        try:
            async with aiofiles.open(path, "rb") as handle:
                data = await handle.read()
        except FileNotFoundError:
            raise ConfigError(f"fake state file {path} does not exist (an empty one is {{}})") from None
        except OSError as exc:
            raise ConfigError(f"cannot read fake state file {path}: {exc.strerror or exc}") from None
        try:
            state = parse_state(decode_utf8(data, f"fake state file {path}"), str(path))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self._warn_out_of_range(path, state)
        self._state = state

    def _warn_out_of_range(self, path: Path, state: FaultState) -> None:
        """One warning per change of the ids that name no chip: a typo there would fault nothing."""
        chips = self._settings.fake_chips
        out_of_range = tuple(sorted(i for i in state.unhealthy | state.absent if not 0 <= i < chips))
        if self._out_of_range.changed(out_of_range) and out_of_range:
            log.warning(
                "fake state file %s names chips that do not exist: %s (%d chips, ids 0-%d); ignored",
                path,
                ", ".join(map(str, out_of_range)),
                chips,
                chips - 1,
                extra=log_fields(path=path, ids=list(out_of_range)),
            )

    async def discover(self) -> Inventory:
        try:
            await self._load_state()
            self._state_problem.clear()
        except ConfigError as exc:
            if self._state_problem.changed(str(exc)):
                log.warning(
                    "%s; keeping the previous state",
                    exc,
                    extra=log_fields(path=self._settings.fake_state, reason=str(exc)),
                )
        return Inventory(
            chips=tuple(self._chip(i) for i in range(self._settings.fake_chips)),
            container=container_base(self._settings.mode, _MANAGEMENT_DEVICES),
        )

    def _chip(self, phys_id: int) -> Chip:
        chips = self._settings.fake_chips
        chip = Chip.make(
            phys_id,
            self._settings.fake_model,
            bus_id=f"0000:{0x10 + phys_id:02x}:00.0",
            numa_node=phys_id * _NUMA_NODES // chips,
            npu_id=phys_id // self._dies_per_npu,
            naming_scheme=self._settings.resource_naming,
        )
        chip = replace(chip, hbm_mb=_HBM_MB_BY_MODEL.get(chip.model, _HBM_MB.get(chip.generation)))
        if phys_id in self._state.absent:
            return chip.with_health(Health.UNHEALTHY, "absent: the device node is gone")
        if phys_id in self._state.unhealthy:
            return chip.with_health(Health.UNHEALTHY, "fault scripted in the state file")
        return chip

    async def close(self) -> None:
        return None
