"""The YAML documents of manifest files, each named for test ids and messages."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml


def documents(paths: Iterable[Path]) -> list[tuple[str, dict[str, Any]]]:
    """Every document of ``paths`` in order, named ``<file>[<index>]<kind>`` (``a.yaml[0]DaemonSet``)."""
    found = []
    for path in paths:
        for index, doc in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8"))):
            if doc is not None:
                found.append((f"{path.name}[{index}]{doc.get('kind')}", doc))
    return found
