"""The real single-node cluster for the ``e2e_cluster`` tests (``make e2e`` builds its binary and runs them).

Without the binary (``E2E_K8S_BINARY``) these tests skip, so a plain ``pytest`` stays green; under
``make e2e`` (``E2E_REQUIRE_CLUSTER=1``) they fail instead. Where a kubelet already answers at
/var/lib/kubelet/device-plugins/kubelet.sock the run stops at once with exit status 2.

The kubelet runs on containerd (tests/cluster/runtime/build.sh builds it, cached), which gets the images of
``E2E_IMAGES`` (OCI archives, ``:``-separated; ``make e2e`` passes the agent's image).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import FIGURES, Cluster, KubeletPresent
from tests.cluster.runtime import binaries


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
    """What the scenarios measured, one line each."""
    if FIGURES:
        terminalreporter.section("measured on the real node")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_standing.py first: it runs `make cluster`'s own cluster, which must end before the session's
    cluster starts (one kubelet on the machine)."""
    items.sort(key=lambda item: item.path.name != "test_standing.py")
