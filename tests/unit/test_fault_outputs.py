"""What a chip's fault class decides outside the kubelet: the device-info ``-Fault`` entries (level, handling,
each code's level), the DRA taint effect, the Event's reason; and ``mindx-dl-fault-config`` followed through
the Kubernetes API emulator, a bad map refused with the running table kept. Chips are graded from the shared
``npu-smi info -t health`` sample."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import anyio
import pytest
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from ascend_agent.backends.npusmi import parse_health
from ascend_agent.cluster import deviceinfo
from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.cluster.events import NodeEvents
from ascend_agent.cluster.faultconfig import NAME, NAMESPACE, FaultConfigFollow
from ascend_agent.faultclass import FaultClass
from ascend_agent.health.faulttable import FaultTable
from ascend_agent.health.grading import FaultGrading
from ascend_agent.kubelet.dra.devices import DeviceTaints
from ascend_agent.model import Chip, Fault, Health, Inventory
from tests.support.apiserver import ApiServer
from tests.support.training_fixtures import read

T = "huawei.com/Ascend910"
TAINTS = DeviceTaints("npu.huawei.com", "NoSchedule")


def _graded(*chips: Chip) -> Inventory:
    return FaultGrading.builtin().apply(Inventory(chips))


def _with(phys_id: int, *codes: str, column: str = "Alarm") -> Chip:
    return Chip.make(phys_id, "910B3", faults=tuple(Fault(c) for c in codes), health_status=column)


def _alarm_sample(phys_id: int) -> Chip:
    detail = parse_health(read("npu-smi-info-t-health_fixture-alarm.txt").split("\n", 1)[1])
    return Chip.make(phys_id, "910B3", faults=detail.faults, health_status=detail.status)


def test_fault_entries_carry_the_class_as_huawei_writes_it() -> None:
    inventory = _graded(
        Chip.make(0, "910B3"), _alarm_sample(1), _with(2, "81A3880C", column="Warning"), _with(3, "80E3A201")
    )
    lists = deviceinfo.device_lists(inventory, since={}, now_ms=7)
    assert lists[f"{T}-Unhealthy"] == "Ascend910-1,Ascend910-3"
    assert lists[T] == "Ascend910-0,Ascend910-2", "a SubHealthFault chip stays schedulable"
    entries = {entry["npu_name"]: entry for entry in json.loads(lists[f"{T}-Fault"])}
    assert set(entries) == {"Ascend910-1", "Ascend910-2", "Ascend910-3"}
    restart = entries["Ascend910-1"]
    assert list(restart) == [
        "fault_type", "npu_name", "large_model_fault_level", "fault_level", "fault_handling", "fault_code",
        "fault_time_and_level_map",
    ]  # fmt: skip
    assert (restart["fault_level"], restart["fault_handling"], restart["large_model_fault_level"]) == (
        "RestartNPU",
        "RestartNPU",
        "RestartNPU",
    )
    assert restart["fault_code"] == "8C03A000,8C084E00,A4025021"
    assert restart["fault_time_and_level_map"] == {
        "8C03A000": {"fault_time": 7, "fault_level": "RestartNPU"},
        "8C084E00": {"fault_time": 7, "fault_level": "FreeRestartNPU"},
        "A4025021": {"fault_time": 7, "fault_level": "NotHandleFault"},
    }
    assert entries["Ascend910-2"]["fault_handling"] == "SubHealthFault"
    assert entries["Ascend910-3"]["fault_handling"] == "SeparateNPU"


def test_a_chip_out_for_no_class_and_a_separated_one_are_separatenpu() -> None:
    gone = Chip.make(0, "910B3").with_health(Health.UNHEALTHY, "device node /dev/davinci0 is missing")
    inventory = _graded(gone, _with(1, "A4025021"))
    lists = deviceinfo.device_lists(inventory, since={}, now_ms=7, separated=frozenset({"Ascend910-1"}))
    entries = {entry["npu_name"]: entry for entry in json.loads(lists[f"{T}-Fault"])}
    assert entries["Ascend910-0"]["fault_handling"] == "SeparateNPU"
    assert entries["Ascend910-0"]["fault_code"] == ""
    assert entries["Ascend910-1"]["fault_handling"] == "SeparateNPU"
    assert entries["Ascend910-1"]["fault_time_and_level_map"]["A4025021"]["fault_level"] == "NotHandleFault"


@pytest.mark.parametrize(
    ("codes", "effect"),
    [
        (["A4025021"], None),  # NotHandleFault
        (["81A3880C"], None),  # SubHealthFault
        (["80C98008"], None),  # RestartRequest
        (["80E01801"], None),  # RestartBusiness
        (["8C084E00"], "NoSchedule"),  # FreeRestartNPU
        (["8C03A000"], "NoSchedule"),  # RestartNPU
        (["8118043C"], "NoSchedule"),  # PreSeparateNPU
        (["80E3A201"], "NoExecute"),  # SeparateNPU
    ],
)
def test_the_taint_effect_follows_the_class(codes: list[str], effect: str | None) -> None:
    (chip,) = _graded(_with(0, *codes)).chips
    taints = TAINTS.for_chip(chip)
    assert [taint["effect"] for taint in taints] == ([effect] if effect else [])


def test_the_taint_effects_are_configurable() -> None:
    taints = DeviceTaints(
        "npu.huawei.com", "NoSchedule", (("SeparateNPU", "NoSchedule"), ("SubHealthFault", "NoSchedule"))
    )
    separate, sub_health = _graded(_with(0, "80E3A201"), _with(1, "81A3880C", column="Warning")).chips
    assert [taint["effect"] for taint in taints.for_chip(separate)] == ["NoSchedule"]
    assert taints.for_chip(sub_health) == [
        {"key": "npu.huawei.com/unhealthy", "value": "SubHealthFault", "effect": "NoSchedule"}
    ]
    gone = Chip.make(2, "910B3").with_health(Health.UNHEALTHY, "gone")
    assert taints.for_chip(gone)[0]["effect"] == "NoSchedule", "no class: --dra-taint-effect"
    # The flap hold keeps a chip out after it goes quiet; while its own fault is still there, its class rules.
    held = replace(separate, held=True)
    assert DeviceTaints("npu.huawei.com", "NoSchedule").for_chip(held)[0]["effect"] == "NoExecute"
    quiet = replace(Chip.make(3, "910B3"), held=True).with_health(Health.UNHEALTHY, "held")
    assert DeviceTaints("npu.huawei.com", "NoSchedule").for_chip(quiet)[0]["effect"] == "NoSchedule"


async def _wait(apiserver: ApiServer, read: Callable[[], Any], ready: Callable[[Any], bool]) -> Any:
    return await anyio.to_thread.run_sync(lambda: apiserver.wait_for(read, ready, timeout=5))


@asynccontextmanager
async def _running(apiserver: ApiServer, feature: Any) -> AsyncIterator[KubeApi]:
    apiserver.put("nodes", {"metadata": {"name": "node-1"}})
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(feature.run, api)
        yield api
        tasks.cancel_scope.cancel()
    await api.close()


def _reasons(apiserver: ApiServer) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for event in apiserver.list("events", "default"):
        found.setdefault(event["reason"], []).append(event)
    return found


async def test_the_event_reason_is_the_class(apiserver: ApiServer) -> None:
    events = NodeEvents(min_interval=0.1)
    async with _running(apiserver, events):
        events.observe(_graded(Chip.make(0, "910B3"), Chip.make(1, "910B3")))
        events.observe(_graded(_alarm_sample(0), _with(1, "81A3880C", column="Warning")))
        found = await _wait(
            apiserver, lambda: _reasons(apiserver), lambda f: {"NPURestartNPU", "NPUSubHealthFault"} <= set(f)
        )
        (restart,) = found["NPURestartNPU"]
        assert restart["type"] == "Warning"
        assert restart["message"].startswith(
            "Ascend910-0 is Unhealthy: RestartNPU: Alarm, error codes A4025021"
        )
        (sub_health,) = found["NPUSubHealthFault"]
        assert sub_health["message"].startswith("Ascend910-1 stays Healthy with fault class SubHealthFault")
        assert "NPUUnhealthy" not in found


def _put_map(apiserver: ApiServer, data: dict[str, str]) -> None:
    apiserver.put("configmaps", {"metadata": {"name": NAME, "namespace": NAMESPACE}, "data": data})


async def _write_map(api: KubeApi, data: dict[str, str], create: bool = False) -> None:
    """The map as an admin writes it, through the API server (what its watch sees)."""
    configmap = ConfigMap(metadata=ObjectMeta(name=NAME, namespace=NAMESPACE), data=data)
    await (api.client.create(configmap) if create else api.client.replace(configmap))


async def test_the_fault_config_map_is_followed_and_a_bad_one_refused(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    grading = FaultGrading.builtin()
    chip = _with(0, "8C03A000")
    follow = FaultConfigFollow(grading)
    with caplog.at_level(logging.INFO, logger="ascend_agent.cluster"):
        async with _running(apiserver, follow) as api:
            await _write_map(api, {"faultCode.json": json.dumps({"SubHealthFaultCodes": ["8C03A000"]})}, True)
            await _wait(apiserver, lambda: grading.apply(Inventory((chip,))).chips[0].fault_class,
                        lambda found: found is FaultClass.SUB_HEALTH)  # fmt: skip
            running = grading.table
            await _write_map(api, {"faultCode.json": json.dumps({"SubHealthFaultCodes": ["8C03A0XY"]})})
            await _wait(apiserver, lambda: caplog.text, lambda text: "not applied" in text)
            assert grading.table is running, "the running table is kept"
            (line,) = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
            assert line == (
                f"ConfigMap {NAMESPACE}/{NAME} not applied, keeping the running fault table (ConfigMap "
                f"{NAMESPACE}/{NAME}): faultCode.json: SubHealthFaultCodes: '8C03A0XY' is not a hex "
                "fault code"
            )
            await _write_map(api, {"faultCode.json": "{}", "PollTime": "30"})
            await _wait(apiserver, lambda: caplog.text, lambda text: "unknown key 'PollTime'" in text)
            await api.client.delete(ConfigMap, NAME, namespace=NAMESPACE)
            await _wait(apiserver, lambda: grading.table.source, lambda source: source == "built in")
    assert grading.apply(Inventory((chip,))).chips[0].fault_class is FaultClass.RESTART_NPU


async def test_a_map_nested_too_deep_is_refused_with_its_reason(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """faultCode.json nested 100,000 deep: Python's JSON reader raises RecursionError, which ended the
    feature with a traceback and no reason, again at each restart; it is refused like any bad map."""
    grading = FaultGrading.builtin()
    running = grading.table
    deep = "[" * 100_000 + "]" * 100_000
    with caplog.at_level(logging.INFO, logger="ascend_agent.cluster"):
        async with _running(apiserver, FaultConfigFollow(grading)) as api:
            await _write_map(api, {"faultCode.json": deep, "faultCustomization.json": deep}, True)
            await _wait(apiserver, lambda: caplog.text, lambda text: "not applied" in text)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.endswith(
        "not applied, keeping the running fault table (built in): faultCode.json: its arrays or objects nest "
        "too deep to read (Huawei's file nests three levels)"
    ), line
    assert grading.table is running


async def test_a_map_there_at_start_is_read(apiserver: ApiServer) -> None:
    custom = {"FaultDuration": [{"EventId": ["8C03A000"], "FaultTimeout": 0, "FaultHandling": "SeparateNPU"}]}
    _put_map(apiserver, {"faultCustomization.json": json.dumps(custom)})
    grading = FaultGrading.builtin()
    async with _running(apiserver, FaultConfigFollow(grading, FaultTable.builtin())):
        await _wait(apiserver, lambda: dict(grading.table.duration), lambda rules: 0x8C03A000 in rules)
    assert grading.table.classes == FaultTable.builtin().classes, "faultCode.json stays the built-in one"
