"""The shared hccn_tool and npu-smi samples (tests/fixtures/training/), cut per chip at their header lines."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import ROOT

TRAINING = ROOT / "tests" / "fixtures" / "training"
# `/usr/local/Ascend/driver/tools/hccn_tool -i 3 -ip -g` (the leading / is missing on some) or
# `### device_id 10 (...)`.
_HEADER = re.compile(r"^(?:\S*hccn_tool -i (\d+) .*|### device_id (\d+) .*)$", re.MULTILINE)
# The arguments of such a header, without a trailing `| grep ...`.
_COMMAND = re.compile(r"^\S*hccn_tool (-i \d+ [^|\n]*?)\s*(?:\|.*)?$", re.MULTILINE)


def per_chip(name: str) -> dict[int, str]:
    """The text under each header of ``name``, by the chip id the header names."""
    text = (TRAINING / name).read_text()
    headers = list(_HEADER.finditer(text))
    sections = {}
    for header, following in zip(headers, [*headers[1:], None], strict=True):
        end = following.start() if following is not None else len(text)
        sections[int(header.group(1) or header.group(2))] = text[header.end() + 1 : end]
    return sections


def per_command(name: str) -> dict[str, str]:
    """The text under each ``hccn_tool -i N ...`` header of ``name``, by the arguments (``-i 0 -link -g``)."""
    text = (TRAINING / name).read_text()
    headers = list(_COMMAND.finditer(text))
    return {
        header.group(1): text[header.end() + 1 : following.start() if following is not None else len(text)]
        for header, following in zip(headers, [*headers[1:], None], strict=True)
    }


def read(name: str) -> str:
    return (TRAINING / name).read_text()


def path(name: str) -> Path:
    return TRAINING / name
