"""Prometheus' promtool and server as the tests find them: the paths tests/prometheus/build.sh printed into
build/prometheus-tools when `make test` built them (into a cache outside the clone). Without them the tests
that need them are skipped, or fail under CI=1, where a skip would hide that nothing was checked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import ROOT

LISTED = ROOT / "build" / "prometheus-tools"


def tool(name: str) -> Path:
    """The path of ``promtool`` or ``prometheus``; skips the test (fails it under CI=1) without one."""
    listed = LISTED.read_text(encoding="utf-8").split() if LISTED.exists() else []
    for path in map(Path, listed):
        if path.name == name and os.access(path, os.X_OK):
            return path
    missing = f"{name} is not built: run make test, or tests/prometheus/build.sh > {LISTED.relative_to(ROOT)}"
    if os.environ.get("CI"):
        pytest.fail(missing)
    pytest.skip(missing)
