"""One OCI archive per architecture, taken out of the multi-architecture archive image/build.sh writes.

    python release/oci.py ARCHIVE ARCH OUT    # OUT holds ARCH's image alone, under ARCHIVE's image name

The blobs are copied as they are (same digests as in ARCHIVE, nothing compressed again), and the one image in
OUT is named as ARCHIVE names its index (org.opencontainers.image.ref.name), the full name that
`ctr -n k8s.io images import` gives it.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from pathlib import Path
from typing import IO, Any

REF_NAME = "org.opencontainers.image.ref.name"
IMAGE_INDEX = "application/vnd.oci.image.index.v1+json"


class ArchiveError(Exception):
    """One line naming the archive and what is wrong with it."""


def _blob_path(digest: str) -> str:
    algorithm, _, encoded = digest.partition(":")
    return f"blobs/{algorithm}/{encoded}"


def _member(archive: tarfile.TarFile, name: str) -> tuple[tarfile.TarInfo, IO[bytes]]:
    try:
        info = archive.getmember(name)
        extracted = archive.extractfile(info)
    except KeyError:
        extracted = None
    if extracted is None:
        raise ArchiveError(f"{os.fsdecode(archive.name or '')}: no {name}; is it a whole OCI archive?")
    return info, extracted


def _read_json(archive: tarfile.TarFile, name: str) -> Any:
    with _member(archive, name)[1] as extracted:
        return json.load(extracted)


def single_architecture(archive: Path, architecture: str, out: Path) -> str:
    """Writes ``out`` with ``architecture``'s image of ``archive``; returns the image's name."""
    with tarfile.open(archive) as source:
        (top,) = _read_json(source, "index.json")["manifests"]
        name = top.get("annotations", {}).get(REF_NAME)
        if top["mediaType"] != IMAGE_INDEX or not name:
            raise ArchiveError(f"{archive}: index.json names no multi-architecture image; run image/build.sh")
        platforms = _read_json(source, _blob_path(top["digest"]))["manifests"]
        chosen = [m for m in platforms if m.get("platform", {}).get("architecture") == architecture]
        if not chosen:
            built = ", ".join(m.get("platform", {}).get("architecture", "?") for m in platforms)
            raise ArchiveError(
                f"{archive}: no linux/{architecture} image (it has {built}); run image/build.sh"
            )
        descriptor = chosen[0]
        manifest = _read_json(source, _blob_path(descriptor["digest"]))
        blobs = [descriptor, manifest["config"], *manifest["layers"]]
        index = {"schemaVersion": 2, "manifests": [{**descriptor, "annotations": {REF_NAME: name}}]}
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w") as target:
            for member, content in (
                ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
                ("index.json", json.dumps(index).encode()),
            ):
                info = tarfile.TarInfo(member)
                info.size = len(content)
                info.mode = 0o644
                target.addfile(info, io.BytesIO(content))
            for blob in blobs:
                target.addfile(*_member(source, _blob_path(blob["digest"])))
        partial.replace(out)
    return str(name)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python release/oci.py ARCHIVE ARCH OUT", file=sys.stderr)
        return 2
    try:
        print(single_architecture(Path(argv[0]), argv[1], Path(argv[2])))
    except ArchiveError as error:
        print(f"release: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
