"""Files changed the way tools and ConfigMaps change them: a new file renamed over the old one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def replace_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    temporary.rename(path)


def write_state(path: Path, state: dict[str, Any]) -> None:
    """A fake backend state file (``{"unhealthy": [3]}``), replaced by rename."""
    replace_text(path, json.dumps(state))
