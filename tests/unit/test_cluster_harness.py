"""The parts of the real-cluster harness (tests/cluster/) that need no cluster: the kubelet check that makes
it refuse to start, the generator of tests/cluster/go.mod's staging replaces, containerd's configuration, the
OCI archive writer and the stand-in device nodes."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import stat
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

from tests.cluster import sync_go_mod
from tests.cluster.devices import MANAGEMENT, DevicesPresent, StandInDevices, numbers
from tests.cluster.harness import kubelet_answers
from tests.cluster.runtime import PAUSE_IMAGE, Containerd
from tests.cluster.runtime.oci import write_archive

ROOT = Path(__file__).resolve().parents[2]

UPSTREAM_GO_MOD = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
\tk8s.io/kubelet v0.0.0
)

replace (
\tk8s.io/kubelet => ./staging/src/k8s.io/kubelet
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/streaming => ./staging/src/k8s.io/streaming
\tgithub.com/example/other => github.com/example/other v1.2.3
)
"""


def test_a_listening_kubelet_socket_answers(short_dir: Path) -> None:
    path = short_dir / "kubelet.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen()
        assert kubelet_answers(path)


def test_a_stale_or_missing_kubelet_socket_does_not_answer(short_dir: Path) -> None:
    path = short_dir / "kubelet.sock"
    assert not kubelet_answers(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))  # bound, never listening: what a kubelet that died leaves behind
    assert path.exists()
    assert not kubelet_answers(path)


def test_the_staging_replaces_are_read_off_kubernetes_go_mod() -> None:
    modules = sync_go_mod.staging_replaces(UPSTREAM_GO_MOD)
    assert modules == ["k8s.io/api", "k8s.io/kubelet", "k8s.io/streaming"]
    block = sync_go_mod.replace_block(modules, "v0.36.3")
    assert "\tk8s.io/streaming => k8s.io/streaming v0.36.3\n" in block


def test_the_pinned_version_gives_the_staging_version() -> None:
    go_mod = (ROOT / "tests" / "cluster" / "go.mod").read_text()
    kubernetes, staging = sync_go_mod.pinned_kubernetes(go_mod)
    assert kubernetes.startswith("v1.")
    assert staging == "v0." + kubernetes.removeprefix("v1.")


def test_the_block_is_replaced_in_place_and_kept_once() -> None:
    go_mod = (ROOT / "tests" / "cluster" / "go.mod").read_text()
    block = sync_go_mod.replace_block(["k8s.io/api"], "v0.1.2")
    once = sync_go_mod.with_block(go_mod, block)
    assert once.count(sync_go_mod.BEGIN) == 1
    assert sync_go_mod.with_block(once, block) == once
    assert "k8s.io/kubernetes v1." in once


def test_the_committed_go_mod_has_the_generated_block() -> None:
    """Every staging replace in go.mod points at the staging version of the pinned Kubernetes."""
    go_mod = (ROOT / "tests" / "cluster" / "go.mod").read_text()
    _, staging = sync_go_mod.pinned_kubernetes(go_mod)
    block = go_mod[go_mod.index(sync_go_mod.BEGIN) : go_mod.index(sync_go_mod.END)]
    replaces = [line.split() for line in block.splitlines() if "=>" in line]
    assert len(replaces) > 20
    assert all(r[0] == r[2] and r[3] == staging for r in replaces), replaces


def test_make_test_does_not_build_the_cluster() -> None:
    """`make test` runs lint and pytest; the cluster's binary is built only by make e2e and make e2e-build."""
    dry = subprocess.run(
        ["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert "tests/cluster/build.sh" not in dry.stdout
    assert "go build" not in dry.stdout


def test_containerds_configuration_keeps_everything_under_its_work_directory(tmp_path: Path) -> None:
    """Every path containerd, runc and the CNI plugins are told of is under the cluster's work directory, but
    the CDI directories and the executables; and what this kind of machine needs is set."""
    names = ("containerd", "ctr", "containerd-shim-runc-v2", "runc", "bridge", "loopback", "host-local")
    tools = {name: tmp_path / "tools" / name for name in names}
    for path in tools.values():
        path.parent.mkdir(exist_ok=True)
        path.write_text("")
    work = tmp_path / "work" / "containerd"
    runtime = Containerd(tools, work, cdi_dirs=[tmp_path / "cdi"])
    runtime.write_config()
    config = tomllib.loads(runtime.config.read_text())
    cri = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["cdi_spec_dirs"] == [str(tmp_path / "cdi")]
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc["SystemdCgroup"] is False and runc["BinaryName"] == str(tools["runc"])
    assert config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == PAUSE_IMAGE

    def paths(value: object) -> list[str]:
        if isinstance(value, dict):
            return [p for v in value.values() for p in paths(v)]
        if isinstance(value, list):
            return [p for v in value for p in paths(v)]
        return [value] if isinstance(value, str) and value.startswith("/") else []

    outside = [p for p in paths(config) if not p.startswith(str(work)) and p not in map(str, tools.values())]
    assert outside == [str(tmp_path / "cdi")], outside
    (conflist,) = (work / "net.d").glob("*.conflist")
    ipam = json.loads(conflist.read_text())["plugins"][0]["ipam"]
    assert ipam["dataDir"].startswith(str(work)), ipam


def test_an_oci_archive_holds_the_image_under_its_name_with_matching_digests(tmp_path: Path) -> None:
    archive = tmp_path / "pause.tar"
    write_archive(archive, "localhost/x/pause:1", {"pause": b"\x7fELF..."}, ["/pause"], user="65535:65535")
    with tarfile.open(archive) as opened:
        members = {m.name: opened.extractfile(m).read() for m in opened.getmembers()}  # type: ignore[union-attr]
    for name, content in members.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(content).hexdigest() == name.rsplit("/", 1)[1]
    (described,) = json.loads(members["index.json"])["manifests"]
    assert described["annotations"]["io.containerd.image.name"] == "localhost/x/pause:1"
    manifest = json.loads(members[f"blobs/sha256/{described['digest'].split(':')[1]}"])
    config = json.loads(members[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["config"] == {"Entrypoint": ["/pause"], "User": "65535:65535"}
    (layer,) = manifest["layers"]
    with tarfile.open(fileobj=io.BytesIO(members[f"blobs/sha256/{layer['digest'].split(':')[1]}"])) as files:
        (entry,) = files.getmembers()
        assert (entry.name, entry.mode, entry.mtime) == ("pause", 0o755, 0)
    rewritten = tmp_path / "again.tar"
    write_archive(rewritten, "localhost/x/pause:1", {"pause": b"\x7fELF..."}, ["/pause"], user="65535:65535")
    assert rewritten.read_bytes() == archive.read_bytes()


def test_stand_in_device_numbers_tell_the_nodes_apart_and_a_real_node_is_refused(tmp_path: Path) -> None:
    assert numbers("davinci3") == (240, 3)
    assert numbers("vdavinci116") == (242, 116)
    assert [numbers(name) for name in MANAGEMENT] == [(241, 0), (241, 1), (241, 2)]
    (tmp_path / "davinci0").write_text("")  # the host has one already
    with pytest.raises(DevicesPresent, match="davinci0 exists"):
        StandInDevices(tmp_path).make(["davinci0"])


def test_a_stand_in_an_earlier_run_left_is_named_as_such(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    os.mknod(tmp_path / "davinci3", 0o600 | stat.S_IFCHR, os.makedev(*numbers("davinci3")))
    with pytest.raises(DevicesPresent, match="a stand-in an earlier run left"):
        StandInDevices(tmp_path).make(["davinci3"])
