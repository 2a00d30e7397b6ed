"""The device-info ConfigMap and ``baseDeviceInfos`` as Go reads them: decoded by ``encoding/json`` with
``DisallowUnknownFields`` into ascend-for-volcano's types (``tests/interop/deviceinfo/main.go``), the
``CheckCode`` recomputed by Go, and the whole ``DeviceInfoCfg`` re-marshalled by Go byte for byte. Built by
``make interop``; skipped without the binary, a failure under ``make interop``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio
import pytest

from ascend_agent.health.separation import ManualSeparation
from ascend_agent.model import Inventory
from tests.interop import built
from tests.support import ROOT
from tests.support.apiserver import ApiServer
from tests.support.clock import ManualClock
from tests.unit.test_volcano_deviceinfo import NAME, SAMPLE, _chips, _publishing, _wait

pytestmark = pytest.mark.interop

BINARY = ROOT / "build" / "interop" / "deviceinfo-decode"


@pytest.fixture(scope="module")
def decoder() -> Path:
    return built(BINARY, "the Go decoder")


def _decode(decoder: Path, device_info_cfg: str, base_device_infos: str) -> str:
    document = json.dumps({"DeviceInfoCfg": device_info_cfg, "baseDeviceInfos": base_device_infos})
    done = subprocess.run([decoder], input=document, capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_huaweis_own_sample_decodes(decoder: Path) -> None:
    """The Go types and the check are right for what Huawei's plugin wrote."""
    answer = _decode(decoder, SAMPLE.read_text().strip(), "{}")
    assert answer.startswith("ok ") and "faults=2" in answer


async def test_what_the_agent_publishes_decodes_in_go(decoder: Path, apiserver: ApiServer) -> None:
    separation = ManualSeparation()
    separation.update(frozenset({"Ascend910-5"}))
    async with _publishing(apiserver, separation, ManualClock(1_700_000_000.0)) as (publisher, _):
        publisher.observe(separation.apply(Inventory(_chips())))
        found = await _wait(apiserver, lambda: apiserver.get("configmaps", NAME, "kube-system"), bool)
        node = await _wait(
            apiserver,
            lambda: apiserver.get("nodes", "node-1"),
            lambda n: "baseDeviceInfos" in n["metadata"].get("annotations", {}),
        )
    answer = await anyio.to_thread.run_sync(
        lambda: _decode(
            decoder, found["data"]["DeviceInfoCfg"], node["metadata"]["annotations"]["baseDeviceInfos"]
        )
    )
    assert answer == (
        "ok keys=huawei.com/Ascend910,huawei.com/Ascend910-Fault,huawei.com/Ascend910-NetworkUnhealthy,"
        "huawei.com/Ascend910-Recovering,huawei.com/Ascend910-Unhealthy faults=2 chips=8"
    )
