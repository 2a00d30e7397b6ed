"""A fake hccn_tool executable for tests: prints fixtures, says "no ip was preset", fails, hangs or prints
garbage on demand."""

from __future__ import annotations

from pathlib import Path

from tests.support.fake_executable import HERE_PYTHON, FakeExecutable

_SCRIPT = Path(__file__).parent / "fakes" / "hccn_tool.py"


class FakeHccnTool(FakeExecutable):
    """``FakeHccnTool(dir).path`` is an executable; ``set_output`` and ``set_mode`` change what it does next.
    A chip with no output set answers as one with no address (exit status 13), with its link UP and net
    health Success."""

    def __init__(self, directory: Path, interpreter: str = HERE_PYTHON) -> None:
        super().__init__(directory, "hccn_tool", _SCRIPT, interpreter)

    def set_error(self, args: str, text: str, status: int = 1) -> None:
        """``args`` (like ``"-i 0 -ip -g"``) prints ``text`` on stderr and exits with ``status``."""
        self.answer("err", args, ".status").write_text(str(status))
        super().set_error(args, text)

    def clear(self, args: str) -> None:
        """``args`` answers as for a chip with no address again."""
        for path in (self.answer("out", args), self.answer("err", args)):
            path.unlink(missing_ok=True)
