"""A fake npu-smi executable for tests: prints fixtures, fails, hangs or prints garbage on demand."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inotify_simple import INotify, flags

_SCRIPT = Path(__file__).parent / "fakes" / "npu_smi.py"


class FakeNpuSmi:
    """``FakeNpuSmi(dir).path`` is an executable; ``set_output`` and ``set_mode`` change what it does next."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        (directory / "out").mkdir(parents=True, exist_ok=True)
        self.path = directory / "npu-smi"
        self.path.write_text(f"#!{sys.executable}\n" + _SCRIPT.read_text())
        self.path.chmod(0o755)
        self.set_mode("ok")

    def set_output(self, args: str, text: str) -> None:
        target = self.directory / "out" / (args.replace(" ", "_") + ".txt")
        temporary = target.with_suffix(".tmp")
        temporary.write_text(text)
        temporary.replace(target)

    def set_error(self, args: str, text: str) -> None:
        """npu-smi ``args`` prints ``text`` on stderr and exits 1."""
        (self.directory / "err").mkdir(exist_ok=True)
        (self.directory / "err" / (args.replace(" ", "_") + ".txt")).write_text(text)

    def clear_error(self, args: str) -> None:
        """npu-smi ``args`` answers again as before :meth:`set_error`."""
        (self.directory / "err" / (args.replace(" ", "_") + ".txt")).unlink()

    def set_vnpu_state(self, dev: Path, chips: Mapping[tuple[int, int], Mapping[str, Any]],
                       templates: Mapping[str, Sequence[int]], **options: Any) -> None:  # fmt: skip
        """Answer the vNPU commands from state: ``chips`` by (npu id, chip) with ``phys``, ``aicore``,
        ``memory``, ``aicpu`` and ``vnpus`` (``{"id", "template", "container"?}``); ``templates`` name ->
        (AI cores, memory GB, AI CPUs); ``dev`` gets and loses ``vdavinci<id>`` nodes. ``reject=[..]``:
        templates create refuses; ``fail_create=True``: every create fails."""
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

    def calls_of(self, prefix: str) -> list[str]:
        """Every call whose arguments start with ``prefix``, in order."""
        log = self.directory / "calls.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line for line in lines if line.startswith(prefix)]

    def set_mode(self, mode: str) -> None:
        assert mode in ("ok", "fail", "hang", "garbage", "flood", "orphan"), mode
        temporary = self.directory / "mode.tmp"
        temporary.write_text(mode)
        temporary.replace(self.directory / "mode")

    def calls(self) -> int:
        log = self.directory / "calls.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def count(self, args: str) -> int:
        """How often npu-smi ran with exactly ``args`` (``"info -t health -i 1 -c 1"``)."""
        log = self.directory / "calls.log"
        return log.read_text().splitlines().count(args) if log.exists() else 0

    def wait_count(self, args: str, count: int, timeout: float = 10.0) -> None:
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
