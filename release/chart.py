"""The chart as a Helm repository, for `make release`: the package made by Helm's own engine (helm-sdkpy, so
run by .venv-helm's Python) and the repository's index.yaml beside it, which helm-sdkpy has no action for.

    python release/chart.py DIST    # DIST/ascend-agent-<version>.tgz and DIST/index.yaml; prints both paths

index.yaml is what `helm repo index` writes for one chart: apiVersion v1, the chart's Chart.yaml as packaged,
with its sha256 digest, when it was made, and its URL relative to the index (the repository is served from
DIST, or DIST is copied as it is).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent.parent / "charts" / "ascend-agent"


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def packaged_metadata(package: Path) -> dict[str, Any]:
    """The Chart.yaml inside a Helm package (<chart>/Chart.yaml, the chart's directory at the top)."""
    with tarfile.open(package) as archive:
        names = [name for name in archive.getnames() if name.count("/") == 1 and name.endswith("/Chart.yaml")]
        extracted = archive.extractfile(names[0]) if len(names) == 1 else None
        if extracted is None:
            raise ValueError(f"{package}: not a Helm chart package (no <chart>/Chart.yaml at its top)")
        with extracted:
            metadata: dict[str, Any] = yaml.safe_load(extracted)
    return metadata


def write_index(package: Path, made: datetime) -> Path:
    """index.yaml beside ``package``, naming it alone, as made at ``made``."""
    entry = {
        **packaged_metadata(package),
        "created": _stamp(made),
        "digest": hashlib.sha256(package.read_bytes()).hexdigest(),
        "urls": [package.name],
    }
    index = {"apiVersion": "v1", "entries": {entry["name"]: [entry]}, "generated": _stamp(made)}
    path = package.parent / "index.yaml"
    path.write_text(yaml.safe_dump(index, sort_keys=True), encoding="utf-8")
    return path


def package(dest: Path) -> Path:
    """The chart packaged by Helm into ``dest``: <name>-<version>.tgz, without what .helmignore names."""
    import helm_sdkpy  # only in .venv-helm (Python 3.12 or newer); write_index is used without it

    config = helm_sdkpy.Configuration(namespace="kube-system")
    return Path(asyncio.run(helm_sdkpy.Package(config).run(str(CHART), dest_dir=str(dest))))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python release/chart.py DIST", file=sys.stderr)
        return 2
    dest = Path(argv[0])
    dest.mkdir(parents=True, exist_ok=True)
    made = package(dest)
    print(made)
    print(write_index(made, datetime.now(UTC)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
