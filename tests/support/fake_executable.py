"""The test side of a fake executable (tests/support/fakes/): the script copied with this interpreter's
shebang, and the files beside it that it reads on every run: ``mode``, ``out/<args>.txt``, ``err/<args>.txt``,
and the ``calls.log`` it appends its arguments to. ``lifetime.py``, copied beside it, bounds how long it
hangs: no longer than the process that ran it lives."""

from __future__ import annotations

import sys
from pathlib import Path

_LIFETIME = Path(__file__).parent / "fakes" / "lifetime.py"
# -S: no site-packages (the fakes need the standard library alone), half the start of a run.
HERE_PYTHON = f"{sys.executable} -S"


class FakeExecutable:
    """``path`` is the executable; ``set_output``, ``set_error`` and ``set_mode`` change what it does next."""

    modes: tuple[str, ...] = ("ok", "fail", "hang", "garbage")

    def __init__(self, directory: Path, name: str, script: Path, interpreter: str = HERE_PYTHON) -> None:
        """``interpreter`` runs the script: this one, or ``/usr/bin/env python3`` for one that runs where this
        interpreter is not (inside a container)."""
        self.directory = directory
        (directory / "out").mkdir(parents=True, exist_ok=True)
        (directory / "err").mkdir(exist_ok=True)
        (directory / _LIFETIME.name).write_text(_LIFETIME.read_text())
        self.path = directory / name
        self.path.write_text(f"#!{interpreter}\n" + script.read_text())
        self.path.chmod(0o755)
        self.set_mode("ok")

    def answer(self, kind: str, args: str, suffix: str = ".txt") -> Path:
        """The file under ``out`` or ``err`` that answers ``args``."""
        return self.directory / kind / (args.replace(" ", "_") + suffix)

    def set_output(self, args: str, text: str) -> None:
        """``args`` prints ``text``; the file renamed into place, so a run never reads half of it."""
        target = self.answer("out", args)
        temporary = target.with_suffix(".tmp")
        temporary.write_text(text)
        temporary.replace(target)

    def set_error(self, args: str, text: str) -> None:
        """``args`` prints ``text`` on stderr and fails."""
        self.answer("err", args).write_text(text)

    def set_mode(self, mode: str) -> None:
        assert mode in self.modes, mode
        temporary = self.directory / "mode.tmp"
        temporary.write_text(mode)
        temporary.replace(self.directory / "mode")

    def calls(self) -> int:
        log = self.directory / "calls.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def count(self, args: str) -> int:
        """How often the executable ran with exactly ``args``."""
        log = self.directory / "calls.log"
        return log.read_text().splitlines().count(args) if log.exists() else 0
