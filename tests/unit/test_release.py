"""make release (release/build.sh): the chart's default image is the image the release ships, each
architecture's archive is taken whole out of the multi-architecture one, and the chart's Helm repository index
names its package by digest."""

from __future__ import annotations

import hashlib
import io
import json
import re
import runpy
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import ROOT

OCI = runpy.run_path(str(ROOT / "release" / "oci.py"))
CHART = runpy.run_path(str(ROOT / "release" / "chart.py"))
REF_NAME = "org.opencontainers.image.ref.name"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _project_version() -> str:
    # As image/store.sh reads it.
    match = re.search(r'^version = "(.*)"$', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert match, "pyproject.toml names no version"
    return match.group(1)


def _released_image() -> str:
    """The name image/build.sh gives the image in the archive the release ships and splits by architecture."""
    script = (ROOT / "image" / "build.sh").read_text(encoding="utf-8")
    names = re.findall(r'"oci-archive:\$archive:([^"]+)"', script)
    assert len(names) == 1, f"image/build.sh names its archive's image {len(names)} times"
    return names[0].replace("$version", _project_version())


def _normalised(reference: str) -> str:
    """A reference as containerd and the kubelet read it: Docker Hub's registry and library/ filled in."""
    first, _, rest = reference.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return reference
    return f"docker.io/{reference if rest else 'library/' + reference}"


def test_the_charts_default_image_is_the_released_image() -> None:
    chart_dir = ROOT / "charts" / "ascend-agent"
    image = yaml.safe_load((chart_dir / "values.yaml").read_text(encoding="utf-8"))["image"]
    app_version = yaml.safe_load((chart_dir / "Chart.yaml").read_text(encoding="utf-8"))["appVersion"]
    default = f"{image['repository']}:{image['tag'] or app_version}"
    assert _normalised(default) == _released_image()
    assert app_version == _project_version()


def test_reference_normalisation() -> None:
    assert _normalised("ascend-agent:1") == "docker.io/library/ascend-agent:1"
    assert _normalised("org/ascend-agent:1") == "docker.io/org/ascend-agent:1"
    assert _normalised("registry.local:5000/ascend-agent:1") == "registry.local:5000/ascend-agent:1"


def _add(archive: tarfile.TarFile, name: str, content: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    archive.addfile(info, io.BytesIO(content))


def _blob(archive: tarfile.TarFile, content: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(content).hexdigest()
    _add(archive, f"blobs/sha256/{digest}", content)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(content)}


def _multi_architecture_archive(path: Path, name: str) -> dict[str, list[dict[str, Any]]]:
    """An OCI archive laid out as buildah's `manifest push --all` writes it; returns each arch's blobs."""
    blobs: dict[str, list[dict[str, Any]]] = {}
    with tarfile.open(path, "w") as archive:
        _add(archive, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        platforms = []
        for arch in ("amd64", "arm64"):
            config = _blob(archive, json.dumps({"architecture": arch}).encode(), CONFIG)
            layer = _blob(archive, f"layer of {arch}".encode(), LAYER)
            manifest = {"schemaVersion": 2, "config": config, "layers": [layer]}
            descriptor = _blob(archive, json.dumps(manifest).encode(), MANIFEST)
            platforms.append({**descriptor, "platform": {"architecture": arch, "os": "linux"}})
            blobs[arch] = [descriptor, config, layer]
        index = _blob(
            archive, json.dumps({"schemaVersion": 2, "manifests": platforms}).encode(), OCI["IMAGE_INDEX"]
        )
        top = {"schemaVersion": 2, "manifests": [{**index, "annotations": {REF_NAME: name}}]}
        _add(archive, "index.json", json.dumps(top).encode())
    return blobs


def _contents(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as archive:
        return {member.name: archive.extractfile(member).read() for member in archive}  # type: ignore[union-attr]


def test_one_architecture_is_taken_whole_out_of_the_multi_architecture_archive(tmp_path: Path) -> None:
    name = "docker.io/library/ascend-agent:9.9.9"
    blobs = _multi_architecture_archive(tmp_path / "multi.tar", name)
    out = tmp_path / "arm64.tar"

    assert OCI["single_architecture"](tmp_path / "multi.tar", "arm64", out) == name

    held = _contents(out)
    (image,) = json.loads(held.pop("index.json"))["manifests"]
    assert image["digest"] == blobs["arm64"][0]["digest"]
    assert image["platform"] == {"architecture": "arm64", "os": "linux"}
    assert image["annotations"] == {REF_NAME: name}
    assert json.loads(held.pop("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
    assert sorted(held) == sorted(
        "blobs/sha256/" + b["digest"].removeprefix("sha256:") for b in blobs["arm64"]
    )
    for path, content in held.items():
        assert hashlib.sha256(content).hexdigest() == path.rsplit("/", 1)[1]


def test_an_architecture_the_archive_lacks_is_named_with_those_it_has(tmp_path: Path) -> None:
    _multi_architecture_archive(tmp_path / "multi.tar", "ascend-agent:1")
    with pytest.raises(OCI["ArchiveError"], match=r"no linux/riscv64 image \(it has amd64, arm64\)"):
        OCI["single_architecture"](tmp_path / "multi.tar", "riscv64", tmp_path / "out.tar")
    assert not (tmp_path / "out.tar").exists()


def test_the_index_names_the_package_by_digest_and_relative_url(tmp_path: Path) -> None:
    package = tmp_path / "demo-1.2.3.tgz"
    metadata = {"apiVersion": "v2", "name": "demo", "version": "1.2.3", "appVersion": "4.5.6"}
    with tarfile.open(package, "w:gz") as archive:
        _add(archive, "demo/Chart.yaml", yaml.safe_dump(metadata).encode())
        _add(archive, "demo/templates/configmap.yaml", b"kind: ConfigMap\n")
    made = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    index = yaml.safe_load(CHART["write_index"](package, made).read_text(encoding="utf-8"))

    assert index["apiVersion"] == "v1"
    assert index["generated"] == "2026-01-02T03:04:05Z"
    (entry,) = index["entries"]["demo"]
    assert entry == {
        **metadata,
        "created": "2026-01-02T03:04:05Z",
        "digest": hashlib.sha256(package.read_bytes()).hexdigest(),
        "urls": ["demo-1.2.3.tgz"],
    }


def test_a_tarball_without_a_chart_is_refused(tmp_path: Path) -> None:
    package = tmp_path / "demo-1.2.3.tgz"
    with tarfile.open(package, "w:gz") as archive:
        _add(archive, "Chart.yaml", b"name: demo\n")
    with pytest.raises(ValueError, match="not a Helm chart package"):
        CHART["write_index"](package, datetime.now(UTC))
