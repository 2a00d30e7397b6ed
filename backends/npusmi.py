"""Parsing what ``npu-smi`` prints (:mod:`.tool` runs it), and the errors of both.

Parsers read the table by its ``|`` columns and the labels of its two header rows, never by fixed offsets, so
every release's widths (20.x to 26.x) and every layout (910/310 ``NPU Name``, 310P ``Chip Device``, A3
``Chip Phy-ID``, Ascend 950's separate ``NPU ID`` and ``Name`` columns) parse alike. Whatever the input, a
parser raises only :class:`NpuSmiParseError`; running npu-smi raises only :class:`NpuSmiError`, whose message
names the cause and the next step::

    table = parse_info(text)                      # `npu-smi info`
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from ascend_agent.backends.npusmi_processes import Processes, parse_processes
from ascend_agent.model import A3_SOCS, Fault, SuperPod, normalise_model

_P = ParamSpec("_P")
_T = TypeVar("_T")


class NpuSmiParseError(ValueError):
    """The text is not what the npu-smi command prints."""


class NpuSmiError(Exception):
    """Running npu-smi failed. ``reason`` is one of missing, permission, resources, timeout, exit, output,
    driver, busy; ``cause`` says what happened and ``next_step`` (possibly empty) what to do about it."""

    def __init__(self, reason: str, cause: str, next_step: str = "") -> None:
        super().__init__(f"{cause}; {next_step}" if next_step else cause)
        self.reason = reason
        self.cause = cause
        self.next_step = next_step


class Shape(enum.StrEnum):
    """The layout of an ``npu-smi info`` table, told by its header rows."""

    STANDARD = "standard"  # `NPU Name` over `Chip` (910, 910B, 310)
    DEVICE = "device"  # `Chip Device` (310P): the Device column is the physical id
    PHY_ID = "phy-id"  # `Chip Phy-ID` (A3): the Phy-ID column is the physical id
    NPU_ID = "npu-id"  # separate `NPU ID` and `Name` columns, no chip column (Ascend 950)


@dataclass(frozen=True, slots=True)
class ChipRow:
    """One chip of the ``npu-smi info`` table; None where the table says ``NA``, ``-`` or nothing."""

    npu_id: int
    chip: int
    device: int | None
    name: str
    health: str
    bus_id: str | None
    power_w: float | None
    temp_c: int | None
    utilization_pct: int | None
    memory_used_mb: int | None
    memory_total_mb: int | None
    hbm_used_mb: int | None
    hbm_total_mb: int | None


@dataclass(frozen=True, slots=True)
class InfoTable:
    version: str | None
    shape: Shape
    chips: tuple[ChipRow, ...]
    processes: Processes = dataclasses.field(default_factory=Processes)


@dataclass(frozen=True, slots=True)
class MapRow:
    """One row of ``npu-smi info -m``; MCU rows have no logic id; ``phys_id`` where the table has a
    ``Chip Phy-ID`` column (Ascend 950)."""

    npu_id: int
    chip_id: int
    logic_id: int | None
    name: str
    phys_id: int | None = None


@dataclass(frozen=True, slots=True)
class HealthDetail:
    """``npu-smi info -t health``: the status and the faults (error codes with their text)."""

    status: str
    faults: tuple[Fault, ...]


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
_VERSION = re.compile(r"Version:\s*([^\s|]+)")
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?\d+(\.\d+)?$")
_PAIR = re.compile(r"^(\S+?)\s*/\s*(\S+)$")
# A header cell's labels: two-word labels first, then single words.
_LABEL = re.compile(r"NPU\s+ID|NPU\s+Util\(%\)|\S+")
# A data cell's values: `used / total` pairs count as one value.
_VALUE = re.compile(r"\S+?\s*/\s*\S+|\S+")
_FIELD_OF_LABEL = {
    "NPU": "npu_id",
    "NPU ID": "npu_id",
    "Name": "name",
    "Health": "health",
    "Power(W)": "power",
    "Temp(C)": "temp",
    "Chip": "chip",
    "Device": "device",
    "Phy-ID": "device",
    "Bus-Id": "bus_id",
    "AICore(%)": "utilization",
    "NPU Util(%)": "utilization",
    "Memory-Usage(MB)": "memory",
    "HBM-Usage(MB)": "hbm",
}
_EMPTY = ("", "-", "NA", "N/A")


def _cells(line: str) -> list[str] | None:
    """The cells of a ``| a | b | c |`` row, stripped; None for borders and other lines. A row whose closing
    ``|`` is missing still has its cells."""
    stripped = line.strip()
    if not stripped.startswith("|"):
        return None
    inner = stripped[1:]
    if inner.endswith("|"):
        inner = inner[:-1]
    return [cell.strip() for cell in inner.split("|")]


def _labels(cell: str) -> list[str]:
    return [re.sub(r"\s+", " ", label) for label in _LABEL.findall(cell)]


def _int(token: str | None) -> int | None:
    return int(token) if token is not None and _INT.match(token) else None


def _float(token: str | None) -> float | None:
    return float(token) if token is not None and _FLOAT.match(token) else None


def _pair(token: str | None) -> tuple[int | None, int | None]:
    """``4175 / 65536`` -> (4175, 65536); ``NA / NA`` -> (None, None)."""
    match = _PAIR.match(token) if token is not None else None
    return (_int(match.group(1)), _int(match.group(2))) if match else (None, None)


class _Header:
    """What each cell of a data row holds, from the labels of one header row."""

    def __init__(self, cells: list[str]) -> None:
        self.labels = [[_FIELD_OF_LABEL.get(label, label) for label in _labels(cell)] for cell in cells]

    @property
    def fields(self) -> set[str]:
        return {field for cell in self.labels for field in cell}

    def read(self, cells: list[str]) -> dict[str, str] | None:
        """The row's values by field; None when a cell holds values where the header has no label."""
        values: dict[str, str] = {}
        for labels, cell in zip(self.labels, cells, strict=True):
            found = _VALUE.findall(cell)
            if found and not labels:
                return None
            for i, label in enumerate(labels):
                if i < len(found):
                    # More values than labels: the rest belong to the last label (a name with a space).
                    values[label] = " ".join(found[i:]) if i == len(labels) - 1 else found[i]
        return values


@_typed_errors
def parse_info(text: str) -> InfoTable:
    """The chips of ``npu-smi info``, in table order.

    >>> table = parse_info(open("tests/fixtures/npu-smi/910B4x8-25.0.rc1.1-info.txt").read())
    >>> len(table.chips), table.chips[0].name, table.chips[0].bus_id, table.shape.value
    (8, '910B4', '0000:C1:00.0', 'standard')
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _is_chip_header(_cells(line))), None)
    if start is None:
        raise NpuSmiParseError("not an `npu-smi info` table: no 'NPU  Name | Health' header row")
    first = _cells(lines[start])
    second = _cells(lines[start + 1]) if start + 1 < len(lines) else None
    assert first is not None
    if second is None or len(second) != len(first) or "bus_id" not in _Header(second).fields:
        raise NpuSmiParseError("`npu-smi info`: the 'Chip | Bus-Id' header row is missing")
    npu_header, chip_header = _Header(first), _Header(second)
    shape = _shape(npu_header, chip_header, second)
    version = next(
        (m.group(1) for line in lines[:start] if _cells(line) and (m := _VERSION.search(line))), None
    )
    chips: list[ChipRow] = []
    npu: dict[str, str] | None = None
    for line in lines[start + 2 :]:
        cells = _cells(line)
        if cells is None:
            continue
        if any("Process id" in cell for cell in cells):
            break
        if len(cells) != len(first):
            continue
        chip = _chip_values(chip_header, cells) if npu is not None else None
        if npu is not None and chip is not None:
            chips.append(_chip_row(npu, chip))
        else:
            npu = _npu_values(npu_header, cells)
    if not chips:
        raise NpuSmiParseError("`npu-smi info`: the table lists no chips")
    return InfoTable(version, shape, tuple(chips), parse_processes(text))


def _is_chip_header(cells: list[str] | None) -> bool:
    if cells is None or len(cells) < 3:
        return False
    fields = _Header(cells).fields
    return {"npu_id", "name", "health"} <= fields


def _shape(npu_header: _Header, chip_header: _Header, second: list[str]) -> Shape:
    if "chip" not in chip_header.fields:
        return Shape.NPU_ID
    labels = {label for cell in second for label in _labels(cell)}
    if "Phy-ID" in labels:
        return Shape.PHY_ID
    return Shape.DEVICE if "Device" in labels else Shape.STANDARD


def _npu_values(header: _Header, cells: list[str]) -> dict[str, str] | None:
    values = header.read(cells)
    if values is None or _int(values.get("npu_id")) is None or not values.get("health"):
        return None
    return values


def _chip_values(header: _Header, cells: list[str]) -> dict[str, str] | None:
    """The values of a chip row: its ids are numbers, its bus id a bus id or empty."""
    values = header.read(cells)
    if values is None:
        return None
    for field in ("chip", "device"):
        if field in header.fields and _int(values.get(field)) is None:
            return None
    bus = values.get("bus_id", "")
    if not _BUS_ID.match(bus) and bus not in _EMPTY:
        return None
    return values


def _chip_row(npu: dict[str, str], chip: dict[str, str]) -> ChipRow:
    memory, hbm = _pair(chip.get("memory")), _pair(chip.get("hbm"))
    bus = chip.get("bus_id", "")
    return ChipRow(
        npu_id=int(npu["npu_id"]),
        chip=_int(chip.get("chip")) or 0,
        device=_int(chip.get("device")),
        name=npu.get("name", ""),
        health=npu["health"],
        bus_id=bus if _BUS_ID.match(bus) else None,
        power_w=_float(npu.get("power")),
        temp_c=_int(npu.get("temp")),
        utilization_pct=_int(chip.get("utilization")),
        memory_used_mb=memory[0],
        memory_total_mb=memory[1],
        hbm_used_mb=hbm[0],
        hbm_total_mb=hbm[1],
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
    """``key : value`` lines of ``npu-smi info -t <type> -i <id>``; the first occurrence of a key wins.

    >>> parse_key_values("\\tNPU Name : 9392\\n\\tChip Name : Ascend910\\n")["NPU Name"]
    '9392'
    """
    values: dict[str, str] = {}
    for key, value in _key_value_lines(text):
        values.setdefault(key, value)
    if not values:
        raise NpuSmiParseError("no 'key : value' lines")
    return values


_MAP_FIELDS = {
    "NPU ID": "npu_id",
    "Chip ID": "chip_id",
    "Chip Logic ID": "logic_id",
    "Chip Phy-ID": "phys_id",
    "Chip Name": "name",
}
_COLUMN_GAP = re.compile(r"\s{2,}|\t")


@_typed_errors
def parse_info_map(text: str) -> tuple[MapRow, ...]:
    """``npu-smi info -m``: NPU id, chip id, logic id (None for MCU rows), chip name and, on Ascend 950,
    the physical id. Columns are found by their header (950 adds ``Slot ID`` and ``Chip Phy-ID``)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "NPU ID" in line and "Chip Name" in line), None)
    if start is None:
        raise NpuSmiParseError("not `npu-smi info -m` output: no 'NPU ID ... Chip Name' header")
    columns = [_MAP_FIELDS.get(name, name) for name in _COLUMN_GAP.split(lines[start].strip())]
    if not {"npu_id", "chip_id", "name"} <= set(columns):
        raise NpuSmiParseError("`npu-smi info -m`: the header lacks NPU ID, Chip ID or Chip Name")
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = _COLUMN_GAP.split(line.strip())
        if len(cells) != len(columns):
            raise NpuSmiParseError(f"`npu-smi info -m`: unexpected row {line.strip()!r}")
        row = dict(zip(columns, cells, strict=True))
        npu_id, chip_id = _int(row["npu_id"]), _int(row["chip_id"])
        if npu_id is None or chip_id is None:
            raise NpuSmiParseError(f"`npu-smi info -m`: unexpected row {line.strip()!r}")
        rows.append(MapRow(npu_id, chip_id, _int(row.get("logic_id")), row["name"], _int(row.get("phys_id"))))
    if not rows:
        raise NpuSmiParseError("`npu-smi info -m` lists no chips")
    return tuple(rows)


_ERROR_CODE = re.compile(r"\b(?:0x)?([0-9A-Fa-f]{8})\b")


@_typed_errors
def parse_health(text: str) -> HealthDetail:
    """``npu-smi info -t health -i <id> [-c <chip>]``: the status and, when not OK, the error codes and text.

    >>> parse_health("Health Status : Alarm\\nError Code : 80E3A203\\nError Information : link down\\n")
    HealthDetail(status='Alarm', faults=(Fault(code='80E3A203', text='link down', fault_class=None),))
    """
    values = parse_key_values(text)
    status = values.get("Health Status")
    if status is None:
        raise NpuSmiParseError("no 'Health Status' line")
    codes = [code.upper() for code in _ERROR_CODE.findall(values.get("Error Code", ""))]
    information = values.get("Error Information", "")
    information = "" if information in _EMPTY else information
    texts = [part.strip() for part in re.split(r"[;,]", information)] if information else []
    if len(texts) != len(codes):
        texts = [information] * len(codes)
    unique = dict(zip(codes, texts, strict=True))
    return HealthDetail(status, tuple(Fault(code, text) for code, text in unique.items()))


_UINT32 = re.compile(r"^\d{1,10}$")
_DRIVER_NONE = 0xFFFFFFFF  # what DCMI returns for "none"; Huawei publishes -1


@_typed_errors
def parse_spod_info(text: str) -> SuperPod:
    """``npu-smi info -t spod-info -i <npu id> -c <chip>`` (A3): the die's SDID, super-pod size, super-pod id
    and server index. The driver's ``0xffffffff`` ("none") is -1 for the id and the index, as Huawei
    publishes it.

    >>> parse_spod_info("SDID : 16777216\\nSuper Pod Size : 384\\nSuper Pod ID : 0\\nServer Index : 4\\n")
    SuperPod(sdid=16777216, size=384, super_pod_id=0, server_index=4)
    """
    values = parse_key_values(text)
    numbers: dict[str, int] = {}
    for key in ("SDID", "Super Pod Size", "Super Pod ID", "Server Index"):
        value = values.get(key)
        if value is None:
            raise NpuSmiParseError(f"`npu-smi info -t spod-info`: no {key!r} line")
        if not _UINT32.match(value) or int(value) > _DRIVER_NONE:
            raise NpuSmiParseError(f"`npu-smi info -t spod-info`: {key} is {value!r}, not a number")
        numbers[key] = int(value)

    def signed(number: int) -> int:
        return -1 if number == _DRIVER_NONE else number

    return SuperPod(
        sdid=numbers["SDID"],
        size=numbers["Super Pod Size"],
        super_pod_id=signed(numbers["Super Pod ID"]),
        server_index=signed(numbers["Server Index"]),
    )


def board_model(board: Mapping[str, str]) -> str | None:
    """The A3 model a ``npu-smi info -t board -i <npu> -c <chip>`` record names, if it names one.

    >>> board_model({"NPU Name": "9392", "Chip Name": "Ascend910"}), board_model({"Chip Name": "910B3"})
    ('910_9392', None)
    """
    soc = board.get("NPU Name", "").strip()
    if soc in A3_SOCS and normalise_model(board.get("Chip Name", "")) == "910":
        return f"910_{soc}"
    return None


def a3_dies(table: InfoTable) -> frozenset[int]:
    """The indexes of the chips in ``table`` that are A3 dies (model ``910_93``).

    A3 prints a ``Chip  Phy-ID`` header and two rows per NPU id named ``Ascend910``; a ``910C*`` name is A3
    too. A ``910B3`` (or any other 910 name with a letter) never is.
    """
    per_npu: dict[int, int] = {}
    for row in table.chips:
        per_npu[row.npu_id] = per_npu.get(row.npu_id, 0) + 1
    dies = set()
    for index, row in enumerate(table.chips):
        name = normalise_model(row.name)
        if name.startswith("910C") or (
            name == "910" and table.shape is Shape.PHY_ID and per_npu[row.npu_id] == 2
        ):
            dies.add(index)
    return frozenset(dies)


def physical_ids(chips: Sequence[ChipRow], chip_map: Sequence[MapRow] = ()) -> tuple[int, ...]:
    """The ``/dev/davinci<N>`` number of each chip, in order.

    The Device or Phy-ID column where the table has one (310P, A3); else ``npu-smi info -m``'s
    ``Chip Phy-ID`` where given (Ascend 950); else the NPU id when every NPU has one chip (910 boards);
    else, for cards with several chips and no Device column (310), the chip's position in the table, which
    follows the logic ids.
    """
    if chips and all(chip.device is not None for chip in chips):
        return tuple(chip.device for chip in chips if chip.device is not None)
    mapped = {(row.npu_id, row.chip_id): row.phys_id for row in chip_map if row.phys_id is not None}
    if chips and all((chip.npu_id, chip.chip) in mapped for chip in chips):
        return tuple(mapped[chip.npu_id, chip.chip] for chip in chips)
    per_npu: dict[int, int] = {}
    for chip in chips:
        per_npu[chip.npu_id] = per_npu.get(chip.npu_id, 0) + 1
    if all(count == 1 for count in per_npu.values()):
        return tuple(chip.npu_id for chip in chips)
    return tuple(range(len(chips)))
