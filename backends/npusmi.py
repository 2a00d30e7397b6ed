"""Running ``npu-smi`` (asynchronously, with a timeout) and parsing what it prints.

Parsers read the table by its ``|`` columns and its header rows, never by fixed offsets, so the widths of
every release (21.x to 26.x) parse alike. Whatever the input, a parser raises only :class:`NpuSmiParseError`::

    table = parse_info(text)                      # `npu-smi info`
    table = await query_info("npu-smi", timeout=10)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")


class NpuSmiParseError(ValueError):
    """The text is not what the npu-smi command prints."""


class NpuSmiError(Exception):
    """Running npu-smi failed; ``reason`` is one of missing, timeout, exit, output."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ChipRow:
    """One chip of the ``npu-smi info`` table."""

    npu_id: int
    chip: int
    device: int | None
    name: str
    health: str
    bus_id: str | None
    power_w: float | None
    temp_c: int | None
    aicore_pct: int | None
    memory_used_mb: int | None
    memory_total_mb: int | None
    hbm_used_mb: int | None
    hbm_total_mb: int | None


@dataclass(frozen=True, slots=True)
class ProcessRow:
    npu_id: int
    chip: int
    pid: int
    name: str
    memory_mb: int | None


@dataclass(frozen=True, slots=True)
class InfoTable:
    version: str | None
    chips: tuple[ChipRow, ...]
    processes: tuple[ProcessRow, ...]


@dataclass(frozen=True, slots=True)
class MapRow:
    """One row of ``npu-smi info -m``; MCU rows have no logic id."""

    npu_id: int
    chip_id: int
    logic_id: int | None
    name: str


@dataclass(frozen=True, slots=True)
class HealthDetail:
    status: str
    error_code: str | None
    error_information: str | None


def _typed_errors(parse: Callable[_P, _T]) -> Callable[_P, _T]:
    """Turn any slip on unexpected input into NpuSmiParseError, the one error callers handle."""

    @functools.wraps(parse)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return parse(*args, **kwargs)
        except NpuSmiParseError:
            raise
        except (ValueError, IndexError, KeyError, TypeError, AttributeError) as exc:
            raise NpuSmiParseError(
                f"{parse.__name__}: unexpected text ({type(exc).__name__}: {exc})"
            ) from None

    return wrapper


_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_VERSION = re.compile(r"Version:\s*(\S+)")
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?\d+(\.\d+)?$")


def _cells(line: str) -> list[str] | None:
    """The cells of a ``| a | b | c |`` row, stripped; None for borders and other lines."""
    stripped = line.strip()
    if not stripped.startswith("|"):
        return None
    return [cell.strip() for cell in stripped.strip("|").split("|")]


def _int(token: str | None) -> int | None:
    return int(token) if token is not None and _INT.match(token) else None


def _float(token: str | None) -> float | None:
    return float(token) if token is not None and _FLOAT.match(token) else None


def _pairs(text: str) -> list[tuple[int | None, int | None]]:
    """``0    / 0   4175 / 65536`` -> [(0, 0), (4175, 65536)]."""
    return [(_int(a), _int(b)) for a, b in re.findall(r"(\S+)\s*/\s*(\S+)", text)]


@_typed_errors
def parse_info(text: str) -> InfoTable:
    """The chips (and processes) of ``npu-smi info``.

    >>> table = parse_info(open("tests/fixtures/npu-smi/910B4x8-25.0.rc1.1-info.txt").read())
    >>> len(table.chips), table.chips[0].name, table.chips[0].bus_id
    (8, '910B4', '0000:C1:00.0')
    """
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if _is_chip_header(_cells(line))), None)
    if header is None:
        raise NpuSmiParseError("not an `npu-smi info` table: no 'NPU  Name | Health' header row")
    version_match = next((m for line in lines[:header] if (m := _VERSION.search(line))), None)
    second = _cells(lines[header + 1]) if header + 1 < len(lines) else None
    if second is None or not second[0].startswith("Chip"):
        raise NpuSmiParseError("`npu-smi info`: the 'Chip | Bus-Id' header row is missing")
    has_device = "Device" in second[0] or "Phy-ID" in second[0]
    chips: list[ChipRow] = []
    processes: list[ProcessRow] = []
    npu: list[str] | None = None
    in_processes = False
    for line in lines[header + 2 :]:
        cells = _cells(line)
        if cells is None:
            continue
        if any("Process id" in cell for cell in cells):
            in_processes = True
            continue
        if in_processes:
            process = _process_row(cells)
            if process is not None:
                processes.append(process)
            continue
        if len(cells) != 3:
            continue
        if _is_chip_row(cells, after_npu=npu is not None):
            if npu is not None:
                chips.append(_chip_row(npu, cells, has_device))
        elif _int(cells[0].split()[0] if cells[0] else None) is not None:
            npu = cells
    if not chips:
        raise NpuSmiParseError("`npu-smi info`: the table lists no chips")
    return InfoTable(version_match.group(1) if version_match else None, tuple(chips), tuple(processes))


def _is_chip_header(cells: list[str] | None) -> bool:
    return cells is not None and len(cells) >= 2 and cells[0].startswith("NPU") and "Name" in cells[0]


def _is_chip_row(cells: list[str], *, after_npu: bool) -> bool:
    tokens = cells[0].split()
    if not tokens or not all(_INT.match(t) for t in tokens) or len(tokens) > 2:
        return False
    return bool(_BUS_ID.match(cells[1])) or (after_npu and cells[1].upper() in ("NA", "", "-"))


def _chip_row(npu: list[str], cells: list[str], has_device: bool) -> ChipRow:
    npu_tokens = npu[0].split(None, 1)
    chip_tokens = cells[0].split()
    power_temp = npu[2].split()
    usage = _pairs(cells[2])
    memory = usage[0] if usage else (None, None)
    hbm = usage[1] if len(usage) > 1 else (None, None)
    return ChipRow(
        npu_id=int(npu_tokens[0]),
        chip=int(chip_tokens[0]),
        device=int(chip_tokens[1]) if has_device and len(chip_tokens) > 1 else None,
        name=npu_tokens[1].strip() if len(npu_tokens) > 1 else "",
        health=npu[1],
        bus_id=cells[1] if _BUS_ID.match(cells[1]) else None,
        power_w=_float(power_temp[0]) if power_temp else None,
        temp_c=_int(power_temp[1]) if len(power_temp) > 1 else None,
        aicore_pct=_int(cells[2].split()[0]) if cells[2].split() else None,
        memory_used_mb=memory[0],
        memory_total_mb=memory[1],
        hbm_used_mb=hbm[0],
        hbm_total_mb=hbm[1],
    )


def _process_row(cells: list[str]) -> ProcessRow | None:
    if len(cells) < 4:
        return None
    ids = cells[0].split()
    if len(ids) != 2 or not all(_INT.match(t) for t in ids) or not _INT.match(cells[1]):
        return None
    return ProcessRow(
        int(ids[0]), int(ids[1]), int(cells[1]), cells[2], _int(cells[3].split()[0] if cells[3] else None)
    )


def _key_value_lines(text: str) -> list[tuple[str, str]]:
    pairs = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            pairs.append((key.strip(), value.strip()))
    return pairs


@_typed_errors
def parse_key_values(text: str) -> dict[str, str]:
    """``key : value`` lines of ``npu-smi info -t <type> -i <id>``; the first occurrence of a key wins."""
    values: dict[str, str] = {}
    for key, value in _key_value_lines(text):
        values.setdefault(key, value)
    if not values:
        raise NpuSmiParseError("no 'key : value' lines")
    return values


@_typed_errors
def parse_info_list(text: str) -> dict[int, int]:
    """``npu-smi info -l``: NPU id -> chip count."""
    counts: dict[int, int] = {}
    total: int | None = None
    npu: int | None = None
    for key, value in _key_value_lines(text):
        if key == "Total Count":
            total = _int(value)
        elif key == "NPU ID":
            npu = _int(value)
            if npu is None:
                raise NpuSmiParseError(f"`npu-smi info -l`: NPU ID {value!r} is not a number")
            counts[npu] = 1
        elif key == "Chip Count" and npu is not None:
            count = _int(value)
            if count is None or count < 0:
                raise NpuSmiParseError(
                    f"`npu-smi info -l`: Chip Count {value!r} of NPU {npu} is not a number"
                )
            counts[npu] = count
    if not counts:
        raise NpuSmiParseError("`npu-smi info -l` lists no NPU")
    if total is not None and total != len(counts):
        raise NpuSmiParseError(f"`npu-smi info -l`: Total Count {total} but {len(counts)} NPUs listed")
    return counts


@_typed_errors
def parse_info_map(text: str) -> tuple[MapRow, ...]:
    """``npu-smi info -m``: NPU id, chip id, logic id (None for MCU rows) and chip name."""
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if "NPU ID" in line and "Chip Name" in line), None)
    if header is None:
        raise NpuSmiParseError("not `npu-smi info -m` output: no 'NPU ID ... Chip Name' header")
    rows = []
    for line in lines[header + 1 :]:
        tokens = line.split()
        if not tokens:
            break
        if len(tokens) < 4 or not _INT.match(tokens[0]) or not _INT.match(tokens[1]):
            raise NpuSmiParseError(f"`npu-smi info -m`: unexpected row {line.strip()!r}")
        rows.append(MapRow(int(tokens[0]), int(tokens[1]), _int(tokens[2]), " ".join(tokens[3:])))
    if not rows:
        raise NpuSmiParseError("`npu-smi info -m` lists no chips")
    return tuple(rows)


@_typed_errors
def parse_health(text: str) -> HealthDetail:
    """``npu-smi info -t health -i <id>``: the status and, when not OK, the error code and text."""
    values = parse_key_values(text)
    status = values.get("Health Status")
    if status is None:
        raise NpuSmiParseError("no 'Health Status' line")

    def optional(key: str) -> str | None:
        value = values.get(key)
        return None if value in (None, "", "NA") else value

    return HealthDetail(status, optional("Error Code"), optional("Error Information"))


def physical_ids(chips: Sequence[ChipRow]) -> tuple[int, ...]:
    """The ``/dev/davinci<N>`` number of each chip, in order.

    The Device column where the table has one (310P, where NPU ids are card numbers); else the NPU id
    when every NPU has one chip (910 boards); else, for cards with several chips and no Device column
    (310), the chip's position in the table, which follows the logic ids.
    """
    if chips and all(chip.device is not None for chip in chips):
        return tuple(chip.device for chip in chips if chip.device is not None)
    per_npu: dict[int, int] = {}
    for chip in chips:
        per_npu[chip.npu_id] = per_npu.get(chip.npu_id, 0) + 1
    if all(count == 1 for count in per_npu.values()):
        return tuple(chip.npu_id for chip in chips)
    return tuple(range(len(chips)))


async def run_npu_smi(executable: str, args: Sequence[str], timeout: float) -> str:
    """Run ``executable args`` (no shell) and return its output; kill and reap it after ``timeout`` s."""
    command = " ".join([executable, *args])
    try:
        process = await asyncio.create_subprocess_exec(
            executable,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
        raise NpuSmiError("missing", f"cannot run {executable}: {exc.strerror or exc}") from None
    try:
        async with asyncio.timeout(timeout):
            stdout, stderr = await process.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise NpuSmiError("timeout", f"{command} timed out after {timeout:g} s and was killed") from None
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        said = (stderr or stdout).decode("utf-8", errors="replace").strip().splitlines()
        first = said[0] if said else "no output"
        raise NpuSmiError("exit", f"{command} exited with status {process.returncode}: {first}")
    return stdout.decode("utf-8", errors="replace")


async def query_info(executable: str, timeout: float) -> InfoTable:
    """``npu-smi info``, run and parsed; unparsable output or no chips is NpuSmiError("output")."""
    text = await run_npu_smi(executable, ["info"], timeout)
    try:
        return parse_info(text)
    except NpuSmiParseError as exc:
        raise NpuSmiError("output", f"{executable} info printed something unexpected: {exc}") from None
