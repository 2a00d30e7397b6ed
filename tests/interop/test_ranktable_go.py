"""What a rank table is made from and what it is, as Go reads them: the device-info ConfigMap and
``baseDeviceInfos`` of an 8-chip 910B node and a 16-die A3 node (``deviceinfo/main.go``), the pods'
``ascend-910-configuration`` and the ``hccl.json`` v1.0 and v1.2 of a 2-node, 16-chip job gathered from
``ascend-agent ranktable``'s parts (``ranktable/main.go``): decoded by ``encoding/json`` with
``DisallowUnknownFields``, the tables re-marshalled by Go byte for byte. Built by ``make interop``; skipped
without the binaries, a failure under ``make interop``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ascend_agent.cluster import deviceinfo
from ascend_agent.cluster.ranktable import CONFIGURATION, fragment, render
from ascend_agent.model import Inventory
from tests.interop import built
from tests.support import ROOT
from tests.support.hccl import gather
from tests.unit.test_ranktable import A3_SELECTOR, _full_a3_node, _placed, _second_910b_node
from tests.unit.test_training_outputs import _910b_node, _a3_node

pytestmark = pytest.mark.interop

BUILT = ROOT / "build" / "interop"


def _binary(name: str) -> Path:
    return built(BUILT / name, "the Go decoder")


def _go(binary: str, document: dict[str, str]) -> str:
    done = subprocess.run(
        [_binary(binary)], input=json.dumps(document), capture_output=True, text=True, timeout=10
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("inventory", "chips"), [(_910b_node(), 8), (_a3_node(), 16)], ids=["910B x8", "A3 x16"]
)
def test_device_info_and_base_device_infos_decode_in_go(inventory: Inventory, chips: int) -> None:
    lists = deviceinfo.device_lists(inventory, {}, 0)
    cfg = deviceinfo.device_info_cfg(lists, 1744182144, deviceinfo.node_super_pod(inventory))
    answer = _go(
        "deviceinfo-decode",
        {"DeviceInfoCfg": cfg, "baseDeviceInfos": deviceinfo.base_device_infos(inventory)},
    )
    assert answer == (
        "ok keys=huawei.com/Ascend910,huawei.com/Ascend910-Fault,huawei.com/Ascend910-NetworkUnhealthy,"
        f"huawei.com/Ascend910-Recovering,huawei.com/Ascend910-Unhealthy faults=0 chips={chips}"
    )


def test_two_910b_pods_make_a_v1_0_table_go_reads() -> None:
    pods = [
        _placed("worker-0", _910b_node().chips, 0, "192.168.0.11"),
        _placed("worker-1", _second_910b_node(), 1, "192.168.0.12"),
    ]
    for pod, host in zip(pods, ("192.168.0.11", "192.168.0.12"), strict=True):
        answer = _go("ranktable-decode", {"configuration": pod.annotations[CONFIGURATION]})
        assert answer == f"ok devices=8 sdids=0 host_ip={host}"
    table = render(gather(fragment(pod) for pod in pods))
    assert (
        _go("ranktable-decode", {"hccl": table, "version": "1.0"}) == "ok servers=2 devices=16 super_pods=0"
    )


def test_two_a3_pods_make_a_v1_2_table_go_reads() -> None:
    pods = [
        _placed("worker-0", _full_a3_node(40)[:8], 0, "192.168.0.40", A3_SELECTOR),
        _placed("worker-1", _full_a3_node(41)[8:], 1, "192.168.0.41", A3_SELECTOR),
    ]
    for pod, host in zip(pods, ("192.168.0.40", "192.168.0.41"), strict=True):
        answer = _go("ranktable-decode", {"configuration": pod.annotations[CONFIGURATION]})
        assert answer == f"ok devices=8 sdids=8 host_ip={host}"
    table = render(gather(fragment(pod, sp_block=8) for pod in pods))
    assert (
        _go("ranktable-decode", {"hccl": table, "version": "1.2"}) == "ok servers=2 devices=16 super_pods=2"
    )


def test_go_refuses_what_the_operator_would() -> None:
    """The decoder can fail: a v1.0 table with super-device ids, a configuration with device_ip -1."""
    pod = _placed("worker-0", _full_a3_node(40)[:8], 0, "192.168.0.40", A3_SELECTOR)
    as_v1_0 = render(gather([fragment(pod, "1.2")])).replace('"version":"1.2"', '"version":"1.0"')
    done = subprocess.run(
        [_binary("ranktable-decode")],
        input=json.dumps({"hccl": as_v1_0, "version": "1.0"}),
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 1 and "unknown field" in done.stdout
    written = json.loads(pod.annotations[CONFIGURATION])
    written["devices"][0]["device_ip"] = "-1"
    done = subprocess.run(
        [_binary("ranktable-decode")],
        input=json.dumps({"configuration": json.dumps(written)}),
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 1 and "device 0 has device_ip -1" in done.stdout
