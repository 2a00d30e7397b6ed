"""Shared fixtures: grpcio classes generated from protos/ at session start, short socket directories,
the kubelet stand-in and the agent as a real process."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

from tests.support.kubelet_standin import KubeletStandin, compile_api, compile_proto

# ``apiserver``: a Kubernetes API emulator with a kubeconfig file; ``podresources``: the kubelet's
# PodResources socket; ``processes``: every process a test started, its children's too, is ended after it, and
# the test fails naming what it left running.
pytest_plugins = ["tests.support.apiserver", "tests.support.podresources", "tests.support.processes"]

# No deadline per example: one that takes 250 ms on a loaded machine is no bug (speed is for `make bench`).
settings.register_profile("no-deadline", deadline=None)
settings.load_profile("no-deadline")


@pytest.fixture(scope="session")
def kubelet_api(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    """(api_pb2, api_pb2_grpc): protobuf and grpcio classes compiled from our .proto, independent of ours."""
    return compile_api(tmp_path_factory.mktemp("grpcio-api"))


@pytest.fixture(scope="session")
def registration_api(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    """(api_pb2, api_pb2_grpc) of pluginregistration v1, compiled now from protos/ for grpcio."""
    return compile_proto(
        tmp_path_factory.mktemp("grpcio-pluginregistration"), "pluginregistration/v1/api.proto"
    )


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory under /tmp: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="aa-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def state(short_dir: Path) -> Path:
    """An empty fake backend state file (``--fake-state``): no faults yet."""
    path = short_dir / "state.json"
    path.write_text("{}")
    return path


@pytest.fixture
def kubelet(kubelet_api: tuple[ModuleType, ModuleType], short_dir: Path) -> Iterator[KubeletStandin]:
    """A started kubelet stand-in on ``short_dir/kubelet``."""
    standin = KubeletStandin(short_dir / "kubelet", *kubelet_api)
    standin.start()
    yield standin
    standin.stop()
