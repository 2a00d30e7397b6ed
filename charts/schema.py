"""values.schema.json's ``config``: the agent's own schema of its config file (``config.file_schema``: every
setting with its type, choices and bounds, no other key), with what the chart's templates need beyond it.
`make helm-schema` writes it after a setting is added or changed; tests/unit/test_chart.py fails while the
committed schema is not what this makes. Runs in the agent's environment (.venv)::

    .venv/bin/python charts/schema.py          # rewrites charts/ascend-agent/values.schema.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "charts" / "ascend-agent" / "values.schema.json"
# The templates make hostPath volumes of these, which Kubernetes takes only as absolute paths; kubeletDir has
# no default in the templates.
HOST_PATHS = ("kubeletDir", "pluginDir", "pluginsRegistryDir")
REQUIRED = ["kubeletDir"]
DESCRIPTION = (
    "The agent's settings (examples/config.yaml), written to its ConfigMap: every key the agent knows, with "
    "its type and choices, and no other (made from the agent's settings by charts/schema.py)."
)
WIDTH = 110


def config_schema() -> dict[str, Any]:
    """The schema of the chart's ``config`` value (the agent's package importable: installed, or the tree's
    root on ``sys.path``, which :func:`main` puts there)."""
    from ascend_agent.config import file_schema

    schema = file_schema()
    for key in HOST_PATHS:
        schema["properties"][key]["pattern"] = "^/"
    return {"description": DESCRIPTION, **schema, "required": REQUIRED}


def dumps(value: Any, indent: int = 0, column: int = 0) -> str:
    """JSON as a person would lay it out: a value on one line where it fits in WIDTH columns (from
    ``column``, where it starts), else one entry per line, indented by two more than ``indent``."""
    flat = json.dumps(value, ensure_ascii=False)
    if column + len(flat) <= WIDTH or not isinstance(value, dict | list) or not value:
        return flat
    inner = " " * (indent + 2)
    if isinstance(value, dict):
        entries = []
        for key, item in value.items():
            head = f"{inner}{json.dumps(key)}: "
            entries.append(head + dumps(item, indent + 2, len(head)))
    else:
        entries = [inner + dumps(item, indent + 2, len(inner)) for item in value]
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    return opening + "\n" + ",\n".join(entries) + "\n" + " " * indent + closing


def generated() -> dict[str, Any]:
    """values.schema.json as it must be: the committed one with its ``config`` made again."""
    document: dict[str, Any] = json.loads(SCHEMA.read_text(encoding="utf-8"))
    document["properties"]["config"] = config_schema()
    return document


def main() -> int:
    sys.path.insert(0, str(ROOT))
    SCHEMA.write_text(dumps(generated()) + "\n", encoding="utf-8")
    print(f"wrote {SCHEMA.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
