"""The per-chip gauges npu-smi's answers feed: temperature, power, utilisation, HBM and memory from the
``npu-smi info`` table. Series of chips no longer seen are removed, so ``/metrics`` never shows a stale
value::

    telemetry = ChipTelemetry()
    telemetry.record({"Ascend910-0": row})             # row: the chip's ChipRow of the table
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

from prometheus_client import Gauge

from ascend_agent.backends.npusmi import ChipRow
from ascend_agent.observability import (
    CHIP_HBM_TOTAL,
    CHIP_HBM_USED,
    CHIP_MEMORY_TOTAL,
    CHIP_MEMORY_USED,
    CHIP_POWER,
    CHIP_TEMPERATURE,
    CHIP_UTILIZATION,
)

_MIB = 1024 * 1024


def _bytes(mebibytes: int | None) -> int | None:
    return None if mebibytes is None else mebibytes * _MIB


# Each gauge and what it shows of a chip's row of the table.
_TELEMETRY: tuple[tuple[Gauge, Callable[[ChipRow], float | None]], ...] = (
    (CHIP_TEMPERATURE, lambda row: row.temp_c),
    (CHIP_POWER, lambda row: row.power_w),
    (CHIP_UTILIZATION, lambda row: None if row.utilization_pct is None else row.utilization_pct / 100),
    (CHIP_HBM_USED, lambda row: _bytes(row.hbm_used_mb)),
    (CHIP_HBM_TOTAL, lambda row: _bytes(row.hbm_total_mb)),
    (CHIP_MEMORY_USED, lambda row: _bytes(row.memory_used_mb)),
    (CHIP_MEMORY_TOTAL, lambda row: _bytes(row.memory_total_mb)),
)


class ChipTelemetry:
    """Keeps the chip gauges in step with the last answers, per device ID."""

    def __init__(self) -> None:
        self._devices: set[str] = set()

    def record(self, rows: Mapping[str, ChipRow]) -> None:
        """Temperature, power, utilisation, HBM and memory of every chip, as the table printed them."""
        for device, row in rows.items():
            for gauge, value in _TELEMETRY:
                _set_or_remove(gauge, device, value(row))
        for device in self._devices - set(rows):
            for gauge, _ in _TELEMETRY:
                _set_or_remove(gauge, device, None)
        self._devices = set(rows)


def _set_or_remove(gauge: Gauge, device: str, value: float | None) -> None:
    """A value the table printed; a cell it left ``NA`` or ``-`` removes the series."""
    if value is None:
        with contextlib.suppress(KeyError):
            gauge.remove(device)
    else:
        gauge.labels(device=device).set(value)
