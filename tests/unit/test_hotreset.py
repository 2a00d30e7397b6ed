"""The hot reset on a node made of the devfs backend over a host tree and a fake npu-smi, graded by Huawei's
fault table, driven as the agent drives it (a health query and a discovery, then observe and apply), with
short waits: the reset that works, hangs, fails or whose chip never comes back, the pod that arrives during
the idle wait or at the last check, the process that keeps the group busy, the budget and the dry run."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import REGISTRY

from ascend_agent.backends.devfs import DevfsBackend
from ascend_agent.config import Settings
from ascend_agent.health.grading import FaultGrading
from ascend_agent.health.hotreset import manager as steps
from ascend_agent.health.hotreset.manager import HotReset
from ascend_agent.model import Health, Inventory
from tests.support import FIXTURES
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.training_fixtures import TRAINING

B4_OK = (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text()
WITH_PROCESS = (FIXTURES / "910B3x8-26.1.0-info-with-process.txt").read_text()
ALARM = (TRAINING / "npu-smi-info-t-health_fixture-alarm.txt").read_text()  # 8C03A000: RestartNPU


def _with_chip_5(table: str, health: str) -> str:
    lines = table.splitlines(keepends=True)
    row = next(i for i, line in enumerate(lines) if line.startswith("| 5 "))
    cells = lines[row].split("|")
    cells[2] = f" {health:<{len(cells[2]) - 1}}"
    lines[row] = "|".join(cells)
    return "".join(lines)


B4_SICK = _with_chip_5(B4_OK, "Alarm")


class _Node:
    """The agent's part around the hot reset, in this process."""

    def __init__(self, directory: Path, **settings: Any) -> None:
        self.host = HostTree(directory / "host").add_chips(range(8)).add_management()
        self.npu_smi = FakeNpuSmi(directory / "npu-smi")
        self.npu_smi.set_output("info", B4_SICK)
        self.npu_smi.set_output("info -t health -i 5 -c 0", ALARM)
        self.settings = Settings(
            host_root=self.host.root,
            npu_smi=str(self.npu_smi.path),
            **{"hot_reset": "idle", "hot_reset_idle": 0.3, "hot_reset_timeout": 10.0,
               "hot_reset_recover": 10.0, **settings},
        )  # fmt: skip
        self.backend = DevfsBackend(self.settings)
        self.grading = FaultGrading.builtin()
        self.held: frozenset[str] = frozenset()
        self.notes: list[tuple[str, str, str, str]] = []
        self.annotations: list[dict[str, Any]] = []
        self.published = Inventory()
        self.own = Inventory()
        self.at_last_check: list[Inventory] = []
        self.on_last_check: Callable[[], None] = lambda: None
        self.resets = HotReset(
            self.settings,
            resetter=lambda: self.backend,
            held=lambda: self.held,
            refresh_holders=self._refresh,
            wake=self._publish,
            note=lambda *note: self.notes.append(note),
            manual_resets=lambda value: self.annotations.append(json.loads(value)),
        )

    async def _refresh(self) -> None:
        self.at_last_check.append(self.published)
        self.on_last_check()

    def _publish(self) -> None:
        self.published = self.resets.apply(self.own)

    async def step(self) -> None:
        await self.backend.query()
        self.own = self.grading.apply(await self.backend.discover())
        self.resets.observe(self.own)
        self._publish()

    def reasons(self) -> list[str]:
        return [reason for _, reason, _, _ in self.notes]

    def run_until(self, done: Callable[[], bool], timeout: float = 20.0) -> None:
        """Query, discover and observe in a loop beside the reset task until ``done``."""

        async def main() -> None:
            with anyio.fail_after(timeout):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self.resets.run)
                    while not done():
                        await self.step()
                        await anyio.sleep(0.05)
                    tasks.cancel_scope.cancel()

        anyio.run(main)

    def chip(self, phys_id: int) -> Any:
        return next(chip for chip in self.own.chips if chip.phys_id == phys_id)


@pytest.fixture
def node(short_dir: Path) -> Iterator[_Node]:
    yield _Node(short_dir)


def _count(result: str) -> float:
    return REGISTRY.get_sample_value("ascend_agent_resets_total", {"result": result}) or 0.0


def test_a_reset_runs_once_the_box_is_idle_and_the_chip_comes_back(node: _Node) -> None:
    node.npu_smi.set_reset("ok", after={"info": B4_OK})
    succeeded = _count("succeeded")
    started = time.monotonic()
    node.run_until(lambda: steps.COMPLETED in node.reasons())
    cycle = time.monotonic() - started
    assert node.npu_smi.resets() == ["set -t reset -i 5 -c 0 -m 1 | Y"]
    assert node.reasons() == [steps.WAITING, steps.STARTED, steps.COMPLETED]
    kind, _, subject, message = node.notes[1]
    assert (kind, subject) == ("Normal", "Ascend910-5")
    assert message.startswith("Hot reset of Ascend910-5: npu-smi set -t reset -i 5 -c 0 -m 1 (RestartNPU, ")
    assert "(reset group Ascend910-0, Ascend910-1," in message
    # Before the reset ran, the whole box was published Unhealthy: no Allocate could hand out its chips.
    (published,) = node.at_last_check
    assert {chip.health for chip in published.chips} == {Health.UNHEALTHY}
    assert published.chips[0].reason.startswith("hot reset of Ascend910-0, Ascend910-1, ")
    assert node.chip(5).healthy and node.resets.apply(node.own) == node.own, "the mark is gone"
    assert _count("succeeded") == succeeded + 1
    assert node.annotations == [], "nothing left to a person"
    print(f"reset cycle: {cycle:.2f} s from the first query to the chip Healthy again")


def test_a_pod_that_arrives_during_the_idle_wait_calls_the_reset_off(short_dir: Path) -> None:
    node = _Node(short_dir, hot_reset_idle=1.5)
    node.npu_smi.set_reset("ok", after={"info": B4_OK})
    node.run_until(lambda: steps.WAITING in node.reasons())
    node.held = frozenset({"Ascend910-2"})  # the same HCCS box as the faulty chip 5
    node.run_until(lambda: steps.CANCELLED in node.reasons())
    assert "called off: a pod holds Ascend910-2" in node.notes[-1][3]
    assert node.npu_smi.resets() == []
    node.held = frozenset()
    node.run_until(lambda: steps.COMPLETED in node.reasons())
    assert node.reasons() == [steps.WAITING, steps.CANCELLED, steps.WAITING, steps.STARTED, steps.COMPLETED]
    assert len(node.npu_smi.resets()) == 1


def test_a_pod_found_at_the_last_check_calls_the_reset_off(node: _Node) -> None:
    def pod_arrives() -> None:
        node.held = frozenset({"Ascend910-7"})

    node.on_last_check = pod_arrives
    node.npu_smi.set_reset("ok", after={"info": B4_OK})
    node.run_until(lambda: steps.CANCELLED in node.reasons())
    assert node.npu_smi.resets() == [], "never a reset of a chip a pod holds"
    assert node.resets.apply(node.own) == node.own, "the box is published as it is again"


def test_a_process_on_a_chip_of_the_box_keeps_it_busy(node: _Node) -> None:
    node.npu_smi.set_output("info", _with_chip_5(WITH_PROCESS, "Alarm"))  # a process on chip 0
    node.npu_smi.set_reset("ok")
    node.run_until(lambda: node.npu_smi.count("info") >= 8)
    assert not node.chip(5).healthy and node.chip(0).processes == 1
    assert node.notes == [] and node.npu_smi.resets() == []


def test_a_hanging_reset_is_killed_and_left_to_a_person(short_dir: Path) -> None:
    node = _Node(short_dir, hot_reset_timeout=3.0)
    node.npu_smi.set_reset("hang")
    hung = _count("hung")
    node.run_until(lambda: steps.FAILED in node.reasons())
    kind, _, subject, message = node.notes[-1]
    assert (kind, subject) == ("Warning", "Ascend910-5")
    assert "did not finish within 3 s" in message and "left to a person" in message
    assert node.annotations[-1]["ManualResetDevs"] == [
        {"CardId": 5, "DeviceId": 0, "AssociatedCardId": -1, "PhyID": 5, "LogicID": -1}
    ]
    assert _count("hung") == hung + 1
    assert not node.chip(5).healthy
    # Left to a person: no more resets while it stays faulty.
    queries = node.npu_smi.count("info")
    node.run_until(lambda: node.npu_smi.count("info") >= queries + 3)
    assert len(node.npu_smi.resets()) == 1


def test_a_chip_that_never_comes_back_is_left_to_a_person(short_dir: Path) -> None:
    node = _Node(short_dir, hot_reset_recover=1.0)
    node.npu_smi.set_reset("ok")  # reset, but the chip stays in Alarm
    node.run_until(lambda: steps.FAILED in node.reasons())
    assert "not Healthy within 1 s of its reset" in node.notes[-1][3]
    assert [d["PhyID"] for d in node.annotations[-1]["ManualResetDevs"]] == [5]


def test_a_failed_reset_is_left_to_a_person_until_the_chip_is_healthy(node: _Node) -> None:
    node.npu_smi.set_reset("fail")
    failed = _count("failed")
    node.run_until(lambda: steps.FAILED in node.reasons())
    assert "Failed to reset chip (exit status 1)" in node.notes[-1][3]
    assert _count("failed") == failed + 1
    node.npu_smi.set_output("info", B4_OK)
    node.run_until(lambda: node.annotations[-1]["ManualResetDevs"] == [])
    assert node.chip(5).healthy


def test_the_budget_leaves_a_chip_reset_too_often_to_a_person(short_dir: Path) -> None:
    node = _Node(short_dir, hot_reset_limit=1)
    node.npu_smi.set_reset("ok", after={"info": B4_OK})
    node.run_until(lambda: steps.COMPLETED in node.reasons())
    node.npu_smi.set_output("info", B4_SICK)  # the fault comes back
    node.run_until(lambda: steps.EXHAUSTED in node.reasons())
    assert "reset 1 times within 21600 s already" in node.notes[-1][3]
    assert len(node.npu_smi.resets()) == 1
    assert [d["PhyID"] for d in node.annotations[-1]["ManualResetDevs"]] == [5]


def test_a_dry_run_says_what_it_would_reset_and_runs_nothing(short_dir: Path) -> None:
    node = _Node(short_dir, hot_reset="dry-run")
    node.npu_smi.set_reset("ok", after={"info": B4_OK})
    node.run_until(lambda: steps.DRY_RUN in node.reasons())
    assert "would run npu-smi set -t reset -i 5 -c 0 -m 1 for Ascend910-5 (RestartNPU" in node.notes[-1][3]
    queries = node.npu_smi.count("info")
    node.run_until(lambda: node.npu_smi.count("info") >= queries + 5)
    assert node.reasons() == [steps.WAITING, steps.DRY_RUN], "said once"
    assert node.npu_smi.resets() == [] and not node.chip(5).healthy


def test_off_does_nothing(short_dir: Path) -> None:
    node = _Node(short_dir, hot_reset="off")
    node.npu_smi.set_reset("ok")
    node.run_until(lambda: node.npu_smi.count("info") >= 5)
    assert node.notes == [] and node.npu_smi.resets() == []
    assert replace(node.own) == node.resets.apply(node.own)
