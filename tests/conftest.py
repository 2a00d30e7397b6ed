"""Shared fixtures: grpcio classes generated from protos/ at session start, short socket directories,
the kubelet stand-in and the agent as a real process."""

from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from kubelet_standin import KubeletStandin

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def kubelet_api(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    """(api_pb2, api_pb2_grpc): protobuf and grpcio classes compiled from our .proto, independent of ours."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("grpcio-api")
    proto = "deviceplugin/v1beta1/api.proto"
    include = Path(protoc.__file__).parent / "_proto"
    code = protoc.main(
        [
            "protoc",
            f"-I{ROOT / 'protos'}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            proto,
        ]
    )
    assert code == 0, "grpc_tools.protoc failed on protos/"
    sys.path.insert(0, str(out))
    return (
        importlib.import_module("deviceplugin.v1beta1.api_pb2"),
        importlib.import_module("deviceplugin.v1beta1.api_pb2_grpc"),
    )


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory under /tmp: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="aa-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(kubelet_api: tuple[ModuleType, ModuleType], short_dir: Path) -> Iterator[KubeletStandin]:
    """A started kubelet stand-in on ``short_dir/kubelet``."""
    standin = KubeletStandin(short_dir / "kubelet", *kubelet_api)
    standin.start()
    yield standin
    standin.stop()
