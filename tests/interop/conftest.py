"""The grpc-go kubelet stand-in for the interop tests: skipped with the reason when it has not been built (a
plain ``pytest`` stays green), a failure instead under ``make interop``, which builds it first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop import built
from tests.support.gokubelet import BINARY, GoKubelet


@pytest.fixture(scope="session")
def standin_binary() -> Path:
    return built(BINARY, "the grpc-go kubelet stand-in")


@pytest.fixture
def go_kubelet(standin_binary: Path, short_dir: Path) -> Iterator[GoKubelet]:
    """The stand-in serving ``short_dir/kubelet/kubelet.sock``, as the kubelet's device manager."""
    with GoKubelet(short_dir / "kubelet", binary=standin_binary) as kubelet:
        yield kubelet


@pytest.fixture
def watching_kubelet(standin_binary: Path, short_dir: Path) -> Iterator[GoKubelet]:
    """The stand-in with its plugin watcher on ``short_dir/registry`` as well."""
    with GoKubelet(short_dir / "kubelet", short_dir / "registry", binary=standin_binary) as kubelet:
        yield kubelet
