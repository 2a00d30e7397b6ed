"""A fake npu-smi executable for tests: prints fixtures, fails, hangs or prints garbage on demand."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inotify_simple import INotify, flags

from tests.support import PATIENCE
from tests.support.fake_executable import HERE_PYTHON, FakeExecutable

_SCRIPT = Path(__file__).parent / "fakes" / "npu_smi.py"


def with_health(table: str, npu_id: int, health: str) -> str:
    """``npu-smi info``'s ``table`` with NPU ``npu_id``'s Health column saying ``health`` instead of OK.

    >>> with_health("| 5     910B4               | OK            | 87.2  |", 5, "Alarm")
    '| 5     910B4               | Alarm         | 87.2  |'
    """
    lines = table.splitlines(keepends=True)
    row = next(i for i, line in enumerate(lines) if line.startswith(f"| {npu_id} "))
    lines[row] = lines[row].replace("| OK            |", f"| {health:<13} |")
    return "".join(lines)


class FakeNpuSmi(FakeExecutable):
    """``FakeNpuSmi(dir).path`` is an executable; ``set_output`` and ``set_mode`` change what it does next."""

    modes = (*FakeExecutable.modes, "flood", "orphan")

    def __init__(self, directory: Path, interpreter: str = HERE_PYTHON) -> None:
        super().__init__(directory, "npu-smi", _SCRIPT, interpreter)

    def clear_error(self, args: str) -> None:
        """npu-smi ``args`` answers again as before :meth:`set_error`."""
        self.answer("err", args).unlink()

    def set_vnpu_state(self, dev: Path, chips: Mapping[tuple[int, int], Mapping[str, Any]],
                       templates: Mapping[str, Sequence[int]], **options: Any) -> None:  # fmt: skip
        """Answer the vNPU commands from state: ``chips`` by (npu id, chip) with ``phys``, ``aicore``,
        ``memory``, ``aicpu`` and ``vnpus`` (``{"id", "template", "container"?}``); ``templates`` name ->
        (AI cores, memory GB, AI CPUs); ``dev`` gets and loses ``vdavinci<id>`` nodes. ``reject=[..]``:
        templates create refuses; ``fail_create=True``: every create fails; ``hang_after_create=True``: a
        create makes the vNPU, then hangs. A create given ``-v`` makes that id, or fails when it is taken."""
        state = {
            "dev": str(dev),
            "chips": {f"{npu}:{chip}": dict(value) for (npu, chip), value in chips.items()},
            "templates": {name: list(values) for name, values in templates.items()},
            **options,
        }
        for chip_state in state["chips"].values():
            for vnpu in chip_state["vnpus"]:
                (dev / f"vdavinci{vnpu['id']}").write_text("")
        temporary = self.directory / "vnpu.json.tmp"
        temporary.write_text(json.dumps(state))
        temporary.replace(self.directory / "vnpu.json")

    def vnpu_state(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads((self.directory / "vnpu.json").read_text())
        return state

    def set_reset(
        self, result: str, after: Mapping[str, str] | None = None, second_prompt: bool = False
    ) -> None:
        """``set -t reset`` asks its confirmation (and with ``second_prompt`` A3's reboot question), then
        ``result``: ok (``after``'s answers replace those of their arguments: the chip comes back healthy
        when one is a healthy table), fail, unsupported, or hang."""
        assert result in ("ok", "fail", "unsupported", "hang"), result
        plan = {"result": result, "after": dict(after or {}), "second_prompt": second_prompt}
        temporary = self.directory / "reset.json.tmp"
        temporary.write_text(json.dumps(plan))
        temporary.replace(self.directory / "reset.json")

    def resets(self) -> list[str]:
        """Each reset npu-smi ran: ``<args> | <answers it read>``."""
        log = self.directory / "resets.log"
        return log.read_text().splitlines() if log.exists() else []

    def calls_of(self, prefix: str) -> list[str]:
        """Every call whose arguments start with ``prefix``, in order."""
        log = self.directory / "calls.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line for line in lines if line.startswith(prefix)]

    def wait_count(self, args: str, count: int, timeout: float = PATIENCE) -> None:
        """Wait until npu-smi ran with ``args`` ``count`` times in all, woken by inotify on its call log."""
        deadline = time.monotonic() + timeout
        inotify = INotify()
        try:
            inotify.add_watch(self.directory, flags.CREATE | flags.MODIFY)
            while self.count(args) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"npu-smi ran {self.count(args)} times with {args!r}, not {count}")
                inotify.read(timeout=int(left * 1000) + 1)
        finally:
            inotify.close()
