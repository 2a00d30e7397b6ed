"""Fixtures of the end-to-end tests that more than one file uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.host_tree import HostTree


@pytest.fixture
def host(short_dir: Path) -> HostTree:
    """A host tree with the driver's files and the management devices, and no chips yet."""
    return HostTree(short_dir / "host").add_driver().add_management()
