"""Stand-ins for the Ascend driver's device nodes in the host's /dev, where the container runtime looks for
the device nodes a pod is given. Each is a character device of a number from the range Linux leaves to local
use (no driver answers it: opening one fails), a number of its own, so a container's ``ls -l /dev`` tells
which host node it got::

    nodes = StandInDevices()
    nodes.make(["davinci0", "davinci_manager"])   # refused when /dev/davinci0 is there already
    numbers("davinci0")                           # (240, 0)
    nodes.remove(["davinci_manager"])             # one of them
    nodes.remove()                                # every node this made
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

DEV = Path("/dev")
CHIPS = tuple(f"davinci{n}" for n in range(8))
MANAGEMENT = ("davinci_manager", "devmm_svm", "hisi_hdc")
# Majors 240-254 are for local and experimental use (Documentation/admin-guide/devices.txt).
_CHIP_MAJOR, _MANAGEMENT_MAJOR, _VNPU_MAJOR = 240, 241, 242


class DevicesPresent(Exception):
    """The host has a node of that name already: a real NPU node, whose devices are never touched."""


def numbers(name: str) -> tuple[int, int]:
    """The (major, minor) a stand-in of ``name`` gets: davinciN (240, N), vdavinciN (242, N), the management
    devices 241 in the order of MANAGEMENT."""
    if found := re.fullmatch(r"davinci(\d+)", name):
        return _CHIP_MAJOR, int(found[1])
    if found := re.fullmatch(r"vdavinci(\d+)", name):
        return _VNPU_MAJOR, int(found[1])
    return _MANAGEMENT_MAJOR, MANAGEMENT.index(name)


def _present(path: Path) -> str:
    """Why a node of that name cannot be made: a stand-in of ours left behind, or the host's own device."""
    with contextlib.suppress(OSError):
        mode = path.lstat()
        ours = (_CHIP_MAJOR, _MANAGEMENT_MAJOR, _VNPU_MAJOR)
        if stat.S_ISCHR(mode.st_mode) and os.major(mode.st_rdev) in ours:
            return f"{path} is a stand-in an earlier run left (cut short): remove it and run again"
    return f"{path} exists: this host has Ascend devices; run the tests elsewhere"


@dataclass
class StandInDevices:
    dev: Path = DEV
    made: list[Path] = field(default_factory=list)

    def make(self, names: Iterable[str]) -> None:
        for name in names:
            path = self.dev / name
            if path in self.made:
                continue
            if path.exists() or path.is_symlink():
                raise DevicesPresent(_present(path))
            try:
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*numbers(name)))
            except FileExistsError:
                raise DevicesPresent(_present(path)) from None
            self.made.append(path)

    @contextmanager
    def present(self, names: Sequence[str]) -> Iterator[None]:
        """The nodes of ``names`` made for the ``with`` block, removed after it (a module's vNPUs: the next
        module's agent must not find them)."""
        self.make(names)
        try:
            yield
        finally:
            self.remove(names)

    def remove(self, names: Iterable[str] | None = None) -> list[str]:
        """The nodes of ``names`` this made (each one when None) removed; returns those that would not go."""
        problems = []
        for path in self.made if names is None else [self.dev / name for name in names]:
            if path not in self.made:
                continue
            with contextlib.suppress(FileNotFoundError):
                try:
                    path.unlink()
                except OSError as problem:
                    problems.append(f"{path}: {problem}")
        self.made = [path for path in self.made if path.exists()]
        return problems
