"""The device-info ConfigMap and ``baseDeviceInfos`` Volcano reads: Go's JSON and CheckCode against Huawei's
real sample, and the publisher against the Kubernetes API emulator: the exact Go types, the label, the four
lists for healthy, faulty, held and separated chips, the 5-minute rewrite, the admin's list kept."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import anyio
from hypothesis import given
from hypothesis import strategies as st
from lightkube.resources.core_v1 import ConfigMap

from ascend_agent.cluster import deviceinfo
from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.cluster.deviceinfo_publisher import DeviceInfoPublisher
from ascend_agent.faultclass import FaultClass
from ascend_agent.health.pipeline import follow_chips
from ascend_agent.health.separation import ManualSeparation
from ascend_agent.model import Chip, Fault, Health, Inventory, VNpu
from tests.support import ROOT, volcano_types
from tests.support.apiserver import ApiServer
from tests.support.clock import ManualClock

SAMPLE = ROOT / "tests/fixtures/volcano/deviceinfo-a3-sample.json"
NODE = "node-1"
NAME = f"mindx-dl-deviceinfo-{NODE}"
T = "huawei.com/Ascend910"


def test_check_code_of_the_real_sample() -> None:
    sample = json.loads(SAMPLE.read_text())
    assert deviceinfo.check_code(sample["DeviceInfo"]) == sample["CheckCode"]
    rebuilt = deviceinfo.device_info_cfg(
        sample["DeviceInfo"]["DeviceList"], sample["DeviceInfo"]["UpdateTime"]
    )
    assert rebuilt == SAMPLE.read_text().strip(), "Go's encoding, byte for byte"


@given(st.dictionaries(st.text(), st.text()))
def test_go_json_decodes_back_with_html_characters_escaped(value: dict[str, str]) -> None:
    text = deviceinfo.go_json(dict(sorted(value.items())))
    assert json.loads(text) == value
    assert not {"<", ">", "&", "\u2028", "\u2029"} & set(text)


def _chips() -> tuple[Chip, ...]:
    healthy = [Chip.make(i, "910B3") for i in range(8)]
    faulty = healthy[1].with_health(Health.UNHEALTHY, "Critical, error code 80E18005")
    faulty = replace(faulty, faults=(Fault("80E18005", "heartbeat lost"), Fault("80cb8009")))
    held = replace(healthy[2], held=True).with_health(Health.UNHEALTHY, "held Unhealthy")
    return (healthy[0], faulty, held, *healthy[3:])


def test_the_lists_for_healthy_faulty_held_and_separated_chips() -> None:
    separation = ManualSeparation()
    separation.update(frozenset({"Ascend910-5"}))
    inventory = separation.apply(Inventory(_chips()))
    lists = deviceinfo.device_lists(inventory, {"Ascend910-1": 1000}, 2000, separation.ids)
    assert {key: value for key, value in lists.items() if not key.endswith("-Fault")} == {
        T: "Ascend910-0,Ascend910-3,Ascend910-4,Ascend910-6,Ascend910-7",
        f"{T}-Unhealthy": "Ascend910-1,Ascend910-5",
        f"{T}-NetworkUnhealthy": "",
        f"{T}-Recovering": "Ascend910-2",
    }
    faults = volcano_types.fault_list(lists[f"{T}-Fault"])
    assert [(f["npu_name"], f["fault_code"], f["fault_handling"]) for f in faults] == [
        ("Ascend910-1", "80CB8009,80E18005", "SeparateNPU"),
        ("Ascend910-5", "", "SeparateNPU"),
    ]
    assert faults[0]["fault_time_and_level_map"]["80E18005"] == {
        "fault_time": 1000,
        "fault_level": "SeparateNPU",
    }
    assert list(lists) == sorted(lists)


def test_network_unhealthy_chips_are_listed_and_stay_available_to_single_chip_jobs() -> None:
    link_down = "RoCE link DOWN for 20 s or more (hccn_tool -link -g)"
    chips = list(_chips())
    chips[4] = replace(chips[4], network_fault=link_down)
    chips[1] = replace(chips[1], network_fault=link_down)  # Unhealthy and its link down: in both lists
    lists = deviceinfo.device_lists(Inventory(tuple(chips)), {}, 2000)
    assert lists[f"{T}-NetworkUnhealthy"] == "Ascend910-1,Ascend910-4"
    assert "Ascend910-4" in lists[T].split(",")
    assert lists[f"{T}-Unhealthy"] == "Ascend910-1"
    # A vNPU of such a chip is never listed: it has no NIC of its own.
    part = chips[4].slice(VNpu(100, "vir05_1c_16g"))
    lists = deviceinfo.device_lists(Inventory(tuple(chips), vnpus=(part,)), {}, 2000)
    assert lists[f"{part.resource}-NetworkUnhealthy"] == ""


def test_310p_has_no_fault_list() -> None:
    lists = deviceinfo.device_lists(Inventory((Chip.make(0, "310P3"),)), {}, 0)
    assert sorted(lists) == [
        "huawei.com/Ascend310P",
        "huawei.com/Ascend310P-NetworkUnhealthy",
        "huawei.com/Ascend310P-Recovering",
        "huawei.com/Ascend310P-Unhealthy",
    ]


# against the API emulator --------------------------------------------------------------------------------
async def _wait(apiserver: ApiServer, read: Callable[[], Any], ready: Callable[[Any], bool]) -> Any:
    return await anyio.to_thread.run_sync(lambda: apiserver.wait_for(read, ready, timeout=5))


def _configmap(apiserver: ApiServer) -> dict[str, Any] | None:
    return apiserver.get("configmaps", NAME, "kube-system")


@asynccontextmanager
async def _publishing(
    apiserver: ApiServer, separation: ManualSeparation, clock: ManualClock, refresh: float = 300.0
) -> AsyncIterator[tuple[DeviceInfoPublisher, KubeApi]]:
    apiserver.put("nodes", {"metadata": {"name": NODE, "annotations": {"other": "kept"}}})
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), NODE)
    publisher = DeviceInfoPublisher(
        separation, watch_seconds=300, refresh_interval=refresh, min_write_interval=0.05, clock=clock
    )
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(publisher.run, api)
        yield publisher, api
        tasks.cancel_scope.cancel()
    await api.close()


async def test_configmap_decodes_into_the_go_types_with_the_label_and_check_code(
    apiserver: ApiServer,
) -> None:
    separation, clock = ManualSeparation(), ManualClock(1_700_000_000.0)
    async with _publishing(apiserver, separation, clock) as (publisher, _):
        publisher.observe(Inventory(_chips()))
        found = await _wait(apiserver, lambda: _configmap(apiserver), lambda cm: cm is not None)
        assert found["metadata"]["labels"] == {"mx-consumer-cim": "true"}
        assert found["data"]["ManuallySeparateNPU"] == ""
        cache = volcano_types.node_device_info_cache(found["data"]["DeviceInfoCfg"])
        assert cache["CheckCode"] == deviceinfo.check_code(cache["DeviceInfo"])
        assert (cache["SuperPodID"], cache["ServerIndex"]) == (-2, -2)
        assert cache["DeviceInfo"]["UpdateTime"] == int(clock.now)
        lists = cache["DeviceInfo"]["DeviceList"]
        assert lists[f"{T}-Unhealthy"] == "Ascend910-1"
        assert lists[f"{T}-Recovering"] == "Ascend910-2"
        assert lists[T] == "Ascend910-0,Ascend910-3,Ascend910-4,Ascend910-5,Ascend910-6,Ascend910-7"

        node = await _wait(
            apiserver,
            lambda: apiserver.get("nodes", NODE),
            lambda n: "baseDeviceInfos" in n["metadata"].get("annotations", {}),
        )
        annotations = node["metadata"]["annotations"]
        infos = volcano_types.base_device_infos(annotations["baseDeviceInfos"])
        assert sorted(infos) == sorted(f"Ascend910-{i}" for i in range(8))
        assert annotations["other"] == "kept"


async def test_admin_separation_is_read_back_kept_and_listed(apiserver: ApiServer) -> None:
    woken = anyio.Event()
    separation, clock = ManualSeparation(woken.set), ManualClock(1_700_000_000.0)
    async with _publishing(apiserver, separation, clock) as (publisher, _):
        publisher.observe(Inventory(_chips()))
        found = await _wait(apiserver, lambda: _configmap(apiserver), lambda cm: cm is not None)
        found["data"]["ManuallySeparateNPU"] = "Ascend910-4"
        apiserver.put("configmaps", found)
        with anyio.fail_after(5):
            await woken.wait()
        assert separation.ids == {"Ascend910-4"}
        # The agent reconciles with the separation applied, and observes again.
        separated = separation.apply(Inventory(_chips()))
        assert [c.reason for c in separated.chips if c.device_id == "Ascend910-4"] == [
            "separated by the ConfigMap"
        ]
        publisher.observe(separated)
        found = await _wait(
            apiserver,
            lambda: _configmap(apiserver),
            lambda cm: (
                "Ascend910-4"
                in json.loads(cm["data"]["DeviceInfoCfg"])["DeviceInfo"]["DeviceList"][f"{T}-Unhealthy"]
            ),
        )
        assert found["data"]["ManuallySeparateNPU"] == "Ascend910-4", "the admin's entry is never cleared"
        assert found["metadata"]["labels"] == {"mx-consumer-cim": "true"}
    reads = ("get", "list", "watch")
    verbs = [s.verb for s in apiserver.seen() if s.resource == "configmaps" and s.verb in reads]
    # The write's read and the watch round's read, the watch, then the second write's read: the edit came
    # by the watch, not by reading the map again and again.
    assert verbs.count("watch") == 1 and verbs.count("get") + verbs.count("list") <= 3, verbs


async def test_rewritten_every_refresh_and_recreated_when_deleted(apiserver: ApiServer) -> None:
    separation, clock = ManualSeparation(), ManualClock(1_700_000_000.0)
    async with _publishing(apiserver, separation, clock, refresh=0.3) as (publisher, api):
        publisher.observe(Inventory(_chips()))
        found = await _wait(apiserver, lambda: _configmap(apiserver), lambda cm: cm is not None)
        first = json.loads(found["data"]["DeviceInfoCfg"])["DeviceInfo"]["UpdateTime"]
        clock.now += 299
        found = await _wait(
            apiserver,
            lambda: _configmap(apiserver),
            lambda cm: json.loads(cm["data"]["DeviceInfoCfg"])["DeviceInfo"]["UpdateTime"] > first,
        )
        cache = volcano_types.node_device_info_cache(found["data"]["DeviceInfoCfg"])
        assert cache["DeviceInfo"]["UpdateTime"] - first == 299
        assert cache["CheckCode"] == deviceinfo.check_code(cache["DeviceInfo"])
        # Each refresh is an update of the map as the agent last saw it: no read before it.
        reads = [s.verb for s in apiserver.seen() if s.resource == "configmaps" and s.verb in ("get", "list")]
        clock.now += 299
        await _wait(
            apiserver,
            lambda: _configmap(apiserver),
            lambda cm: json.loads(cm["data"]["DeviceInfoCfg"])["DeviceInfo"]["UpdateTime"] > first + 299,
        )
        assert [
            s.verb for s in apiserver.seen() if s.resource == "configmaps" and s.verb in ("get", "list")
        ] == reads

        await api.client.delete(ConfigMap, NAME, namespace="kube-system")
        await _wait(apiserver, lambda: _configmap(apiserver), lambda cm: cm is None)
        found = await _wait(apiserver, lambda: _configmap(apiserver), lambda cm: cm is not None)
        assert found["metadata"]["labels"] == {"mx-consumer-cim": "true"}


async def test_an_unchanged_inventory_is_not_written_again(apiserver: ApiServer) -> None:
    separation, clock = ManualSeparation(), ManualClock(1_700_000_000.0)
    async with _publishing(apiserver, separation, clock) as (publisher, _):
        for _ in range(3):
            publisher.observe(Inventory(_chips()))
        await _wait(apiserver, lambda: _configmap(apiserver), lambda cm: cm is not None)
        changed = list(_chips())
        changed[0] = changed[0].with_health(Health.UNHEALTHY, "x")
        publisher.observe(Inventory(tuple(changed)))
        await _wait(
            apiserver,
            lambda: _configmap(apiserver),
            lambda cm: (
                "Ascend910-0"
                in json.loads(cm["data"]["DeviceInfoCfg"])["DeviceInfo"]["DeviceList"][f"{T}-Unhealthy"]
            ),
        )
    writes = [
        s.verb for s in apiserver.seen() if s.resource == "configmaps" and s.verb in ("create", "update")
    ]
    assert writes == ["create", "update"], "created at the first write, updated at the change only"


async def test_a_split_chip_with_a_fault_class_keeps_its_fault_time(apiserver: ApiServer) -> None:
    """A vNPU carries its chip's codes and class: its ``fault_time`` is when it was first seen so, not now."""
    separation, clock = ManualSeparation(), ManualClock(1_700_000_000.0)
    whole = Chip.make(0, "910B3")
    chip = Chip.make(5, "910B3", fault_class=FaultClass.SUB_HEALTH)
    chip = replace(chip, faults=(Fault("80E18005", fault_class=FaultClass.SUB_HEALTH),))
    parts = follow_chips((chip,), (chip.slice(VNpu(100, "vir05_1c_16g")),))
    async with _publishing(apiserver, separation, clock) as (publisher, _):
        publisher.observe(Inventory(chips=(whole, chip), vnpus=parts))
        await _wait(apiserver, lambda: _configmap(apiserver), lambda cm: cm is not None)
        clock.now += 5
        publisher.observe(Inventory(chips=(whole, chip), vnpus=parts))
        publisher.observe(Inventory(chips=(whole.with_health(Health.UNHEALTHY, "x"), chip), vnpus=parts))
        found = await _wait(
            apiserver,
            lambda: _configmap(apiserver),
            lambda cm: (
                "Ascend910-0"
                in json.loads(cm["data"]["DeviceInfoCfg"])["DeviceInfo"]["DeviceList"][f"{T}-Unhealthy"]
            ),
        )
    lists = json.loads(found["data"]["DeviceInfoCfg"])["DeviceInfo"]["DeviceList"]
    times = {
        entry["npu_name"]: [code["fault_time"] for code in entry["fault_time_and_level_map"].values()]
        for key, value in lists.items()
        if key.endswith("-Fault")
        for entry in json.loads(value)
    }
    first_ms = int((clock.now - 5) * 1000)
    assert times[parts[0].device_id] == [first_ms], "the vNPU's fault time is when it was first seen so"
