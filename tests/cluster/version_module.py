"""Writes the test cluster's Go module for another Kubernetes release than the one tests/cluster/go.mod pins:
the same sources (main.go, etcd.go and the kubelet command file of that release) with a go.mod that requires
``k8s.io/kubernetes`` at that version, its staging modules at the matching v0.x.y, and the etcd server that
release's own go.mod names; then ``go mod tidy``. tests/cluster/build.sh runs it for ``K8S_VERSION``.

    python3 -m tests.cluster.version_module v1.33.13 /path/to/empty/dir

prints the Go build tags the sources need at that release. A version the Go module proxy does not serve, or a
module that cannot be resolved, ends in one line naming the version and Go's own error, exit status 2.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.cluster.sync_go_mod import GoModuleError, replace_block, staging_replaces, upstream_go_mod

HERE = Path(__file__).resolve().parent
VERSION = re.compile(r"v1\.(\d+)\.(\d+)")
# Before 1.34 the kubelet's command takes no context (kubelet_without_context.go).
KUBELET_CONTEXT_SINCE = 34
REQUIRED = re.compile(
    r"^\s*(?:require\s+)?(go\.etcd\.io/etcd/(?:server|client)/v3)\s+(v3\.\S+)", re.MULTILINE
)


class Refused(Exception):
    """The version cannot be built here: the message is the one line to print."""


def parse_version(version: str) -> tuple[int, int]:
    """The minor and patch of a ``v1.x.y`` release."""
    match = VERSION.fullmatch(version)
    if match is None:
        raise Refused(
            f"K8S_VERSION {version!r}: give a Kubernetes release as v1.<minor>.<patch>, e.g. v1.33.13"
        )
    return int(match.group(1)), int(match.group(2))


def build_tags(minor: int) -> list[str]:
    return ["kubelet_without_context"] if minor < KUBELET_CONTEXT_SINCE else []


def etcd_server(kubernetes_go_mod: str) -> str:
    """The etcd release the Kubernetes release's own go.mod requires (its server, else its client)."""
    found = dict(REQUIRED.findall(kubernetes_go_mod))
    version = found.get("go.etcd.io/etcd/server/v3") or found.get("go.etcd.io/etcd/client/v3")
    if version is None:
        raise Refused("its go.mod requires no go.etcd.io/etcd/server/v3 or client/v3")
    return version


def go_mod(version: str, minor: int, patch: int, kubernetes_go_mod: str) -> str:
    staging = f"v0.{minor}.{patch}"
    modules = staging_replaces(kubernetes_go_mod)
    if not modules:
        raise Refused("its go.mod replaces no staging module")
    return (
        "module ascend-agent/cluster\n\ngo 1.26.0\n\nrequire (\n"
        f"\tgo.etcd.io/etcd/server/v3 {etcd_server(kubernetes_go_mod)}\n"
        f"\tk8s.io/component-base {staging}\n"
        "\tk8s.io/kubectl v0.0.0\n"
        f"\tk8s.io/kubernetes {version}\n)\n\n" + replace_block(modules, staging)
    )


def write_module(version: str, directory: Path) -> list[str]:
    minor, patch = parse_version(version)
    tags = build_tags(minor)
    try:
        kubernetes_go_mod = upstream_go_mod(version)
    except GoModuleError as error:
        raise Refused(f"the Go module proxy does not serve it, or cannot be reached ({error})") from None
    (directory / "go.mod").write_text(go_mod(version, minor, patch, kubernetes_go_mod))
    kubelet_file = "kubelet_without_context.go" if tags else "kubelet.go"
    for name in ("main.go", "etcd.go", kubelet_file):
        shutil.copy(HERE / name, directory / name)
    # tidy takes every build tag into account: the kubelet file's dependencies are in whatever it is.
    try:
        tidy = subprocess.run(
            ["go", "mod", "tidy"], cwd=directory, capture_output=True, text=True, timeout=1200, check=False
        )
    except subprocess.TimeoutExpired:
        raise Refused("go mod tidy took over 20 minutes: is the Go module proxy reachable?") from None
    if tidy.returncode != 0:
        raise Refused(f"go mod tidy: {first_error(tidy.stderr)}")
    return tags


def first_error(output: str) -> str:
    """Go's first error as one line: an import chain (``go: a imports\n\tb imports\n\tc: why``) is cut to
    what failed and why; progress lines are passed over."""
    block: list[str] = []
    for line in output.splitlines():
        if not line.strip() or line.startswith(("go: downloading", "go: finding", "#")):
            continue
        if block and not line[:1].isspace():
            break
        block.append(line.strip())
    if not block:
        return "no output"
    failed = [line for line in block if not line.endswith(" imports")]
    return " ".join(failed or block)[:400]


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: python3 -m tests.cluster.version_module v1.<minor>.<patch> DIRECTORY", file=sys.stderr)
        return 2
    version, directory = sys.argv[1], Path(sys.argv[2])
    try:
        tags = write_module(version, directory)
    except Refused as refusal:
        print(" ".join(f"Kubernetes {version}: {refusal}".split()), file=sys.stderr)
        return 2
    print(",".join(tags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
