"""``make e2e-matrix``: the real-cluster scenarios on each Kubernetes release, one after another.

For each release: the cluster's binary built (tests/cluster/build.sh with K8S_VERSION, cached apart), then
the e2e scenarios that release can run (tests/cluster/versions.py selects them: the device plugin ones on
every release, the DRA ones from resource.k8s.io/v1 on). A release that does not build is a row saying so
with Go's error; the matrix goes on to the next. At the end: a Markdown table in build/e2e-matrix.md
(docs/compatibility.md's table is copied from it) and every row as JSON in build/e2e-matrix.json.

    python -m tests.cluster.matrix IMAGE_ARCHIVE v1.33.13 v1.37.2 ...
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
RELEASE = re.compile(r"v1\.\d+\.\d+")
# Per minor release, a patch whose modules the Go module proxy served in full on the day the matrix was last
# run (2026-12-07): the newest it listed, unless a staging module of that one was refused (v1.29.6,
# v1.31.14 and v1.32.13 were: 403 on k8s.io/kube-controller-manager or k8s.io/endpointslice at their v0.x.y).
# v1.26.15 and older: a staging module refused likewise.
RELEASES = (
    "v1.27.16",
    "v1.28.15",
    "v1.29.15",
    "v1.30.14",
    "v1.31.0",
    "v1.32.2",
    "v1.33.13",
    "v1.34.4",
    "v1.35.4",
    "v1.36.3",
    "v1.37.2",
)


@dataclass
class Row:
    release: str
    built: bool = False
    build_seconds: float = 0.0
    build_error: str = ""
    passed: int = 0
    failed: int = 0
    errors: int = 0
    not_run: list[dict[str, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        if not self.built:
            return "does not build here"
        if self.failed or self.errors or not self.passed:
            return "fails"
        return "passes"


def cache_root() -> Path:
    """Where build.sh keeps its builds (its ASCEND_AGENT_E2E_CACHE, XDG_CACHE_HOME and default, in order)."""
    if os.environ.get("ASCEND_AGENT_E2E_CACHE"):
        return Path(os.environ["ASCEND_AGENT_E2E_CACHE"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "ascend-agent" / "e2e"


def _building(release: str) -> bool:
    """Whether a live build.sh is building the release (its work directory names its process; one a killed
    build left behind does not count)."""
    for pid_file in cache_root().glob(f".building-{release}-*/pid"):
        try:
            os.kill(int(pid_file.read_text().strip()), 0)
        except (OSError, ValueError):
            continue
        return True
    return False


def wait_for_other_builds(release: str, timeout: float = 2400.0) -> None:
    """Another build of the release under way: waited for, so that this one is a cache hit instead of the
    same build twice on the machine's cores."""
    deadline = time.monotonic() + timeout
    while _building(release) and time.monotonic() < deadline:
        time.sleep(5)


def run_bounded(argv: list[str], timeout: float, **options: Any) -> tuple[int, str, str]:
    """``argv`` in a session of its own; past ``timeout`` the whole session is ended (SIGTERM, so that a
    cluster's harness tears down what it made; SIGKILL a minute later) and the status is None."""
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **options
    )
    try:
        out, err = process.communicate(timeout=timeout)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
        return -1, out, err + f"\ntimed out after {timeout:.0f} s"


def build(release: str) -> tuple[Path | None, float, str]:
    wait_for_other_builds(release)
    began = time.monotonic()
    status, out, err = run_bounded(
        [str(ROOT / "tests" / "cluster" / "build.sh")], 3600, env={**os.environ, "K8S_VERSION": release}
    )
    seconds = round(time.monotonic() - began, 1)
    if status != 0:
        lines = err.strip().splitlines()
        return None, seconds, (lines[-1] if lines else f"build.sh exited {status}")
    return Path(out.strip().splitlines()[-1]), seconds, ""


def run_scenarios(release: str, binary: Path, image: Path, row: Row) -> None:
    result = BUILD / "e2e-matrix" / f"{release}.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    env = {
        **os.environ,
        "E2E_K8S_BINARY": str(binary),
        "E2E_K8S_VERSION": release,
        "E2E_IMAGES": str(image),
        "E2E_REQUIRE_CLUSTER": "1",
        "E2E_RESULT": str(result),
    }
    argv = [sys.executable, "-m", "pytest", "-q", "-m", "e2e_cluster", "-o", "addopts=", "tests/cluster"]
    began = time.monotonic()
    status, out, err = run_bounded(argv, 3600, cwd=ROOT, env=env)
    row.seconds = round(time.monotonic() - began, 1)
    (BUILD / "e2e-matrix" / f"{release}.log").write_text(out + err)
    row.failures = [line for line in out.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    if result.exists():
        counts = json.loads(result.read_text())
        row.passed, row.failed, row.errors = counts["passed"], counts["failed"], counts["errors"]
        row.not_run = counts["not_run"]
    else:
        row.errors = 1
        row.failures.append(f"pytest exited {status} before its summary (see the log)")


def table(rows: list[Row], commit: str, day: str) -> str:
    lines = [
        f"Run on {day} at commit {commit} (`make e2e-matrix`).",
        "",
        "| Kubernetes | result | scenarios passed | failed | not run on it (needs a newer release) "
        "| build | scenarios |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in sorted(rows, key=lambda r: tuple(int(n) for n in r.release[1:].split("."))):
        left_out = ", ".join(sorted({f"{n['needs']}+" for n in row.not_run}))
        counted = f"{len(row.not_run)} ({left_out})" if row.not_run else "0"
        if not row.built:
            lines.append(f"| {row.release} | does not build here: {row.build_error} | | | | "
                         f"{row.build_seconds:.0f} s | |")  # fmt: skip
            continue
        lines.append(
            f"| {row.release} | {row.verdict} | {row.passed} | {row.failed + row.errors} | {counted} "
            f"| {row.build_seconds:.0f} s | {row.seconds:.0f} s |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: python -m tests.cluster.matrix IMAGE_ARCHIVE [v1.x.y ...]", file=sys.stderr)
        return 2
    image = Path(sys.argv[1]).resolve()
    releases = sys.argv[2:] or list(RELEASES)
    malformed = [release for release in releases if not RELEASE.fullmatch(release)]
    if malformed:
        print(
            f"MATRIX {' '.join(malformed)}: give releases as v1.<minor>.<patch>, e.g. v1.33.13",
            file=sys.stderr,
        )
        return 2
    head = ["git", "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(head, cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    rows = []
    for release in releases:
        row = Row(release)
        print(f"e2e-matrix: {release}: building", flush=True)
        binary, row.build_seconds, row.build_error = build(release)
        row.built = binary is not None
        if binary is not None:
            print(f"e2e-matrix: {release}: built in {row.build_seconds:.0f} s; the scenarios now", flush=True)
            run_scenarios(release, binary, image, row)
        print(f"e2e-matrix: {release}: {row.verdict}", flush=True)
        for line in row.failures:
            print(f"  {line}", flush=True)
        rows.append(row)
        BUILD.mkdir(exist_ok=True)
        (BUILD / "e2e-matrix.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
        (BUILD / "e2e-matrix.md").write_text(table(rows, commit.stdout.strip(), day))
    print(table(rows, commit.stdout.strip(), day))
    return 0 if all(row.verdict != "fails" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
