"""A fake hccn_tool executable for tests: prints fixtures, says "no ip was preset", fails, hangs or prints
garbage on demand."""

from __future__ import annotations

import sys
from pathlib import Path

_SCRIPT = Path(__file__).parent / "fakes" / "hccn_tool.py"


class FakeHccnTool:
    """``FakeHccnTool(dir).path`` is an executable; ``set_output`` and ``set_mode`` change what it does next.
    A chip with no output set answers as one with no address (exit status 13)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        (directory / "out").mkdir(parents=True, exist_ok=True)
        (directory / "err").mkdir(exist_ok=True)
        self.path = directory / "hccn_tool"
        self.path.write_text(f"#!{sys.executable}\n" + _SCRIPT.read_text())
        self.path.chmod(0o755)
        self.set_mode("ok")

    def set_output(self, args: str, text: str) -> None:
        """``args`` like ``"-i 0 -ip -g"`` prints ``text``."""
        target = self.directory / "out" / (args.replace(" ", "_") + ".txt")
        temporary = target.with_suffix(".tmp")
        temporary.write_text(text)
        temporary.replace(target)

    def set_error(self, args: str, text: str, status: int = 1) -> None:
        """``args`` prints ``text`` on stderr and exits with ``status``."""
        base = self.directory / "err" / args.replace(" ", "_")
        base.with_suffix(".status").write_text(str(status))
        base.with_suffix(".txt").write_text(text)

    def clear(self, args: str) -> None:
        """``args`` answers as for a chip with no address again."""
        name = args.replace(" ", "_")
        for path in (self.directory / "out" / f"{name}.txt", self.directory / "err" / f"{name}.txt"):
            path.unlink(missing_ok=True)

    def set_mode(self, mode: str) -> None:
        assert mode in ("ok", "fail", "hang", "garbage"), mode
        temporary = self.directory / "mode.tmp"
        temporary.write_text(mode)
        temporary.replace(self.directory / "mode")

    def count(self, args: str) -> int:
        """How often hccn_tool ran with exactly ``args``."""
        log = self.directory / "calls.log"
        return log.read_text().splitlines().count(args) if log.exists() else 0

    def calls(self) -> int:
        log = self.directory / "calls.log"
        return len(log.read_text().splitlines()) if log.exists() else 0
