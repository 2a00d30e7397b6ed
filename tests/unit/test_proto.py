"""The generated betterproto2 code under ascend_agent/_proto matches protos/ (run `make proto` when not): the
kubelet's device plugin, plugin-registration and pod-resources APIs there, the DRA driver's in _proto/dra."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from grpc_tools import protoc

from tests.support import ROOT

GENERATED = ROOT / "ascend_agent" / "_proto"


def test_checked_in_code_is_not_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The plugin runs from PATH and formats with ruff under the project's settings, as `make proto` does.
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.chdir(ROOT)
    runs = {
        tmp_path: [
            "deviceplugin/v1beta1/api.proto",
            "pluginregistration/v1/api.proto",
            "podresources/v1/api.proto",
        ],
        tmp_path / "dra": [
            "dra/v1/api.proto",
            "dra/v1beta1/api.proto",
            "dra-health/v1/api.proto",
            "dra-health/v1alpha1/api.proto",
        ],
    }
    for out, protos in runs.items():
        out.mkdir(exist_ok=True)
        options = [
            f"-I{ROOT / 'protos'}",
            f"--python_betterproto2_out={out}",
            "--python_betterproto2_opt=client_generation=async,server_generation=async",
        ]
        assert protoc.main(["protoc", *options, *protos]) == 0
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    checked_in = {
        p.relative_to(GENERATED): p.read_bytes()
        for p in GENERATED.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sorted(fresh) == sorted(checked_in)
    stale = [str(name) for name, data in fresh.items() if checked_in[name] != data]
    assert not stale, f"stale generated code in {stale}: run `make proto`"
