"""Which Kubernetes release the test cluster runs, and which scenarios it can run.

A scenario that needs a newer release than the cluster's carries ``@pytest.mark.kubernetes("1.36", why)``
(on the module or the test; the test's own mark wins): on an older release it is not run, and the run says so
at its end with the reason, never silently.

    >>> parse_release("Kubernetes v1.33.13")
    (1, 33, 13)
    >>> needs_newer((1, 33, 13), "1.34")
    True
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.cluster.harness import Cluster

GO_MOD = Path(__file__).with_name("go.mod")
_RELEASE = re.compile(r"v(\d+)\.(\d+)\.(\d+)")


def parse_release(text: str) -> tuple[int, int, int]:
    """The first ``vX.Y.Z`` in ``text``."""
    match = _RELEASE.search(text)
    if match is None:
        raise ValueError(f"no Kubernetes release (vX.Y.Z) in {text[:200]!r}")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def pinned_release() -> str:
    """The release tests/cluster/go.mod pins: the one ``make e2e`` builds without K8S_VERSION."""
    match = re.search(r"k8s\.io/kubernetes (v1\.\d+\.\d+)", GO_MOD.read_text())
    if match is None:
        raise ValueError(f"{GO_MOD} requires no k8s.io/kubernetes v1.x.y")
    return match.group(1)


def expected_release() -> str:
    """The release this run asked for: ``E2E_K8S_VERSION`` (make e2e sets it from K8S_VERSION), else the
    pinned one."""
    return os.environ.get("E2E_K8S_VERSION") or pinned_release()


def binary_release(binary: Path) -> tuple[int, int, int]:
    """The release the test cluster's binary was built from, as its API server reports it."""
    answer = subprocess.run(
        [str(binary), "kube-apiserver", "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    return parse_release(answer.stdout + answer.stderr)


def server_release(cluster: Cluster) -> tuple[int, int, int]:
    """The release the cluster's API server reports."""
    answer = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    return parse_release(answer["serverVersion"]["gitVersion"])


def needs_newer(release: tuple[int, int, int], minimum: str) -> bool:
    """Whether a scenario that needs ``minimum`` (``"1.36"``) cannot run on ``release``."""
    major, minor = (int(part) for part in minimum.split("."))
    return release[:2] < (major, minor)
