"""An OCI image archive written from files, without a registry or a container engine: what ``ctr images
import`` takes. The archive is an ``oci-layout`` file, an ``index.json`` naming the image and the blobs (one
uncompressed layer, the config, the manifest), byte for byte the same for the same files::

    write_archive(Path("pause.tar"), "localhost/ascend-e2e/pause:1", {"pause": pause_binary},
                  entrypoint=["/pause"], user="65535:65535")
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_LAYER = "application/vnd.oci.image.layer.v1.tar"
_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}


def _layer(files: Mapping[str, bytes]) -> bytes:
    """One layer of executables (mode 0755, owned by root), timestamps zero so the digest is stable."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for name, content in sorted(files.items()):
            entry = tarfile.TarInfo(name)
            entry.size = len(content)
            entry.mode = 0o755
            layer.addfile(entry, io.BytesIO(content))
    return out.getvalue()


def _blob(archive: tarfile.TarFile, content: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(content).hexdigest()
    entry = tarfile.TarInfo(f"blobs/sha256/{digest}")
    entry.size = len(content)
    archive.addfile(entry, io.BytesIO(content))
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(content)}


def _json(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def write_archive(
    path: Path,
    name: str,
    files: Mapping[str, bytes],
    entrypoint: Sequence[str],
    user: str = "0:0",
    architecture: str = _ARCHITECTURES.get(platform.machine(), platform.machine()),
) -> None:
    """``files`` (path in the image -> content) as the image ``name`` whose process is ``entrypoint``."""
    layer = _layer(files)
    config = {
        "architecture": architecture,
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint), "User": user},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    written = path.with_name(f".{path.name}.partial")
    with tarfile.open(written, mode="w", format=tarfile.PAX_FORMAT) as archive:
        manifest = {
            "schemaVersion": 2,
            "mediaType": _MANIFEST,
            "config": _blob(archive, _json(config), _CONFIG),
            "layers": [_blob(archive, layer, _LAYER)],
        }
        described = _blob(archive, _json(manifest), _MANIFEST)
        described["annotations"] = {
            "io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
        }
        described["platform"] = {"architecture": architecture, "os": "linux"}
        for member, document in (
            ("oci-layout", {"imageLayoutVersion": "1.0.0"}),
            (
                "index.json",
                {
                    "schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": [described],
                },
            ),
        ):
            content = _json(document)
            entry = tarfile.TarInfo(member)
            entry.size = len(content)
            archive.addfile(entry, io.BytesIO(content))
    written.replace(path)
