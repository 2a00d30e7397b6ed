"""A stand-in for the driver's ``libdcmi.so`` (``fakes/libdcmi.c``), built with the machine's C compiler into
a host tree, for the A3 pairing read (``backends/dcmi_pairs.py``); the test is skipped where no compiler is::

    library = build_libdcmi(host.root)                  # <host>/usr/local/dcmi/libdcmi.so
    env = dcmi_env({0: 4, 4: 0})                         # FAKE_DCMI_BROTHERS for the agent's environment
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

_SOURCE = Path(__file__).parent / "fakes" / "libdcmi.c"


def build_libdcmi(host_root: Path) -> Path:
    """``fakes/libdcmi.c`` compiled to ``<host_root>/usr/local/dcmi/libdcmi.so`` (replacing the empty file
    ``HostTree.add_driver`` puts there)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the fake libdcmi.so")
    library = host_root / "usr/local/dcmi/libdcmi.so"
    library.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(_SOURCE)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return library


def dcmi_env(
    pairs: Mapping[int, int] | None = None, fail: int | None = None, wait: Path | None = None
) -> dict[str, str]:
    """The environment an agent passes on to its pairing child: ``pairs`` (card -> brother), or every
    call failing with ``fail``; with ``wait`` (a FIFO) the child hangs until it is written and closed."""
    spec = f"ret:{fail}" if fail is not None else ",".join(f"{a}:{b}" for a, b in (pairs or {}).items())
    return {**os.environ, "FAKE_DCMI_BROTHERS": spec, **({"FAKE_DCMI_WAIT": str(wait)} if wait else {})}
