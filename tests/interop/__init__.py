"""The interop tests: the agent against Go programs built by ``make interop``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def built(binary: Path, what: str) -> Path:
    """``binary`` when ``make interop`` has built it. Without it the test is skipped with the reason (a plain
    ``pytest`` stays green); under ``make interop``, which builds it first, that is a failure."""
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    reason = f"{what} is not built ({binary}): `make interop` builds it and runs this"
    if os.environ.get("INTEROP_REQUIRE_STANDIN"):
        pytest.fail(reason)
    pytest.skip(reason)
