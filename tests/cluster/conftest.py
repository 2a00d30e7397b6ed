"""The real single-node cluster for the ``e2e_cluster`` tests (``make e2e`` builds its binary and runs them).

Without the binary (``E2E_K8S_BINARY``) these tests skip, so a plain ``pytest`` stays green; under
``make e2e`` (``E2E_REQUIRE_CLUSTER=1``) they fail instead. Where a kubelet already answers at
/var/lib/kubelet/device-plugins/kubelet.sock the run stops at once with exit status 2.

The kubelet runs on containerd (tests/cluster/runtime/build.sh builds it, cached), which gets the images of
``E2E_IMAGES`` (OCI archives, ``:``-separated; ``make e2e`` passes the agent's image).

The scenarios run are those the binary's Kubernetes release can run (tests/cluster/versions.py); the end of
the run names the release, how many ran, and each scenario left out with the release it needs. With
``E2E_RESULT`` set, the same goes to that file as JSON (``make e2e-matrix`` collects them).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import FIGURES, Cluster, KubeletPresent
from tests.cluster.runtime import binaries
from tests.cluster.versions import binary_release, needs_newer

# The release the session's binary runs, and the scenarios left out for it: (node id, minimum, why).
RELEASE: list[tuple[int, int, int]] = []
LEFT_OUT: list[tuple[str, str, str]] = []
_STARTED = time.monotonic()


@pytest.fixture(scope="session")
def k8s_binary() -> Path:
    binary = Path(os.environ.get("E2E_K8S_BINARY", ""))
    if binary.name and binary.is_file() and os.access(binary, os.X_OK):
        return binary
    reason = "the test cluster's binary is not built (E2E_K8S_BINARY): `make e2e` builds it and runs these"
    if os.environ.get("E2E_REQUIRE_CLUSTER"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def cluster(k8s_binary: Path) -> Iterator[Cluster]:
    images = tuple(Path(path) for path in os.environ.get("E2E_IMAGES", "").split(":") if path)
    if not images:  # every pod would wait for an image the node does not have
        pytest.fail("E2E_IMAGES names no image archive: `make e2e` builds the agent's and passes it")
    started = Cluster(k8s_binary, binaries(), images=images)
    try:
        started.start()
    except KubeletPresent as refusal:
        started.stop()
        pytest.exit(str(refusal), returncode=2)
    except BaseException:
        problems = started.stop()
        if problems:
            print("\n".join(problems))
        raise
    yield started
    problems = started.stop() + started.leftovers()
    assert not problems, "the cluster left things behind:\n" + "\n".join(problems)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What the scenarios measured, one line each; the release and the scenarios it could not run."""
    if FIGURES:
        terminalreporter.section("measured on the real node")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")
    if not RELEASE:
        return
    release = "v{}.{}.{}".format(*RELEASE[0])
    stats = terminalreporter.stats
    counts = {
        "passed": len([r for r in stats.get("passed", []) if getattr(r, "when", "") == "call"]),
        "failed": len([r for r in stats.get("failed", []) if getattr(r, "when", "") == "call"]),
        "skipped": len(stats.get("skipped", [])),
    }
    errors = len(terminalreporter.stats.get("error", []))
    terminalreporter.section(f"Kubernetes {release}")
    terminalreporter.write_line(
        f"scenarios: {counts['passed']} passed, {counts['failed']} failed, {errors} errors, "
        f"{counts['skipped']} skipped; {len(LEFT_OUT)} not run on this release"
    )
    for node_id, minimum, why in LEFT_OUT:
        terminalreporter.write_line(f"not run: {node_id}: needs Kubernetes {minimum} ({why})")
    result = os.environ.get("E2E_RESULT")
    if result:
        Path(result).write_text(
            json.dumps(
                {
                    "release": release,
                    **counts,
                    "errors": errors,
                    "not_run": [{"scenario": n, "needs": m, "why": w} for n, m, w in LEFT_OUT],
                    "seconds": round(time.monotonic() - _STARTED, 1),
                },
                indent=1,
            )
            + "\n"
        )


@pytest.hookimpl(trylast=True)  # after -m and -k: only what was asked for is named as not run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """test_standing.py first: it runs `make cluster`'s own cluster, which must end before the session's
    cluster starts (one kubelet on the machine). Scenarios marked for a newer release than the binary's are
    left out, and named at the end."""
    items.sort(key=lambda item: item.path.name != "test_standing.py")
    binary = Path(os.environ.get("E2E_K8S_BINARY", ""))
    if not (binary.name and binary.is_file()):
        return
    release = binary_release(binary)
    RELEASE[:] = [release]
    kept, left = [], []
    for item in items:
        marker = item.get_closest_marker("kubernetes")
        if marker is not None and needs_newer(release, marker.args[0]):
            left.append(item)
            LEFT_OUT.append((item.nodeid, marker.args[0], marker.args[1]))
        else:
            kept.append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept
