"""Where the chips' device IPs and super-pod identity go: ``baseDeviceInfos``, ``DeviceInfoCfg``'s
``SuperPodID``/``ServerIndex`` (compared with Huawei's documented A3 example, and rewritten when they change),
the ``ascend-910-configuration`` annotation, the node labels, the DRA attributes, the doctor and the metric.
Chips take their IPs from the shared real outputs of an 8-chip 910B node and a 16-die A3 node."""

from __future__ import annotations

import json
from dataclasses import replace

from prometheus_client import REGISTRY

from ascend_agent.cluster import deviceinfo
from ascend_agent.cluster.labels import node_labels
from ascend_agent.cluster.volcano_marks import PodView, configuration
from ascend_agent.doctor.node import _device_ips
from ascend_agent.health.separation import ManualSeparation
from ascend_agent.kubelet.dra.devices import DeviceTaints, NodeChips, slice_device
from ascend_agent.model import Chip, Inventory, SuperPod, VNpu
from ascend_agent.observability.report import training_info as _training_info
from tests.support.apiserver import ApiServer
from tests.support.clock import ManualClock
from tests.support.training_fixtures import per_chip, read
from tests.support.volcano_types import base_device_infos, node_device_info_cache
from tests.unit.test_volcano_deviceinfo import NAME, _publishing, _wait

EIGHT_IPS = {
    chip: text.split("\n")[0].removeprefix("ipaddr:")
    for chip, text in per_chip("hccn_tool-ip-g_fixture-8dev.txt").items()
}
A3_IPS = {
    die: text.split("\n")[0].removeprefix("ipaddr:")
    for die, text in per_chip("hccn_tool-ip-g_A3-log-decoded.txt").items()
}
A3_SDIDS = {0: 167772160, 1: 167837697, 10: 169082890, 11: 169148427, 12: 169345036}


def _910b_node() -> Inventory:
    return Inventory(tuple(Chip.make(i, "910B3", npu_id=i, device_ip=EIGHT_IPS[i]) for i in range(8)))


def _a3_node() -> Inventory:
    """16 dies; the 5 the shared outputs cover have their IPs and super pod, the others none."""
    chips = []
    for die in range(16):
        chip = Chip.make(die, "910_9392", npu_id=die // 2, chip_on_card=die % 2)
        if die in A3_SDIDS:
            pod = SuperPod(sdid=A3_SDIDS[die], size=384, super_pod_id=0, server_index=40)
            chip = replace(chip, device_ip=A3_IPS[die], vnic_ip=f"192.168.2.{die}", super_pod=pod)
        chips.append(chip)
    return Inventory(tuple(chips))


def test_base_device_infos_carry_ips_and_sdids() -> None:
    infos = base_device_infos(deviceinfo.base_device_infos(_910b_node()))
    assert infos["Ascend910-3"] == {"IP": "10.10.0.13", "SuperDeviceID": 0}
    a3 = base_device_infos(deviceinfo.base_device_infos(_a3_node()))
    assert a3["Ascend910-11"] == {"IP": "10.0.244.16", "SuperDeviceID": 169148427}
    assert a3["Ascend910-2"] == {"IP": "", "SuperDeviceID": 0}, "no made-up address"


def test_device_info_cfg_super_pod_field_by_field_with_huaweis_a3_example() -> None:
    example = json.loads(read("deviceinfo-cm_DeviceInfoCfg_doc-example-A3.json"))
    inventory = _a3_node()
    lists = deviceinfo.device_lists(inventory, {}, 0)
    ours = json.loads(deviceinfo.device_info_cfg(lists, 1744182144, deviceinfo.node_super_pod(inventory)))
    assert list(ours) == list(example)
    assert {key: type(value) for key, value in ours.items()} == {k: type(v) for k, v in example.items()}
    assert (ours["SuperPodID"], ours["ServerIndex"]) == (0, 40)
    node_device_info_cache(json.dumps(ours))  # Huawei's types, strictly
    other = json.loads(deviceinfo.device_info_cfg(lists, 0, deviceinfo.node_super_pod(_910b_node())))
    assert (other["SuperPodID"], other["ServerIndex"]) == (-2, -2), "the example's own values elsewhere"


async def test_the_configmap_is_written_again_when_the_super_pod_changes(apiserver: ApiServer) -> None:
    separation = ManualSeparation()
    async with _publishing(apiserver, separation, ManualClock(1_700_000_000.0)) as (publisher, _):
        inventory = _a3_node()
        publisher.observe(inventory)

        def super_pod(configmap: dict[str, object] | None) -> tuple[int, int] | None:
            if not configmap:
                return None
            cache = node_device_info_cache(configmap["data"]["DeviceInfoCfg"])  # type: ignore[index]
            return cache["SuperPodID"], cache["ServerIndex"]

        read_map = lambda: apiserver.get("configmaps", NAME, "kube-system")  # noqa: E731
        await _wait(apiserver, read_map, lambda cm: super_pod(cm) == (0, 40))
        moved = SuperPod(sdid=1, size=384, super_pod_id=3, server_index=7)
        publisher.observe(Inventory(tuple(replace(c, super_pod=moved) for c in inventory.chips)))
        await _wait(apiserver, read_map, lambda cm: super_pod(cm) == (3, 7))


def test_configuration_annotation_of_a3_and_910b_pods() -> None:
    pod = PodView("ns", "worker-0", "uid-1", {}, {})
    a3 = _a3_node().chips
    assert json.loads(configuration(pod, [a3[0], a3[1]], "192.168.0.40")) == {
        "pod_name": "worker-0",
        "server_id": "uid-1",
        "host_ip": "192.168.0.40",
        "super_pod_id": 0,
        "devices": [
            {"device_id": "0", "device_ip": "10.0.245.11", "super_device_id": "167772160"},
            {"device_id": "1", "device_ip": "10.0.244.11", "super_device_id": "167837697"},
        ],
        "server_index": "40",
        "server_ip": "192.168.0.40",
    }
    b = _910b_node().chips
    assert json.loads(configuration(pod, [b[3]])) == {
        "pod_name": "worker-0",
        "server_id": "uid-1",
        "host_ip": "",
        "super_pod_id": -2,
        "devices": [{"device_id": "3", "device_ip": "10.10.0.13"}],
        "server_index": "-2",
        "server_ip": "",
    }
    part = b[3].slice(VNpu(148, "vir05_1c_16g"))
    assert json.loads(configuration(pod, [part]))["devices"] == [{"device_id": "3", "device_ip": "127.0.0.1"}]


def test_node_labels_name_the_super_pod_on_a3_only() -> None:
    labels = node_labels(_a3_node(), replicas=1)
    assert labels["huawei.com/npu.super-pod-id"] == "0"
    assert labels["huawei.com/npu.server-index"] == "40"
    assert not {key for key in node_labels(_910b_node(), replicas=1) if "super-pod" in key or "server" in key}
    none = SuperPod(sdid=1, size=384, super_pod_id=-1, server_index=40)
    labels = node_labels(Inventory((replace(_a3_node().chips[0], super_pod=none),)), replicas=1)
    assert "huawei.com/npu.super-pod-id" not in labels
    assert labels["huawei.com/npu.server-index"] == "40"


def test_dra_attributes_a_claim_can_match() -> None:
    inventory = _a3_node()
    node = NodeChips.of(inventory.chips, None)
    attributes = slice_device(inventory.chips[11], node, DeviceTaints("npu.huawei.com", "NoSchedule"))[
        "attributes"
    ]
    assert {key: attributes[key] for key in ("deviceIP", "vnicIP", "superPodId", "serverIndex", "sdid")} == {
        "deviceIP": {"string": "10.0.244.16"},
        "vnicIP": {"string": "192.168.2.11"},
        "superPodId": {"int": 0},
        "serverIndex": {"int": 40},
        "sdid": {"int": 169148427},
    }
    bare = slice_device(inventory.chips[2], node, DeviceTaints("npu.huawei.com", "NoSchedule"))["attributes"]
    assert not {"deviceIP", "vnicIP", "superPodId", "serverIndex", "sdid"} & set(bare)
    part = slice_device(
        inventory.chips[0].slice(VNpu(100, "vir16")), node, DeviceTaints("npu.huawei.com", "x")
    )
    assert part["attributes"]["deviceIP"] == {"string": "127.0.0.1"}
    assert "superPodId" not in part["attributes"]


def test_a_dra_address_attribute_is_an_address_without_its_zone() -> None:
    """Whatever a backend hands over, ``deviceIP`` and ``vnicIP`` are plain addresses: the API server refuses
    a string attribute over 64 bytes, and with it the node's whole slice; a zone (``%eth0``) names an
    interface of this host only."""
    zoned = Chip.make(0, "910B3", device_ip=f"2001:db8::5%{'x' * 80}", vnic_ip="fd00::7%eth0")
    garbage = Chip.make(1, "910B3", device_ip="not an address")
    node = NodeChips.of((zoned, garbage), None)
    taints = DeviceTaints("npu.huawei.com", "NoSchedule")
    attributes = slice_device(zoned, node, taints)["attributes"]
    assert (attributes["deviceIP"], attributes["vnicIP"]) == (
        {"string": "2001:db8::5"},
        {"string": "fd00::7"},
    )
    assert "deviceIP" not in slice_device(garbage, node, taints)["attributes"]


def test_doctor_names_the_chips_without_an_ip() -> None:
    [check] = _device_ips(_a3_node())
    assert check.ok is False
    assert check.detail.startswith("11 of 16 chips have no device IP: Ascend910-2, Ascend910-3")
    [fine] = _device_ips(_910b_node())
    assert fine.ok is True and "Ascend910-7 10.10.0.17" in fine.detail
    assert _device_ips(Inventory((Chip.make(0, "310P3"),))) == []
    [none] = _device_ips(Inventory((Chip.make(0, "910B3"), Chip.make(1, "910B3"))))
    assert none.ok is None and none.detail.startswith("no chip has a device IP (Ascend910-0, Ascend910-1)")


def test_the_metric_per_chip() -> None:
    _training_info(_a3_node().chips)
    labels = {
        "device": "Ascend910-12",
        "device_ip": "10.0.245.17",
        "vnic_ip": "192.168.2.12",
        "super_pod_id": "0",
        "server_index": "40",
        "sdid": "169345036",
    }
    assert REGISTRY.get_sample_value("ascend_agent_chip_training_info", labels) == 1
