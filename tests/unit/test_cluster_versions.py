"""The test cluster built for another Kubernetes release (tests/cluster/build.sh with K8S_VERSION) and the
scenarios selected by release, without building Kubernetes: build.sh runs against a stand-in ``go`` on PATH
that answers ``go mod download``, ``go mod tidy`` and ``go build`` as told, so what a refused release leaves
behind (one line, exit 2, nothing in the cache) is seen on the real script."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.cluster import version_module
from tests.cluster.versions import needs_newer, parse_release

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "tests" / "cluster" / "build.sh"

KUBERNETES_GO_MOD = """module k8s.io/kubernetes

go 1.24.0

require (
\tgo.etcd.io/etcd/client/v3 v3.5.21
\tk8s.io/api v0.0.0
)

require go.etcd.io/etcd/server/v3 v3.5.21 // indirect

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/kubelet => ./staging/src/k8s.io/kubelet
)
"""

# A stand-in for go: `go mod download -json` answers from $STANDIN/download.json, or fails as the proxy does
# with $STANDIN/refused.json; `go mod tidy` takes no flag and writes a go.sum; `go build` keeps its arguments
# in $STANDIN/build-args and fails with $STANDIN/build-error when it exists, else writes its -o.
STANDIN_GO = """#!/bin/sh
case "$1 $2" in
"env GOVERSION") echo go1.26.8 ;;
"mod download")
  if [ -f "$STANDIN/download.json" ]; then cat "$STANDIN/download.json"; exit 0; fi
  cat "$STANDIN/refused.json"; exit 1 ;;
"mod tidy")
  if [ $# -gt 2 ]; then echo "flag provided but not defined: $3" >&2; exit 2; fi
  : > go.sum ;;
build*)
  echo "$*" > "$STANDIN/build-args"
  if [ -f "$STANDIN/build-error" ]; then
    echo "# ascend-agent/cluster" >&2; cat "$STANDIN/build-error" >&2; exit 1
  fi
  while [ $# -gt 0 ]; do if [ "$1" = -o ]; then shift; echo binary > "$1"; chmod +x "$1"; fi; shift; done ;;
*) echo "stand-in go: unexpected $*" >&2; exit 3 ;;
esac
"""
REFUSED = {
    "Path": "k8s.io/kubernetes",
    "Error": "reading https://proxy.golang.org/k8s.io/kubernetes/@v/v1.99.1.info: 403 Forbidden\n"
    "\tserver response: This module version is not available.",
}


@pytest.fixture
def standin(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(STANDIN_GO)
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "cache").mkdir()
    (tmp_path / "refused.json").write_text(json.dumps(REFUSED))
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STANDIN": str(tmp_path),
        "ASCEND_AGENT_E2E_CACHE": str(tmp_path / "cache"),
        "TMPDIR": str(tmp_path),
    }


def build(env: dict[str, str], version: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUILD)], env={**env, "K8S_VERSION": version}, capture_output=True, text=True, timeout=120
    )


def served(env: dict[str, str]) -> None:
    go_mod = Path(env["STANDIN"]) / "kubernetes.mod"
    go_mod.write_text(KUBERNETES_GO_MOD)
    (Path(env["STANDIN"]) / "download.json").write_text(json.dumps({"GoMod": str(go_mod)}))


def test_a_release_the_proxy_does_not_serve_is_one_line_exit_2_and_nothing_cached(
    standin: dict[str, str],
) -> None:
    answer = build(standin, "v1.99.1")
    assert answer.returncode == 2, answer.stderr
    (line,) = answer.stderr.splitlines()
    assert line.startswith("Kubernetes v1.99.1: the Go module proxy does not serve it"), line
    assert "403 Forbidden" in line and answer.stdout == ""
    assert os.listdir(standin["ASCEND_AGENT_E2E_CACHE"]) == []


def test_a_release_that_does_not_build_is_one_line_with_gos_error_and_nothing_cached(
    standin: dict[str, str],
) -> None:
    served(standin)
    (Path(standin["STANDIN"]) / "build-error").write_text("./main.go:30:3: undefined: cli.RunNoErrOutput\n")
    answer = build(standin, "v1.33.13")
    assert answer.returncode == 2, answer.stderr
    (line,) = answer.stderr.splitlines()
    assert line.startswith("Kubernetes v1.33.13 does not build with go1.26.8: ./main.go:30:3: undefined"), (
        line
    )
    assert os.listdir(standin["ASCEND_AGENT_E2E_CACHE"]) == []


def test_a_build_that_fails_without_a_word_is_still_one_line(standin: dict[str, str]) -> None:
    served(standin)
    (Path(standin["STANDIN"]) / "build-error").write_text("")
    answer = build(standin, "v1.33.13")
    assert answer.returncode == 2, answer.stderr
    (line,) = answer.stderr.splitlines()
    assert "does not build with go1.26.8: go build failed and printed nothing" in line, line
    assert os.listdir(standin["ASCEND_AGENT_E2E_CACHE"]) == []


def test_a_release_that_builds_is_cached_apart_with_its_module_and_a_second_build_is_a_hit(
    standin: dict[str, str],
) -> None:
    served(standin)
    first = build(standin, "v1.33.13")
    assert first.returncode == 0, first.stderr
    binary = Path(first.stdout.strip())
    assert binary.name == "k8s" and binary.parent.name.startswith("v1.33.13-"), binary
    module = (binary.parent / "module" / "go.mod").read_text()
    assert "\tk8s.io/kubernetes v1.33.13\n" in module and "\tgo.etcd.io/etcd/server/v3 v3.5.21\n" in module
    assert "\tk8s.io/kubelet => k8s.io/kubelet v0.33.13\n" in module
    # Before 1.34 the kubelet's command takes no context: that file and its tag.
    assert (binary.parent / "module" / "kubelet_without_context.go").exists()
    assert " -tags kubelet_without_context " in (Path(standin["STANDIN"]) / "build-args").read_text()
    (Path(standin["STANDIN"]) / "build-error").write_text("must not be built again\n")
    second = build(standin, "v1.33.13")
    assert second.returncode == 0 and second.stdout == first.stdout, second.stderr


@pytest.mark.parametrize("version", ["1.33", "v1.33", "v2.0.0", "v1.33.13; rm -rf /"])
def test_a_malformed_release_is_refused_in_one_line(standin: dict[str, str], version: str) -> None:
    answer = build(standin, version)
    assert answer.returncode == 2
    (line,) = answer.stderr.splitlines()
    assert line.startswith("K8S_VERSION ") and "v1.<minor>.<patch>" in line, line


def test_the_etcd_of_the_release_is_its_own_go_mods() -> None:
    assert version_module.etcd_server(KUBERNETES_GO_MOD) == "v3.5.21"
    assert (
        version_module.build_tags(33) == ["kubelet_without_context"] and version_module.build_tags(34) == []
    )


def test_a_scenario_needing_a_newer_release_is_told_apart() -> None:
    assert parse_release("Kubernetes v1.37.2") == (1, 37, 2)
    assert needs_newer((1, 35, 4), "1.36") and not needs_newer((1, 36, 0), "1.36")
    assert not needs_newer((1, 37, 2), "1.34")


def test_gos_import_chain_error_is_cut_to_what_failed_and_why() -> None:
    output = (
        "go: downloading k8s.io/api v0.32.13\n"
        "go: ascend-agent/cluster imports\n"
        "\tk8s.io/kubernetes/pkg/controller/endpoint imports\n"
        "\tk8s.io/endpointslice/util: k8s.io/endpointslice@v0.32.13: reading https://proxy.golang.org/"
        "k8s.io/endpointslice/@v/v0.32.13.zip: 403 Forbidden\n"
        "\tserver response: This module version is not available.\n"
        "go: ascend-agent/cluster imports\n\tsomething else\n"
    )
    line = version_module.first_error(output)
    assert line.startswith("k8s.io/endpointslice/util: k8s.io/endpointslice@v0.32.13: reading "), line
    assert line.endswith("403 Forbidden server response: This module version is not available."), line
    assert version_module.first_error("go: downloading x\n") == "no output"
