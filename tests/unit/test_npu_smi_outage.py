"""The devfs backend, the flap hold and the device-info lists over npu-smi outages (a real fake npu-smi on a
temporary host tree): an outage is npu-smi's own state, never graded as a fault of the chips."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ascend_agent.backends.devfs import DevfsBackend
from ascend_agent.cluster.deviceinfo import device_lists
from ascend_agent.config import Settings
from ascend_agent.health.flaphold import ChipHold
from ascend_agent.model import Inventory
from tests.support import CONSTRUCTED, FIXTURES
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi

B4_INFO = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()
BUSY = (CONSTRUCTED / "error-info-dcmi-8020-busy.txt").read_text()
R = "huawei.com/Ascend910"
ALL = ",".join(f"Ascend910-{i}" for i in range(8))


async def _seen(backend: DevfsBackend, hold: ChipHold) -> Inventory:
    inventory = await backend.discover()
    return replace(inventory, chips=hold.apply(inventory.chips))


async def test_an_outage_is_listed_recovering_never_as_a_fault_and_holds_nothing(short_dir: Path) -> None:
    host = HostTree(short_dir / "host").add_driver().add_management().add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", B4_INFO)
    settings = Settings(host_root=host.root, npu_smi=str(npu_smi.path), health_failure_threshold=2)
    backend = DevfsBackend(settings)
    hold = ChipHold(threshold=3, window=600, quiet=600)
    await backend.query()
    assert {chip.healthy for chip in (await _seen(backend, hold)).chips} == {True}
    for _ in range(3):
        npu_smi.set_output("info", BUSY)
        await backend.query()
        assert not (await _seen(backend, hold)).outage, "one failed query keeps the last known health"
        await backend.query()
        down = await _seen(backend, hold)
        assert "npu-smi failed 2 times in a row" in down.outage and "ret -8020" in down.outage
        assert {(chip.healthy, chip.health_unknown, chip.held) for chip in down.chips} == {
            (False, True, False)
        }
        lists = device_lists(down, since={}, now_ms=0)
        assert lists[f"{R}-Unhealthy"] == "", "npu-smi down is no fault of the chips"
        assert lists[f"{R}-Fault"] == "[]"
        assert lists[f"{R}-Recovering"] == ALL, "out of service while nobody can see them"
        assert lists[R] == ""
        npu_smi.set_output("info", B4_INFO)
        await backend.query()
        up = await _seen(backend, hold)
        assert up.outage == ""
        assert {(chip.healthy, chip.held) for chip in up.chips} == {(True, False)}, "no flap counted"
        assert device_lists(up, since={}, now_ms=0)[R] == ALL
