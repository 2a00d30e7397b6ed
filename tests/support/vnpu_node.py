"""A 310P3 node for the vNPU tests: an ``npu-smi info`` table of cards with one chip each (NPU id = physical
id), built from the real single-card sample, and the shared vNPU samples."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from inotify_simple import INotify, flags

from tests.support import FIXTURES, PATIENCE

VNPU_SAMPLES = FIXTURES / "vnpu"
TEMPLATE_INFO = (VNPU_SAMPLES / "310P3-template-info.txt").read_text()
# NPU 1 chip 0: vNPU 116 (vir04) in a container, 117 (vir02) free.
INFO_VNPU_TWO = (VNPU_SAMPLES / "310P3-info-vnpu-i1-c0.txt").read_text()
INFO_VNPU_NONE = (VNPU_SAMPLES / "310P3-info-vnpu-i2-c0-none.txt").read_text()
# The shape of the answer of a chip without vNPU support.
NOT_SUPPORTED = "Error: dcmi get vnpu info failed, ret = -8255 (not support)\n"
# (AI cores, memory GB, AI CPUs) per template, as the sample's template-info gives them.
TEMPLATES_310P = {"vir01": (1, 3, 1), "vir02": (2, 6, 2), "vir02_1c": (2, 6, 1), "vir04": (4, 12, 4)}


def info_310p(npu_ids: Iterable[int]) -> str:
    """``npu-smi info`` of 310P3 cards, one chip each, whose Device (physical id) is the NPU id."""
    lines = (FIXTURES / "310P3-23.0.0-info.txt").read_text().splitlines()
    head, npu_row, chip_row, border = lines[:6], lines[6], lines[7], lines[8]
    rows = []
    for npu_id in npu_ids:
        rows += [
            npu_row.replace("| 24 ", f"| {npu_id:<2} ", 1),
            chip_row.replace("| 0       0   ", f"| 0       {npu_id:<3} ", 1).replace(
                "0000:04:00.0", f"0000:{npu_id + 4:02x}:00.0"
            ),
            border,
        ]
    return "\n".join([*head, *rows]) + "\n"


def wait_gone(path: Path, timeout: float = PATIENCE) -> None:
    """Wait until ``path`` no longer exists, woken by inotify on its directory."""
    deadline = time.monotonic() + timeout
    inotify = INotify()
    try:
        inotify.add_watch(path.parent, flags.DELETE | flags.MOVED_FROM)
        while path.exists():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{path} is still there after {timeout} s")
            inotify.read(timeout=int(left * 1000) + 1)
    finally:
        inotify.close()
