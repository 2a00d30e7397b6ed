"""npu-smi's vNPU commands: the template table, a chip's vNPUs, creating and destroying one.

The tables are read by their labels (``AICORE``, ``Vnpu ID``, ``Template Name``), not by columns, so spacing
and borders may vary. A chip that cannot hold vNPUs (310, 310B, dcmi -8255, ``not support``) is told apart
from a failure, so that it stays a plain chip without a warning::

    templates = parse_template_info(text)            # `npu-smi info -t template-info -i 1`
    state = parse_info_vnpu(text)                    # `npu-smi info -t info-vnpu -i 1 -c 0`
    state = await query_vnpus("npu-smi", 1, 0, timeout=10)   # None: the chip has no vNPU support
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ascend_agent.backends.npusmi import NpuSmiError, NpuSmiParseError, parse_key_values
from ascend_agent.backends.tool import run_npu_smi
from ascend_agent.model import Template, VNpu
from ascend_agent.naming import vnpu_suffix

# What npu-smi or its driver library says for a chip without vNPU support: dcmi's -8255 is "not supported".
_UNSUPPORTED = re.compile(r"-8255\b|\bnot\s+support", re.IGNORECASE)
# Numbers npu-smi prints: ASCII digits, at most 9 (int() reads other scripts' digits, refuses 5000 digits).
_TOTAL = re.compile(r"Total\s+number\s+of\s+vnpu\s*:\s*([0-9]{1,9})(?![0-9])", re.IGNORECASE)
_TABLE = re.compile(r"Total\s+number\s+of\s+vnpu", re.IGNORECASE)
_TEMPLATE_NAME = re.compile(r"^vir\w+$")
_NUMBER = re.compile(r"^[0-9]{1,9}$")
_TEMPLATE_COLUMNS = frozenset({"name", "aicore", "memory", "aicpu"})
# Free/Total of one resource: NA where npu-smi cannot say; free goes below 0 on a chip whose vNPUs take more
# than it has (made by hand, or by a tool that checks only AI cores).
_FREE_TOTAL = re.compile(r"^(-?\w+)/(\w+)$")
_SIGNED = re.compile(r"^-?[0-9]{1,9}$")
_VNPU_COLUMNS = {
    "vnpu id": "vnpu_id",
    "vgroup id": "vgroup_id",
    "container id": "container_id",
    "status": "status",
    "template name": "template",
}


@dataclass(frozen=True, slots=True)
class ChipVnpus:
    """``npu-smi info -t info-vnpu`` of one chip: its resources as (free, total) by label in lower case
    (``aicore``, ``memory`` in GB, ``aicpu``, ...; None where it says NA; free below 0 where the vNPUs take
    more than the chip has), and its vNPUs."""

    resources: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict)
    vnpus: tuple[VNpu, ...] = ()

    def total(self, label: str) -> int | None:
        return self.resources.get(label, (None, None))[1]


def unsupported(text: str) -> bool:
    """True when what npu-smi printed for a failed vNPU command says the chip has no vNPU support.

    >>> unsupported("dcmi_get_device_info failed. ret is -8255"), unsupported("ret is -8005")
    (True, False)
    """
    return bool(_UNSUPPORTED.search(text))


def _inner(line: str) -> str | None:
    """A table row without its outer ``|`` borders; None for border lines and text outside the table."""
    stripped = line.strip()
    if not stripped.startswith("|"):
        return None
    inner = stripped[1:]
    return inner[:-1] if inner.endswith("|") else inner


def _count(token: str) -> int | None:
    return int(token) if _NUMBER.match(token) else None


def _signed(token: str) -> int | None:
    return int(token) if _SIGNED.match(token) else None


def parse_template_info(text: str) -> tuple[Template, ...]:
    """The templates of ``npu-smi info -t template-info``; each is the row that starts with its name (the
    row under it carries only media units). :class:`NpuSmiParseError` for anything else.

    >>> text = "|Name  AICORE  Memory  AICPU|\\n|      GB|\\n|=====|\\n|vir02  2  6  2|\\n|  0  3|\\n"
    >>> parse_template_info(text)
    (Template(name='vir02', aicore=2, memory_gb=6, aicpu=2, media=()),)
    """
    labels: list[str] | None = None
    second: list[str] = []  # the media labels of the header's second row (PNGD VDEC JPEGE)
    templates: dict[str, Template] = {}
    last: Template | None = None
    for line in text.splitlines():
        inner = _inner(line)
        if inner is None:
            continue
        tokens = inner.replace("|", " ").split()
        if labels is None:
            lowered = [token.lower() for token in tokens]
            if "name" in lowered and "aicore" in lowered:
                labels = lowered
            continue
        if not templates and not second and tokens and all(t.isalpha() for t in tokens):
            second = [token.lower() for token in tokens if token.lower() != "gb"]
            continue
        if last is not None and second and len(tokens) == len(second) and all(map(_NUMBER.match, tokens)):
            more = tuple((label, int(token)) for label, token in zip(second, tokens, strict=True))
            templates[last.name] = last = replace(last, media=last.media + more)
            continue
        last = None
        if len(tokens) != len(labels) or not _TEMPLATE_NAME.match(tokens[0]):
            continue
        values = dict(zip(labels, tokens, strict=True))
        cores = _count(values.get("aicore", ""))
        if cores is None or cores < 1:
            raise NpuSmiParseError(f"template-info: template {tokens[0]} has no AI core count")
        media = tuple(
            (label, count)
            for label in labels
            if label not in _TEMPLATE_COLUMNS and (count := _count(values[label])) is not None
        )
        templates[tokens[0]] = last = Template(
            tokens[0], cores, _count(values.get("memory", "")), _count(values.get("aicpu", "")), media
        )
    if labels is None:
        said = next((line.strip(" |") for line in text.splitlines() if line.strip(" |+-=")), "nothing")
        raise NpuSmiParseError(f"template-info: no 'Name AICORE' header; npu-smi said: {said[:120]}")
    if not templates:
        raise NpuSmiParseError("template-info lists no templates")
    return tuple(templates.values())


def parse_info_vnpu(text: str) -> ChipVnpus:
    """A chip's resources and vNPUs from ``npu-smi info -t info-vnpu -i N -c C``.

    :class:`NpuSmiParseError` when the text is not that table, lists another number of vNPUs than its
    ``Total number of vnpu`` line says, or lists a vNPU id twice.
    """
    total_match = _TOTAL.search(text)
    if total_match is None:
        raise NpuSmiParseError("info-vnpu: no 'Total number of vnpu' line")
    expected = int(total_match.group(1))
    resources: dict[str, tuple[int | None, int | None]] = {}
    resource_labels: list[str] | None = None
    columns: list[str | None] | None = None
    vnpus: list[VNpu] = []
    for line in text.splitlines():
        inner = _inner(line)
        if inner is None:
            continue
        cells = [cell.strip() for cell in inner.split("|")]
        tokens = inner.split()
        lowered = [re.sub(r"\s+", " ", cell).lower() for cell in cells]
        if columns is None and "vnpu id" in lowered:
            columns = [_VNPU_COLUMNS.get(cell) for cell in lowered]
            if "template" not in columns:
                raise NpuSmiParseError("info-vnpu: the vNPU header has no 'Template Name'")
        elif columns is not None:
            vnpu = _vnpu_row(columns, cells)
            if vnpu is not None:
                vnpus.append(vnpu)
        elif "aicore" in (token.lower() for token in tokens) and not resources:
            resource_labels = [token.lower() for token in tokens]
        elif resource_labels is not None and not resources and len(tokens) == len(resource_labels):
            pairs = [_FREE_TOTAL.match(token) for token in tokens]
            if all(pairs):
                resources = {
                    label: (_signed(pair.group(1)), _count(pair.group(2)))
                    for label, pair in zip(resource_labels, pairs, strict=True)
                    if pair is not None
                }
    if len(vnpus) != expected:
        raise NpuSmiParseError(f"info-vnpu: 'Total number of vnpu: {expected}' but {len(vnpus)} rows read")
    twice = sorted(vnpu_id for vnpu_id, n in Counter(v.vnpu_id for v in vnpus).items() if n > 1)
    if twice:
        raise NpuSmiParseError(f"info-vnpu lists vNPU id {twice[0]} twice (vNPU ids are unique per node)")
    return ChipVnpus(resources, tuple(vnpus))


def _vnpu_row(columns: list[str | None], cells: list[str]) -> VNpu | None:
    if len(cells) != len(columns):
        return None
    values = {column: cell for column, cell in zip(columns, cells, strict=True) if column}
    cell = values.get("vnpu_id", "")
    vnpu_id = _count(cell)
    template = values.get("template", "")
    if not _TEMPLATE_NAME.match(template):
        return None
    if vnpu_id is None:
        raise NpuSmiParseError(f"info-vnpu: vNPU id {_shown(cell)} is not a number of at most 9 digits")
    try:
        vnpu_suffix(template)
    except ValueError:
        raise NpuSmiParseError(f"info-vnpu: vNPU {vnpu_id} has template {_shown(template)}") from None
    return VNpu(
        vnpu_id,
        template,
        vgroup_id=_count(values.get("vgroup_id", "")),
        container_id=values.get("container_id", ""),
        status=values.get("status", ""),
    )


def _shown(cell: str) -> str:
    """A cell as an error line names it: quoted, cut after 20 characters."""
    return repr(cell) if len(cell) <= 20 else repr(cell[:20]) + f"... ({len(cell)} characters)"


def check_done(text: str, what: str) -> None:
    """``Status : OK`` of a ``npu-smi set`` command; :class:`NpuSmiError` with its ``Message`` otherwise."""
    try:
        values = parse_key_values(text)
    except NpuSmiParseError:
        values = {}
    if values.get("Status", "").upper() != "OK":
        lines = text.strip().splitlines()
        said = values.get("Message") or (lines[-1] if lines else "no output")
        raise NpuSmiError("exit", f"{what} failed: {said}")


async def query_templates(executable: str, npu_id: int, timeout: float) -> tuple[Template, ...]:
    """``npu-smi info -t template-info -i N``, run and parsed; NpuSmiError when it fails or says no table."""
    args = ["info", "-t", "template-info", "-i", str(npu_id)]
    text = await run_npu_smi(executable, args, timeout)
    try:
        return parse_template_info(text)
    except NpuSmiParseError as exc:
        raise NpuSmiError("output", f"npu-smi {' '.join(args)}: {exc}") from None


async def query_vnpus(executable: str, npu_id: int, chip: int, timeout: float) -> ChipVnpus | None:
    """A chip's vNPUs; None when the chip has no vNPU support; NpuSmiError for any other failure."""
    args = ["info", "-t", "info-vnpu", "-i", str(npu_id), "-c", str(chip)]
    try:
        text = await run_npu_smi(executable, args, timeout)
    except NpuSmiError as exc:
        if unsupported(str(exc)):
            return None
        raise
    try:
        return parse_info_vnpu(text)
    except NpuSmiParseError as exc:
        # The table's own header says "NA: Currently, query is not supported." of single figures.
        if unsupported(text) and not _TABLE.search(text):
            return None
        raise NpuSmiError("output", f"npu-smi {' '.join(args)}: {exc}") from None


async def create_vnpu(
    executable: str, npu_id: int, chip: int, template: str, timeout: float, vnpu_id: int | None = None
) -> None:
    """``npu-smi set -t create-vnpu``; with ``vnpu_id``, the vNPU gets that id (``-v``)."""
    args = ["set", "-t", "create-vnpu", "-i", str(npu_id), "-c", str(chip), "-f", template]
    if vnpu_id is not None:
        args += ["-v", str(vnpu_id)]
    check_done(await run_npu_smi(executable, args, timeout), "npu-smi " + " ".join(args))


async def destroy_vnpu(executable: str, npu_id: int, chip: int, vnpu_id: int, timeout: float) -> None:
    args = ["set", "-t", "destroy-vnpu", "-i", str(npu_id), "-c", str(chip), "-v", str(vnpu_id)]
    check_done(await run_npu_smi(executable, args, timeout), "npu-smi " + " ".join(args))
