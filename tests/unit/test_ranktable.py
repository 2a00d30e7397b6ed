"""Rank-table readiness: the ``ascend-910-configuration`` the agent writes, read as ascend-operator reads it,
gives the ``hccl.json`` part each pod contributes; gathered for a 2-node, 16-chip job it is a valid v1.0 and
v1.2 table, compared field by field with Huawei's documented examples, as is the device-info ConfigMap of both
nodes. Chips take their IPs and SDIDs from the shared real outputs of an 8-chip 910B node and a 16-die A3
node."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_agent.cli.held import chips_held
from ascend_agent.cluster import deviceinfo
from ascend_agent.cluster.ranktable import (
    CONFIGURATION,
    CONFIGURATION_NPU,
    RANK_INDEX,
    SP_BLOCK,
    PlacedPod,
    RankTableError,
    fragment,
    gaps,
    render,
    version_of,
)
from ascend_agent.cluster.volcano_marks import PodView, configuration
from ascend_agent.model import Chip, Fault, Health, Holder, Holders, Inventory, SuperPod, VNpu
from tests.support.hccl import doc_example, gather, hccl_json
from tests.support.training_fixtures import read
from tests.support.volcano_types import DecodeError
from tests.unit.test_training_outputs import A3_IPS, A3_SDIDS, _910b_node, _a3_node

A3_SELECTOR = {"accelerator-type": "module-a3-16-super-pod"}


def _second_910b_node() -> tuple[Chip, ...]:
    """A second 8-chip node: the first one's chips on another subnet (constructed, not captured)."""
    return tuple(
        replace(chip, device_ip=chip.device_ip.replace("10.10.", "10.20.") if chip.device_ip else None)
        for chip in _910b_node().chips
    )


def _full_a3_node(server_index: int) -> tuple[Chip, ...]:
    """16 dies, each with a device IP and an SDID: on server 40 the 5 dies the shared outputs cover keep
    theirs; every other value is constructed (SDIDs are opaque numbers)."""
    chips = []
    for die in range(16):
        ip, sdid = f"10.{server_index}.{die}.11", (server_index << 22) + (die << 16) + die
        if server_index == 40 and die in A3_SDIDS:
            ip, sdid = A3_IPS[die], A3_SDIDS[die]
        pod = SuperPod(sdid=sdid, size=384, super_pod_id=0, server_index=server_index)
        chips.append(replace(Chip.make(die, "910_9392", npu_id=die // 2), device_ip=ip, super_pod=pod))
    return tuple(chips)


def _placed(
    name: str,
    chips: tuple[Chip, ...],
    rank_index: int,
    host_ip: str,
    selector: dict[str, str] | None = None,
    **annotations: str,
) -> PlacedPod:
    """A pod as it is once placed: the agent's configuration annotation for ``chips``, Volcano's rank index,
    a pod IP."""
    view = PodView("team-a", name, f"uid-{name}", {}, {})
    written = {CONFIGURATION: configuration(view, chips, host_ip), RANK_INDEX: str(rank_index)}
    return PlacedPod(
        "team-a", name, "node-1", f"10.244.{rank_index}.7", {**written, **annotations}, selector or {}
    )


def _structure(value: Any) -> Any:
    """Keys in order and the type of every value, down the tree (lists by their first item)."""
    if isinstance(value, dict):
        return [(key, _structure(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_structure(value[0])] if value else []
    return type(value).__name__


def test_910b_pod_field_by_field_with_huaweis_v1_0_example() -> None:
    pod = _placed("worker-0", _910b_node().chips, 0, "192.168.0.11")
    part = fragment(pod)
    table = gather([part])
    hccl_json(table, "1.0")
    example = doc_example("1.0")
    del example["server_list"][0]["hardware_type"]  # written for MindIE EP jobs only
    assert _structure(table) == _structure(example)
    server = table["server_list"][0]
    assert (server["server_id"], server["host_ip"], server["container_ip"]) == (
        "uid-worker-0",
        "192.168.0.11",
        "10.244.0.7",
    )
    assert server["device"][3] == {"device_id": "3", "device_ip": "10.10.0.13", "rank_id": "3"}


def test_a3_pod_field_by_field_with_huaweis_v1_2_example() -> None:
    pod = _placed("worker-0", _full_a3_node(40), 0, "192.168.0.40", A3_SELECTOR)
    assert version_of(pod) == "1.2"
    table = gather([fragment(pod)])
    hccl_json(table, "1.2")
    example = doc_example("1.2")
    del example["server_list"][0]["hardware_type"]
    assert _structure(table) == _structure(example)
    devices = table["server_list"][0]["device"]
    assert len(devices) == 16
    assert devices[11] == {
        "device_id": "11",
        "device_ip": "10.0.244.16",
        "super_device_id": "169148427",
        "rank_id": "11",
    }
    assert table["super_pod_list"] == [{"super_pod_id": "0", "server_list": [{"server_id": "uid-worker-0"}]}]


def test_two_node_sixteen_chip_job_is_a_valid_v1_0_table() -> None:
    pods = [
        _placed("worker-1", _second_910b_node(), 1, "192.168.0.12"),
        _placed("worker-0", _910b_node().chips, 0, "192.168.0.11"),
    ]
    table = hccl_json(gather(fragment(pod) for pod in pods), "1.0")
    assert table["server_count"] == "2"
    assert [server["server_id"] for server in table["server_list"]] == ["uid-worker-0", "uid-worker-1"]
    second = table["server_list"][1]["device"]
    assert [device["rank_id"] for device in second] == [str(rank) for rank in range(8, 16)]
    assert second[0] == {"device_id": "0", "device_ip": "10.20.0.10", "rank_id": "8"}
    assert "super_device_id" not in json.dumps(table), "v1.0 carries no super-device ids"


def test_two_node_sixteen_chip_job_is_a_valid_v1_2_table() -> None:
    """8 dies on each of two A3 servers, one logical super pod of 16 (sp-block 16), then two of 8."""
    pods = [
        _placed("worker-0", _full_a3_node(40)[:8], 0, "192.168.0.40", A3_SELECTOR),
        _placed("worker-1", _full_a3_node(41)[8:], 1, "192.168.0.41", A3_SELECTOR),
    ]
    table = hccl_json(gather(fragment(pod, sp_block=16) for pod in pods), "1.2")
    assert table["super_pod_list"] == [
        {"super_pod_id": "0", "server_list": [{"server_id": "uid-worker-0"}, {"server_id": "uid-worker-1"}]}
    ]
    last = table["server_list"][1]["device"][-1]
    assert last == {
        "device_id": "15",
        "device_ip": "10.41.15.11",
        "super_device_id": str((41 << 22) + (15 << 16) + 15),
        "rank_id": "15",
    }
    split = hccl_json(gather(fragment(pod, sp_block=8) for pod in pods), "1.2")
    assert [sp["super_pod_id"] for sp in split["super_pod_list"]] == ["0", "1"]


def test_the_pods_own_sp_block_and_super_pod_rank() -> None:
    chips = _full_a3_node(40)[:8]
    blocked = _placed("w-3", chips, 3, "192.168.0.40", A3_SELECTOR, **{"sp-block": "16"})
    assert fragment(blocked)["super_pod_list"][0]["super_pod_id"] == "1"
    soft = _placed("w-3", chips, 3, "192.168.0.40", A3_SELECTOR, **{"super-pod-rank": "7"})
    assert fragment(soft)["super_pod_list"][0]["super_pod_id"] == "7"


def test_one_pod_one_node_names_the_server_by_its_host_ip() -> None:
    pod = _placed("w-0", _910b_node().chips[:2], 0, "192.168.0.11", onePodOneNode="true")
    assert fragment(pod)["server_list"][0]["server_id"] == "192.168.0.11"


def test_the_version_follows_the_job_as_the_pod_shows_it() -> None:
    chips = _910b_node().chips[:1]
    assert version_of(_placed("p", chips, 0, "h")) == "1.0"
    policy = {"huawei.com/schedule_policy": "chip2-node16-sp"}
    assert version_of(_placed("p", chips, 0, "h", **policy)) == "1.2"
    other = {"huawei.com/schedule_policy": "chip4-node8"}
    assert version_of(_placed("p", chips, 0, "h", A3_SELECTOR, **other)) == "1.0", "the policy decides"
    assert fragment(_placed("p", chips, 0, "h"), "1.2")["version"] == "1.2", "--version overrides"


def test_rendered_as_go_writes_it() -> None:
    part = fragment(_placed("w-0", _910b_node().chips[:1], 0, "192.168.0.11"))
    assert render(part) == (
        '{"server_list":[{"device":[{"device_id":"0","device_ip":"10.10.0.10","rank_id":"0"}],'
        '"server_id":"uid-w-0","host_ip":"192.168.0.11","container_ip":"10.244.0.7"}],"version":"1.0"}'
    )


def test_a_chip_without_an_ip_is_named() -> None:
    chips = (replace(_910b_node().chips[0], device_ip=None), _910b_node().chips[1])
    part = fragment(_placed("w-0", chips, 0, "192.168.0.11"))
    assert part["server_list"][0]["device"][0]["device_ip"] == ""
    assert [gap.split(":")[0] for gap in gaps(part)] == ["device 0 has no device_ip"]
    with pytest.raises(DecodeError, match="not an IP address"):
        hccl_json(gather([part]), "1.0")


def _with(pod: PlacedPod, **changes: Any) -> PlacedPod:
    return replace(pod, **changes)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"annotations": {RANK_INDEX: "0"}}, "has no ascend.kubectl.kubernetes.io/ascend-910-configuration"),
        ({"annotations": {CONFIGURATION: '{"devices":[{}]}'}}, "has no hccl/rankIndex annotation"),
        ({"annotations": {CONFIGURATION: "{", RANK_INDEX: "0"}}, "is not JSON"),
        ({"annotations": {CONFIGURATION: "[]", RANK_INDEX: "0"}}, "is not a JSON object"),
        ({"annotations": {CONFIGURATION: '{"devices":[]}', RANK_INDEX: "0"}}, "lists no devices"),
        ({"annotations": {CONFIGURATION: '{"devices":[1]}', RANK_INDEX: "0"}}, "not an object"),
        ({"annotations": {CONFIGURATION: '{"host_ip":5,"devices":[{}]}', RANK_INDEX: "0"}}, "host_ip 5"),
        ({"annotations": {CONFIGURATION: '{"devices":[{}]}', RANK_INDEX: "-1"}}, "not a rank index"),
        ({"annotations": {CONFIGURATION: '{"devices":[{}]}', RANK_INDEX: " 1"}}, "not a rank index"),
        (
            {"annotations": {CONFIGURATION: '{"devices":[{}]}', RANK_INDEX: "9" * 5000}},
            r"is '9{64}\.\.\. \(5000 characters\)', not a rank index",
        ),
        (
            {"annotations": {CONFIGURATION: '{"devices":[{}]}', RANK_INDEX: "9223372036854775808"}},
            "not a rank index",
        ),
        (
            {"annotations": {CONFIGURATION: "[" * 100_000 + "]" * 100_000, RANK_INDEX: "0"}},
            "nests arrays or objects too deep to read",
        ),
        (
            {
                "annotations": {
                    CONFIGURATION: '{"host_ip":[' + "1," * 5000 + '1],"devices":[{}]}',
                    RANK_INDEX: "0",
                }
            },
            r"has host_ip \[1, 1, .*\.\.\. \(15003 characters\), not a string",
        ),
        ({"pod_ip": ""}, "has no IP yet"),
        ({"annotations": {CONFIGURATION_NPU: "{}", RANK_INDEX: "0"}}, "its rank table is v2.0"),
    ],
)
def test_what_the_operator_cannot_use_is_one_line(change: dict[str, Any], message: str) -> None:
    pod = _with(_placed("w-0", _910b_node().chips[:1], 0, "192.168.0.11"), **change)
    with pytest.raises(RankTableError, match=message) as caught:
        fragment(pod)
    assert "\n" not in str(caught.value) and "team-a/w-0" in str(caught.value)


@pytest.mark.parametrize("sp_block", ["9" * 5000, "9223372036854775808", "x"])
def test_an_sp_block_go_cannot_read_is_none(sp_block: str) -> None:
    """ascend-operator reads sp-block with Go's strconv.Atoi: what it cannot read (a 5000-digit number raised
    Python's own integer limit) is no sp-block, every pod in logical super pod 0."""
    pod = _placed("w-0", _910b_node().chips[:2], 3, "192.168.0.11")
    pod = _with(pod, annotations={**pod.annotations, SP_BLOCK: sp_block})
    assert fragment(pod, "1.2")["super_pod_list"][0]["super_pod_id"] == "0"


def test_device_ip_minus_one_is_refused_as_the_operator_does() -> None:
    written = json.loads(configuration(PodView("team-a", "w-0", "u", {}, {}), _910b_node().chips[:2]))
    written["devices"][1]["device_ip"] = "-1"  # what Huawei's plugin writes for an IP it cannot read
    pod = PlacedPod("team-a", "w-0", "n", "10.244.0.7", {CONFIGURATION: json.dumps(written), RANK_INDEX: "0"})
    with pytest.raises(RankTableError, match="device_ip -1 for device 1, which ascend-operator refuses"):
        fragment(pod)


def test_an_unknown_version_is_refused() -> None:
    with pytest.raises(RankTableError, match=r"'2\.0' is not one of 1\.0, 1\.2"):
        fragment(_placed("w-0", _910b_node().chips[:1], 0, "h"), "2.0")


@given(st.text(), st.text())
def test_any_annotation_text_is_a_fragment_or_one_line(configuration_text: str, rank_index: str) -> None:
    pod = PlacedPod("ns", "p", "n", "10.0.0.1", {CONFIGURATION: configuration_text, RANK_INDEX: rank_index})
    try:
        part = fragment(pod)
    except RankTableError as exc:
        assert "\n" not in str(exc)
        return
    assert part["server_list"][0]["container_ip"] == "10.0.0.1"


@given(
    st.dictionaries(
        st.sampled_from(["server_id", "host_ip", "devices", "pod_name", "x"]),
        st.one_of(
            st.text(),
            st.integers(),
            st.none(),
            st.lists(
                st.dictionaries(st.sampled_from(["device_id", "device_ip", "super_device_id"]), st.text())
            ),
        ),
    )
)
def test_any_configuration_object_is_a_fragment_or_one_line(value: dict[str, Any]) -> None:
    pod = PlacedPod("ns", "p", "n", "10.0.0.1", {CONFIGURATION: json.dumps(value), RANK_INDEX: "2"})
    try:
        part = fragment(pod, "1.2")
    except RankTableError:
        return
    devices = part["server_list"][0]["device"]
    assert [device["rank_id"] for device in devices] == [
        str(2 * len(devices) + i) for i in range(len(devices))
    ]


def test_the_configuration_carries_the_node_address() -> None:
    """What ascend-operator copies into host_ip, and Huawei's key order."""
    written = configuration(PodView("ns", "w-0", "uid-1", {}, {}), _a3_node().chips[:2], "192.168.0.40")
    assert list(json.loads(written)) == [
        "pod_name",
        "server_id",
        "host_ip",
        "super_pod_id",
        "devices",
        "server_index",
        "server_ip",
    ]
    assert json.loads(written)["host_ip"] == json.loads(written)["server_ip"] == "192.168.0.40"


def _with_a_fault(inventory: Inventory) -> Inventory:
    """Chip 4 Unhealthy with two codes, as in Huawei's example."""
    chips = list(inventory.chips)
    faults = (Fault("80E18402", "x"), Fault("A8028801", "y"))
    chips[4] = replace(chips[4].with_health(Health.UNHEALTHY, "Alarm"), faults=faults)
    return Inventory(tuple(chips))


@pytest.mark.parametrize("node", [_910b_node, _a3_node], ids=["910B x8", "A3 x16"])
def test_device_info_field_by_field_with_huaweis_documented_example(node: Callable[[], Inventory]) -> None:
    """``DeviceInfoCfg`` of each node: the example's fields in its order with its types, its ``DeviceList``
    keys, and its ``-Fault`` entries' fields; ``baseDeviceInfos``: every chip's ``IP`` and
    ``SuperDeviceID``."""
    example = json.loads(read("deviceinfo-cm_DeviceInfoCfg_doc-example-A3.json"))
    inventory = _with_a_fault(node())
    lists = deviceinfo.device_lists(inventory, {}, 1744167455784)
    ours = json.loads(deviceinfo.device_info_cfg(lists, 1744182144, deviceinfo.node_super_pod(inventory)))
    assert _structure(ours) == _structure(example)
    fault_key = "huawei.com/Ascend910-Fault"

    def entry(text: str) -> Any:
        """The structure of the first fault entry, its map (fault code -> time and level) by its values."""
        first = json.loads(text)[0]
        first["fault_time_and_level_map"] = list(first["fault_time_and_level_map"].values())
        return _structure(first)

    assert entry(ours["DeviceInfo"]["DeviceList"][fault_key]) == entry(
        example["DeviceInfo"]["DeviceList"][fault_key]
    )
    assert ours["DeviceInfo"]["DeviceList"]["huawei.com/Ascend910-Unhealthy"] == "Ascend910-4"
    infos = json.loads(deviceinfo.base_device_infos(inventory))
    assert list(infos) == sorted(chip.device_id for chip in inventory.chips)
    assert {tuple(value) for value in infos.values()} == {("IP", "SuperDeviceID")}
    assert infos["Ascend910-1"]["IP"] in ("10.10.0.11", "10.0.244.11")


def _as_volcano_writes_it(inventory: Inventory, uid: str, host_ip: str, chips: list[int]) -> str:
    """The configuration Volcano's ascend plugin writes at bind time for an ascend-operator pod, from the
    node's ``baseDeviceInfos`` (as Volcano's plugin reads it): per chip, by id, the
    annotation's ``IP`` and its ``SuperDeviceID`` as a string."""
    infos = json.loads(deviceinfo.base_device_infos(inventory))
    super_pod_id, server_index = deviceinfo.node_super_pod(inventory)
    devices = [
        {
            "device_id": str(chip),
            "device_ip": infos[f"Ascend910-{chip}"]["IP"],
            "super_device_id": str(infos[f"Ascend910-{chip}"]["SuperDeviceID"]),
        }
        for chip in sorted(chips)
    ]
    return json.dumps(
        {
            "pod_name": "w",
            "server_id": uid,
            "server_ip": host_ip,
            "host_ip": host_ip,
            "super_pod_id": super_pod_id,
            "devices": devices,
            "rack_id": 0,
            "server_index": str(server_index),
        }
    )


def test_what_volcano_writes_from_base_device_infos_makes_the_same_tables() -> None:
    """Volcano's own configuration (from ``baseDeviceInfos``) and the agent's give the operator the same
    server, v1.0 on the 910B node and v1.2 on the A3 one."""
    full_a3 = Inventory(_full_a3_node(40))
    for inventory, version, selector in ((_910b_node(), "1.0", {}), (full_a3, "1.2", A3_SELECTOR)):
        ours = _placed("w", inventory.chips, 0, "192.168.0.9", selector)
        written = _as_volcano_writes_it(inventory, "uid-w", "192.168.0.9", list(range(len(inventory.chips))))
        theirs = replace(ours, annotations={**ours.annotations, CONFIGURATION: written})
        assert fragment(theirs) == fragment(ours)
        assert fragment(theirs)["version"] == version


def test_an_a3_die_without_an_sdid_is_named_in_v1_2() -> None:
    """Where the agent knows no SDID it writes none; Volcano writes baseDeviceInfos' 0 for it. Either way the
    v1.2 table cannot place the die, and ranktable says so."""
    part = fragment(_placed("w", _a3_node().chips, 0, "192.168.0.9", A3_SELECTOR))
    assert "super_device_id" not in part["server_list"][0]["device"][2]
    lines = gaps(part)
    assert len(lines) == 2
    assert lines[1].startswith("device 2, 3, 4, 5, 6, 7, 8, 9, 13, 14, 15 has no super_device_id")


def test_the_chips_a_pod_holds_as_the_kubelet_says_them() -> None:
    """For a pod without the configuration annotation: a shared chip's replicas are its chip, a vNPU is
    itself, a claim's chip or vNPU by its DRA name, a template device carved at prepare a vNPU of its chip;
    other pods' devices, other domains' resources and other drivers' devices are not the pod's."""
    chips = tuple(Chip.make(n, "310P3", device_ip=f"10.0.0.{n}") for n in range(4))
    vnpu = chips[3].slice(VNpu(148, "vir02"))
    inventory = Inventory(chips, vnpus=(vnpu,))
    me, other = Holder("ns", "p", "main"), Holder("ns", "q", "main")
    holders = Holders(
        {
            ("huawei.com/Ascend310P", "Ascend310P-0-1"): (me,),
            ("huawei.com/Ascend310P", "Ascend310P-1-0"): (other,),
            ("example.com/npu", "Ascend310P-2-0"): (me,),
            (vnpu.resource, vnpu.device_id): (me,),
        },
        {
            ("npu.huawei.com", "npu-1"): (Holder("ns", "p", "main", "c"),),
            ("npu.huawei.com", "npu-2-vir04-0"): (Holder("ns", "p", "main", "c"),),
            ("gpu.example.com", "npu-0"): (Holder("ns", "p", "main", "g"),),
        },
    )
    held = chips_held(inventory, holders, "ns", "p", 2, "npu.huawei.com")
    assert [(chip.phys_id, chip.vnpu.template if chip.vnpu else None) for chip in held] == [
        (0, None),
        (3, "vir02"),
        (1, None),
        (2, "vir04"),
    ]
    assert [chip.rank_ip for chip in held] == ["10.0.0.0", "127.0.0.1", "10.0.0.1", "127.0.0.1"]
