"""The parts of the real-cluster harness (tests/cluster/) that need no cluster: the kubelet check that makes
it refuse to start, and the generator of tests/cluster/go.mod's staging replaces."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tests.cluster import sync_go_mod
from tests.cluster.harness import kubelet_answers

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
