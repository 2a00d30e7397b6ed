"""The DRA driver's parts without processes: devices and slices against the resource.k8s.io/v1 schema of
Kubernetes 1.36, the checkpoint of prepared claims, the gRPC method paths the kubelet calls, the settings."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import kubernetes_validate
import pytest

from ascend_agent.backends._container import container_base
from ascend_agent.backends.fake import FakeBackend
from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.cluster.side import ClusterSide
from ascend_agent.config import ConfigError, Settings, SettingsSource, fake_vnpus
from ascend_agent.container import container_spec
from ascend_agent.doctor.dra import kubelet_checks, slices_check
from ascend_agent.files import replace_file
from ascend_agent.kubelet.dra import DraDriver
from ascend_agent.kubelet.dra.claimread import Allocated, ClaimError, ClaimReader, ClaimRef
from ascend_agent.kubelet.dra.claims import (
    Prepared,
    PreparedClaim,
    PreparedDevice,
    claim_spec,
    read_checkpoint,
)
from ascend_agent.kubelet.dra.devices import MAX_DEVICES_WITH_TAINTS, DeviceTaints, pool_slices
from ascend_agent.kubelet.dra.handlers import grpc_handlers
from ascend_agent.kubelet.dra.service import DraService
from ascend_agent.kubelet.dra.slices import ResourceSlice, SlicePublisher, slice_name
from ascend_agent.model import Chip, ContainerSpec, DeviceNode, Health, Inventory, VNpu
from ascend_agent.vnpu_layout import parse_layout
from tests.support.apiserver import ApiServer

KUBERNETES = "1.36"
TAINTS = DeviceTaints("npu.huawei.com", "NoSchedule")


def _slice(spec: dict[str, Any], index: int = 0, count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"node-1-npu.huawei.com-{index}"},
        "spec": {
            "driver": "npu.huawei.com",
            "nodeName": "node-1",
            "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": count},
            **spec,
        },
    }


def test_a3_dies_share_a_module_and_910a_chips_name_their_ring() -> None:
    dies = tuple(Chip.make(i, "910_9392", npu_id=i // 2, hbm_mb=65536) for i in range(4))
    (spec,) = pool_slices(Inventory(dies, driver_version="25.0.rc1.1"), TAINTS)
    attributes = [d["attributes"] for d in spec["devices"]]
    assert [a["moduleId"]["int"] for a in attributes] == [0, 0, 1, 1]
    assert [(a["npuId"]["int"], a["chipId"]["int"]) for a in attributes] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(a["driverVersion"] == {"version": "25.0.1-rc.1"} for a in attributes)
    assert kubernetes_validate.validate(_slice(spec), KUBERNETES, strict=True) == KUBERNETES

    rings = tuple(Chip.make(i, "910ProB") for i in range(8))
    (spec,) = pool_slices(Inventory(rings), TAINTS)
    assert [d["attributes"]["hccsRing"]["int"] for d in spec["devices"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all("moduleId" not in d["attributes"] for d in spec["devices"])


async def test_every_device_of_the_fake_chips_carries_kubernetes_standard_pcie_root_and_numa_node() -> None:
    """Whole chips, a static vNPU and a dynamic chip's template devices: each its chip's root and node, so a
    claim can match an NPU with another driver's NIC on ``resource.kubernetes.io/pcieRoot``."""
    settings = Settings(
        backend="fake",
        fake_model="310P3",
        fake_chips=4,
        fake_vnpus=fake_vnpus({"0": ["vir02"]}),
        vnpu=parse_layout({"3": {"dynamic": True}}),
    )
    backend = FakeBackend(settings)
    await backend.start()
    spec = pool_slices(await backend.discover(), TAINTS)[-1]
    standard = {
        device["name"]: (
            device["attributes"]["resource.kubernetes.io/pcieRoot"],
            device["attributes"]["resource.kubernetes.io/numaNode"],
            device["attributes"]["numaNode"],
        )
        for device in spec["devices"]
    }
    on_node_0 = ({"string": "pci0000:00"}, {"int": 0}, {"int": 0})
    on_node_1 = ({"string": "pci0000:80"}, {"int": 1}, {"int": 1})
    assert {name: value for name, value in standard.items() if "-vir" not in name} == {
        "npu-0-vnpu-100": on_node_0,
        "npu-1": on_node_0,
        "npu-2": on_node_1,
        "npu-3": on_node_1,
    }
    templates = [value for name, value in standard.items() if name.startswith("npu-3-vir")]
    assert templates and all(value == on_node_1 for value in templates)
    assert kubernetes_validate.validate(_slice(spec), KUBERNETES, strict=True) == KUBERNETES


def test_unhealthy_and_held_chips_are_tainted_with_a_valid_value() -> None:
    chips = (
        Chip.make(0, "910B4"),
        Chip.make(1, "910B4", health=Health.UNHEALTHY, reason="npu-smi: Critical (80E3A203) on chip 1"),
        # as the flap hold reports a chip it keeps out of use: Unhealthy, held, the hold in the reason
        Chip.make(
            2,
            "910B4",
            held=True,
            health=Health.UNHEALTHY,
            reason="Healthy now; held Unhealthy: it turned Unhealthy 3 times within 600 s",
        ),
    )
    (spec,) = pool_slices(Inventory(chips), DeviceTaints("npu.huawei.com", "NoExecute"))
    taints = [d.get("taints") for d in spec["devices"]]
    assert taints == [
        None,
        [
            {
                "key": "npu.huawei.com/unhealthy",
                "value": "npu-smi--Critical--80E3A203--on-chip-1",
                "effect": "NoExecute",
            }
        ],
        [{"key": "npu.huawei.com/unhealthy", "value": "held", "effect": "NoExecute"}],
    ]
    assert kubernetes_validate.validate(_slice(spec), KUBERNETES, strict=True) == KUBERNETES


def test_a_network_unhealthy_chip_gets_the_network_taint_beside_its_health_one() -> None:
    link_down = "RoCE link DOWN for 20 s or more (hccn_tool -link -g)"
    chips = (
        Chip.make(0, "910B4", network_fault=link_down),
        Chip.make(1, "910B4", network_fault=link_down, health=Health.UNHEALTHY, reason="npu-smi: Critical"),
        Chip.make(2, "910B4"),
    )
    (spec,) = pool_slices(Inventory(chips), DeviceTaints("npu.huawei.com", "NoExecute"))
    network = {"key": "npu.huawei.com/network-unhealthy", "value": "link-down", "effect": "NoSchedule"}
    assert [d.get("taints") for d in spec["devices"]] == [
        [network],  # NoSchedule only: a running single-chip pod is not evicted
        [{"key": "npu.huawei.com/unhealthy", "value": "npu-smi--Critical", "effect": "NoExecute"}, network],
        None,
    ]
    assert kubernetes_validate.validate(_slice(spec), KUBERNETES, strict=True) == KUBERNETES
    # A vNPU has no NIC of its own: never the network taint.
    part = chips[0].slice(VNpu(100, "vir05_1c_16g", aicore=5))
    (spec,) = pool_slices(Inventory(chips[:1], vnpus=(part,)), TAINTS)
    assert "taints" not in spec["devices"][0]


def test_a_chip_split_into_vnpus_is_published_only_as_its_vnpus() -> None:
    chips = tuple(Chip.make(i, "310P3", numa_node=0, hbm_mb=24576) for i in range(2))
    sick = chips[1].with_health(Health.UNHEALTHY, "npu-smi shows vNPU status fault")
    vnpus = (
        chips[0].slice(VNpu(101, "vir02", aicore=2, memory_gb=6)),
        chips[0].slice(VNpu(100, "vir04_3c", aicore=4)),
        sick.slice(VNpu(110, "vir02", aicore=2, memory_gb=6)),
        chips[1].slice(VNpu(111, "vir02", aicore=2, memory_gb=6)),
    )
    (spec,) = pool_slices(Inventory(chips, vnpus=vnpus), TAINTS)
    devices = {d["name"]: d for d in spec["devices"]}
    assert list(devices) == ["npu-0-vnpu-100", "npu-0-vnpu-101", "npu-1-vnpu-110", "npu-1-vnpu-111"]
    attributes = devices["npu-0-vnpu-101"]["attributes"]
    assert {name: next(iter(value.values())) for name, value in attributes.items()} == {
        "deviceType": "Ascend310P-2c",
        "template": "vir02",
        "parent": "npu-0",
        "physicId": 0,
        "vnpuId": 101,
        "model": "310P3",
        "generation": "310P",
        "numaNode": 0,
        "resource.kubernetes.io/numaNode": 0,
    }
    assert devices["npu-0-vnpu-101"]["capacity"] == {"aiCores": {"value": "2"}, "memory": {"value": "6Gi"}}
    assert devices["npu-0-vnpu-100"]["attributes"]["deviceType"] == {"string": "Ascend310P-4c.3cpu"}
    assert devices["npu-0-vnpu-100"]["capacity"] == {"aiCores": {"value": "4"}}
    assert devices["npu-1-vnpu-110"]["taints"] == [
        {
            "key": "npu.huawei.com/unhealthy",
            "value": "npu-smi-shows-vNPU-status-fault",
            "effect": "NoSchedule",
        }
    ]
    assert "taints" not in devices["npu-1-vnpu-111"]
    assert kubernetes_validate.validate(_slice(spec), KUBERNETES, strict=True) == KUBERNETES

    (spec,) = pool_slices(Inventory(chips, vnpus=vnpus[2:]), TAINTS)
    assert [d["name"] for d in spec["devices"]] == ["npu-0", "npu-1-vnpu-110", "npu-1-vnpu-111"]


def test_a_vnpu_claim_gets_what_allocate_gives_for_the_vnpu() -> None:
    part = Chip.make(1, "310P3").slice(VNpu(116, "vir04", aicore=4))
    base = container_base("plain", ())
    spec = claim_spec("npu.huawei.com", "uid-1", {"npu-1-vnpu-116": part}, container_spec([part], base))
    (device,) = spec["devices"]
    assert device == {
        "name": "uid-1-npu-1-vnpu-116",
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/davinci116", "permissions": "rw", "hostPath": "/dev/vdavinci116"}]
        },
    }
    assert spec["containerEdits"]["env"] == ["ASCEND_RUNTIME_OPTIONS=VIRTUAL", "ASCEND_VISIBLE_DEVICES=116"]


def test_a_pool_with_taints_is_split_at_64_devices_per_slice() -> None:
    chips = [Chip.make(i, "310P3") for i in range(100)]
    chips[7] = chips[7].with_health(Health.UNHEALTHY, "gone")
    specs = pool_slices(Inventory(tuple(chips)), TAINTS)
    assert [len(s["devices"]) for s in specs] == [MAX_DEVICES_WITH_TAINTS, 100 - MAX_DEVICES_WITH_TAINTS]
    for index, spec in enumerate(specs):
        assert kubernetes_validate.validate(_slice(spec, index, len(specs)), KUBERNETES, strict=True)
    assert len(pool_slices(Inventory(tuple(c.with_health(Health.HEALTHY) for c in chips)), TAINTS)) == 1


def test_the_checkpoint_survives_a_new_process(short_dir: Path) -> None:
    checkpoint = short_dir / "plugin" / "checkpoint.json"
    cdi = short_dir / "cdi"
    claim = PreparedClaim(
        "uid-1",
        "default",
        "train",
        (PreparedDevice(("npus",), "node-1", "npu-0", ("k/claim=uid-1-npu-0",)),),
    )
    prepared, aside = Prepared.open(checkpoint, cdi, "k", "boot-1")
    assert aside is None
    assert prepared.add([(claim, {"cdiVersion": "0.6.0"})]) == {"uid-1": replace(claim, boot_id="boot-1")}
    spec = cdi / "k-claim-uid-1.json"
    assert json.loads(spec.read_text()) == {"cdiVersion": "0.6.0"}

    again, _ = Prepared.open(checkpoint, cdi, "k", "boot-1")
    assert again.get("uid-1") == replace(claim, boot_id="boot-1")
    assert again.remove(["uid-1", "never-prepared"]) == {"uid-1": None, "never-prepared": None}
    assert not spec.exists() and read_checkpoint(checkpoint) == []


def test_the_checkpoint_is_on_disk_before_it_replaces_the_old_one(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = short_dir / "checkpoint.json"
    checkpoint.write_text("old")
    flushed: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        kind = "directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        flushed.append((kind, checkpoint.read_text()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    replace_file(checkpoint, "new")
    # the new text is flushed while the old file is still in place, then the rename is flushed
    assert flushed == [("file", "old"), ("directory", "new")]


def test_the_method_paths_are_the_kubelets(short_dir: Path) -> None:
    service = DraService(
        "npu.huawei.com", "node-1", Prepared(short_dir / "c.json", short_dir, "npu.huawei.com"), None
    )
    paths = {path for handler in grpc_handlers(service) for path in handler.__mapping__()}  # type: ignore[attr-defined]
    assert paths == {
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
        "/v1.DRAResourceHealth/NodeWatchResources",
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kubelet_api": "csi"}, "--kubelet-api must be one of device-plugin, dra"),
        ({"dra_driver_name": "NPU_driver"}, "--dra-driver-name must be a lower-case DNS subdomain"),
        ({"dra_taint_effect": "PreferNoSchedule"}, "--dra-taint-effect must be one of NoSchedule, NoExecute"),
    ],
)
def test_bad_dra_settings_are_one_line(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SettingsSource(overrides=overrides).load()


def _claim_object(uid: str, results: list[dict[str, str]] | None) -> dict[str, Any]:
    status = {} if results is None else {"allocation": {"devices": {"results": results}}}
    return {"metadata": {"name": "train", "namespace": "default", "uid": uid}, "status": status}


def test_only_this_drivers_results_in_this_pool_are_prepared() -> None:
    reader = ClaimReader(lambda: None, "npu.huawei.com", "node-1")
    ref = ClaimRef("default", "train", "u1")
    mixed = [
        {"request": "a", "driver": "npu.huawei.com", "pool": "node-1", "device": "npu-0"},
        {"request": "a", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"},
        {"request": "b", "driver": "npu.huawei.com", "pool": "node-2", "device": "npu-1"},
    ]
    assert reader._results(ref, _claim_object("u1", mixed)) == (Allocated("a", "npu-0"),)
    with pytest.raises(ClaimError, match="is not allocated"):
        reader._results(ref, _claim_object("u1", None))
    with pytest.raises(ClaimError, match=r"no device of driver npu\.huawei\.com in pool node-1"):
        reader._results(ref, _claim_object("u1", mixed[1:]))


async def test_a_claim_before_the_client_has_loaded_is_an_error_for_that_claim(short_dir: Path) -> None:
    reader = ClaimReader(lambda: None, "npu.huawei.com", "node-1")
    service = DraService(
        "npu.huawei.com", "node-1", Prepared(short_dir / "c.json", short_dir, "npu.huawei.com"), reader
    )
    service.publish([Chip.make(0, "910B4")], lambda chips: ContainerSpec())
    answers = await service.prepare([ClaimRef("default", "train", "u1")])
    assert answers == {
        "u1": "cannot read ResourceClaim default/train: the Kubernetes client is still loading"
    }


async def test_a_slice_deleted_by_hand_is_published_again_at_the_refresh(apiserver: ApiServer) -> None:
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)
    publisher = SlicePublisher("npu.huawei.com", "NoSchedule", refresh=0.1)
    publisher.observe(Inventory((Chip.make(0, "910B4"), Chip.make(1, "910B4"))))

    async def slices() -> list[dict[str, Any]]:
        with anyio.fail_after(10):
            while not (found := apiserver.list("resourceslices")):
                await anyio.sleep(0.01)
        return found

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(publisher.run, api)
        (first,) = await slices()
        await api.client.delete(ResourceSlice, first["metadata"]["name"])
        (again,) = await slices()
        tasks.cancel_scope.cancel()
    assert again["spec"]["devices"] == first["spec"]["devices"]
    assert again["spec"]["pool"]["generation"] == first["spec"]["pool"]["generation"] + 1
    writes = [s for s in apiserver.seen() if s.verb in ("create", "patch") and s.resource == "resourceslices"]
    assert len(writes) == 2, "refreshes of an unchanged pool write nothing"
    await api.close()


async def test_a_slice_deleted_or_edited_by_someone_else_is_written_again_at_once(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubelet deletes every slice of its node when it starts; an operator may edit one. Either is put
    back from the watch, long before the 300 s refresh, and the publisher's own writes start no more."""
    caplog.set_level(logging.INFO, logger="ascend_agent.cluster")
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)
    publisher = SlicePublisher("npu.huawei.com", "NoSchedule")
    publisher.observe(Inventory((Chip.make(0, "910B4"), Chip.make(1, "910B4"))))
    other_node = {**_slice({"devices": []}), "metadata": {"name": "node-2-npu.huawei.com-0"}}
    other_node["spec"] = {**other_node["spec"], "nodeName": "node-2", "pool": {**other_node["spec"]["pool"]}}
    other_node["spec"]["pool"]["name"] = "node-2"

    def ours() -> list[dict[str, Any]]:
        return [s for s in apiserver.list("resourceslices") if s["spec"]["nodeName"] == "node-1"]

    async def until(ready: Any) -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(lambda: apiserver.wait_for(ours, ready, timeout=10.0))

    def watching() -> bool:
        return any(s.verb == "watch" and s.resource == "resourceslices" for s in apiserver.seen())

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(publisher.run, api)
        (first,) = await until(bool)
        await anyio.to_thread.run_sync(lambda: apiserver.wait_for(watching, bool))
        apiserver.put("resourceslices", other_node)  # another node's: not this publisher's to touch
        await api.client.delete(ResourceSlice, first["metadata"]["name"])  # as the kubelet does
        (again,) = await until(bool)
        assert again["spec"]["devices"] == first["spec"]["devices"]

        edited = {**again, "spec": {**again["spec"], "devices": again["spec"]["devices"][:1]}}
        apiserver.put("resourceslices", edited)
        (restored,) = await until(lambda found: found and len(found[0]["spec"]["devices"]) == 2)
        # One more edit: its event comes after those of every write before it, so once it is undone, a write
        # of the publisher's own taken for someone else's would have been said (and written again) already.
        apiserver.put("resourceslices", {**restored, "spec": {**restored["spec"], "devices": []}})
        (last,) = await until(lambda found: found and len(found[0]["spec"]["devices"]) == 2)
        tasks.cancel_scope.cancel()
    assert restored["spec"]["devices"] == first["spec"]["devices"] == last["spec"]["devices"]
    assert apiserver.get("resourceslices", "node-2-npu.huawei.com-0") == other_node
    undone = [r.getMessage() for r in caplog.records if "by someone else" in r.getMessage()]
    assert [line.split()[2] for line in undone] == ["deleted", "changed", "changed"], undone
    writes = [
        s.verb for s in apiserver.seen() if s.verb in ("create", "patch") and s.resource == "resourceslices"
    ]
    assert writes == ["create", "create", "patch", "patch"], "one write per change, none for its own echo"
    await api.close()


async def test_a_watch_the_agent_may_not_make_is_said_once_and_the_checks_take_over(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A ClusterRole without watch on resourceslices (one from before the watch): the 403 was retried as an
    outage for ever, the API state down. It is one line naming the verb, the watch asked again at each check,
    and a deleted slice is put back by the check."""
    caplog.set_level(logging.INFO, logger="ascend_agent.cluster")
    apiserver.fail(403, verb="watch", resource="resourceslices")
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)
    publisher = SlicePublisher("npu.huawei.com", "NoSchedule", refresh=0.2)
    publisher.observe(Inventory((Chip.make(0, "910B4"),)))

    def watches() -> int:
        return sum(s.verb == "watch" and s.resource == "resourceslices" for s in apiserver.seen())

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(publisher.run, api)
            (first,) = await anyio.to_thread.run_sync(
                lambda: apiserver.wait_for(lambda: apiserver.list("resourceslices"), bool)
            )
            await anyio.to_thread.run_sync(lambda: apiserver.wait_for(watches, lambda n: n >= 3))
            await api.client.delete(ResourceSlice, first["metadata"]["name"])
            (again,) = await anyio.to_thread.run_sync(
                lambda: apiserver.wait_for(lambda: apiserver.list("resourceslices"), bool)
            )
            tasks.cancel_scope.cancel()
    finally:
        apiserver.behave()
        await api.close()
    assert again["spec"]["devices"] == first["spec"]["devices"]
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and said[0].startswith("The agent may not watch resourceslices (403 Forbidden: "), (
        said
    )
    assert "lacks the verb watch" in said[0]
    assert api.health.state().up, api.health.state().detail


async def test_a_watch_event_without_a_name_is_passed_over(apiserver: ApiServer) -> None:
    """A KeyError on the event's metadata.name ended the slices' task: nothing was written again after."""
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)
    publisher = SlicePublisher("npu.huawei.com", "NoSchedule")
    publisher.observe(Inventory((Chip.make(0, "910B4"),)))

    def watching() -> bool:
        return any(s.verb == "watch" and s.resource == "resourceslices" for s in apiserver.seen())

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(publisher.run, api)
            (first,) = await anyio.to_thread.run_sync(
                lambda: apiserver.wait_for(lambda: apiserver.list("resourceslices"), bool)
            )
            await anyio.to_thread.run_sync(lambda: apiserver.wait_for(watching, bool))
            nameless = {**first, "metadata": {"resourceVersion": "999999"}}
            apiserver.send_event("resourceslices", "MODIFIED", nameless)
            await api.client.delete(ResourceSlice, first["metadata"]["name"])
            (again,) = await anyio.to_thread.run_sync(
                lambda: apiserver.wait_for(lambda: apiserver.list("resourceslices"), bool, timeout=10.0)
            )
            tasks.cancel_scope.cancel()
    finally:
        await api.close()
    assert again["spec"]["devices"] == first["spec"]["devices"]


async def test_the_slices_are_written_again_when_the_kubelet_registers_the_driver_anew(
    apiserver: ApiServer,
) -> None:
    """With no watch delivering, the kubelet's registration alone puts back what it deleted at its start."""
    apiserver.fail("hang", verb="watch", resource="resourceslices")
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)
    publisher = SlicePublisher("npu.huawei.com", "NoSchedule")
    publisher.observe(Inventory((Chip.make(0, "910B4"),)))
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(publisher.run, api)
            (first,) = await anyio.to_thread.run_sync(
                lambda: apiserver.wait_for(lambda: apiserver.list("resourceslices"), bool)
            )
            await api.client.delete(ResourceSlice, first["metadata"]["name"])
            publisher.kubelet_registered()
            (again,) = await anyio.to_thread.run_sync(
                lambda: apiserver.wait_for(lambda: apiserver.list("resourceslices"), bool)
            )
            tasks.cancel_scope.cancel()
    finally:
        apiserver.behave()
        await api.close()
    assert again["spec"]["devices"] == first["spec"]["devices"]


async def test_the_doctor_takes_a_chip_split_into_vnpus_for_its_vnpu_devices(apiserver: ApiServer) -> None:
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)
    chips = (Chip.make(0, "310P3"), Chip.make(1, "310P3"))
    inventory = Inventory(chips, vnpus=(chips[0].slice(VNpu(100, "vir02", aicore=2)),))
    (spec,) = pool_slices(inventory, TAINTS)
    apiserver.put("resourceslices", _slice(spec))
    check = await slices_check(api, "npu.huawei.com", inventory)
    assert check.ok, check.detail
    assert check.detail == "1 slice, 2 chip devices, none tainted, for 2 chips"
    (spec,) = pool_slices(Inventory(chips), TAINTS)  # as published before the split
    apiserver.put("resourceslices", _slice(spec))
    check = await slices_check(api, "npu.huawei.com", inventory)
    assert not check.ok
    assert "chips without a device: npu-0-vnpu-100" in check.detail
    assert "devices of no chip here: npu-0" in check.detail


async def test_a_taint_says_since_when_and_keeps_that_time_across_a_restart(apiserver: ApiServer) -> None:
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)
    sick = Chip.make(1, "910B4", health=Health.UNHEALTHY, reason="npu-smi: Critical")
    inventory = Inventory((Chip.make(0, "910B4"), sick))

    async def published(publisher: SlicePublisher) -> dict[str, Any]:
        publisher.observe(inventory)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(publisher.run, api)
            with anyio.fail_after(10):
                while publisher._writer is None or publisher._writer.pending:
                    await anyio.sleep(0.01)
            tasks.cancel_scope.cancel()
        (found,) = apiserver.list("resourceslices")
        return found

    first = await published(SlicePublisher("npu.huawei.com", "NoSchedule"))
    (taint,) = first["spec"]["devices"][1]["taints"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", taint["timeAdded"])
    assert (
        kubernetes_validate.validate({**_slice({}), "spec": first["spec"]}, KUBERNETES, strict=True)
        == KUBERNETES
    )

    again = await published(SlicePublisher("npu.huawei.com", "NoSchedule"))  # the agent restarted
    assert again["spec"] == first["spec"], "same taint time, same generation"
    writes = [s for s in apiserver.seen() if s.verb in ("create", "patch") and s.resource == "resourceslices"]
    assert len(writes) == 1
    await api.close()


def slice_writes(apiserver: ApiServer) -> int:
    """How many creates, patches and deletes of ResourceSlices the server has had."""
    return sum(
        s.verb in ("create", "patch", "delete") and s.resource == "resourceslices" for s in apiserver.seen()
    )


async def publish_until_settled(
    apiserver: ApiServer, api: KubeApi, publisher: SlicePublisher, ready: Any, checks: int = 5
) -> tuple[list[dict[str, Any]], int]:
    """Run the publisher until ``ready`` of the slices is true, then until ``checks`` more lists (a check
    each) have passed: the slices when ready, and the writes by then (compare :func:`slice_writes` after)."""

    def lists() -> int:
        return sum(s.verb == "list" and s.resource == "resourceslices" for s in apiserver.seen())

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(publisher.run, api)
        found = await anyio.to_thread.run_sync(
            lambda: apiserver.wait_for(lambda: apiserver.list("resourceslices"), ready)
        )
        writes, start = slice_writes(apiserver), lists()
        await anyio.to_thread.run_sync(lambda: apiserver.wait_for(lists, lambda n: n >= start + checks))
        tasks.cancel_scope.cancel()
    return found, writes


def _drop_device_taints(body: dict[str, Any]) -> None:
    """What an API server with DRADeviceTaints off (1.34, 1.35) keeps of a written slice."""
    for device in (body.get("spec") or {}).get("devices") or ():
        device.pop("taints", None)


async def test_an_api_server_that_drops_taints_gets_the_tainted_chip_left_out_and_no_rewrite_loop(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Kubernetes 1.34 and 1.35 drop device taints (their gate is off): the Unhealthy chip's device was
    published untainted, so a claim could be allocated it. It is left out, said once, and the slice as the
    server keeps it is no change to undo at each check."""
    caplog.set_level(logging.INFO, logger="ascend_agent.cluster")
    apiserver.rewrite_writes("resourceslices", _drop_device_taints)
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)
    sick = Chip.make(1, "910B4", health=Health.UNHEALTHY, reason="npu-smi: Critical")
    publisher = SlicePublisher("npu.huawei.com", "NoSchedule", refresh=0.2)
    publisher.observe(Inventory((Chip.make(0, "910B4"), sick, Chip.make(2, "910B4"))))

    def left_out(found: list[dict[str, Any]]) -> bool:
        return [d["name"] for s in found for d in s["spec"].get("devices") or ()] == ["npu-0", "npu-2"]

    try:
        _, writes = await publish_until_settled(apiserver, api, publisher, left_out)
    finally:
        await api.close()
    assert slice_writes(apiserver) == writes == 2, "no write after the chip was left out"
    said = [r.getMessage() for r in caplog.records if "dropped the device taints" in r.getMessage()]
    assert len(said) == 1 and "a tainted chip is left out of the slices" in said[0], said


async def test_a_field_the_api_server_drops_is_no_change_to_write_again_at_each_check(
    apiserver: ApiServer,
) -> None:
    """An API server without some feature drops its field from every write: the slice it keeps differs from
    what the agent writes, which took it for someone else's change and wrote it again at every check."""

    def drop_driver_version(body: dict[str, Any]) -> None:
        for device in (body.get("spec") or {}).get("devices") or ():
            device.get("attributes", {}).pop("driverVersion", None)

    apiserver.rewrite_writes("resourceslices", drop_driver_version)
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)
    publisher = SlicePublisher("npu.huawei.com", "NoSchedule", refresh=0.2)
    publisher.observe(Inventory((Chip.make(0, "910B4"),), driver_version="25.0.rc1.1"))
    try:
        (kept,), writes = await publish_until_settled(apiserver, api, publisher, bool)
    finally:
        await api.close()
    assert "driverVersion" not in kept["spec"]["devices"][0]["attributes"]
    assert slice_writes(apiserver) == writes == 1


async def test_a_slice_deleted_after_a_restart_that_found_it_right_is_put_back(apiserver: ApiServer) -> None:
    """The agent restarted and found its slice as it should be (no write): a deletion then went unnoticed
    (until the next check, 5 minutes on) because nothing marked the slice as the agent's."""
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)
    inventory = Inventory((Chip.make(0, "910B4"),))
    try:
        first = SlicePublisher("npu.huawei.com", "NoSchedule")
        first.observe(inventory)
        (written,), _ = await publish_until_settled(apiserver, api, first, bool, checks=0)
        again = SlicePublisher("npu.huawei.com", "NoSchedule")  # the agent restarted
        again.observe(inventory)

        def watching() -> int:
            return sum(s.verb == "watch" and s.resource == "resourceslices" for s in apiserver.seen())

        watches = watching()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(again.run, api)
            await anyio.to_thread.run_sync(lambda: apiserver.wait_for(watching, lambda n: n > watches))
            await api.client.delete(ResourceSlice, written["metadata"]["name"])
            (back,) = await anyio.to_thread.run_sync(
                lambda: apiserver.wait_for(lambda: apiserver.list("resourceslices"), bool, timeout=10.0)
            )
            tasks.cancel_scope.cancel()
    finally:
        await api.close()
    assert back["spec"]["devices"] == written["spec"]["devices"]


async def test_claims_of_one_call_are_read_side_by_side(apiserver: ApiServer, short_dir: Path) -> None:
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=30.0)
    reader = ClaimReader(lambda: api, "npu.huawei.com", "node-1")
    service = DraService(
        "npu.huawei.com", "node-1", Prepared(short_dir / "c.json", short_dir, "npu.huawei.com"), reader
    )
    service.publish([Chip.make(0, "910B4")], lambda chips: ContainerSpec())
    claims = [ClaimRef("default", "a", "u1"), ClaimRef("default", "b", "u2")]
    apiserver.fail("hang", verb="get", resource="resourceclaims")
    answers: dict[str, Any] = {}

    async def prepare() -> None:
        answers.update(await service.prepare(claims))

    def reads() -> int:
        return sum(1 for s in apiserver.seen() if s.verb == "get" and s.resource == "resourceclaims")

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(prepare)
            # both reads reach the server while the first still hangs: one timeout for the call, not two
            await anyio.to_thread.run_sync(lambda: apiserver.wait_for(reads, lambda n: n == 2, timeout=5.0))
            apiserver.behave()
    finally:
        apiserver.behave()
        await api.close()
    assert list(answers) == ["u1", "u2"]
    assert all("cannot read ResourceClaim" in answer for answer in answers.values())


def test_the_dra_driver_starts_without_loading_the_client(short_dir: Path) -> None:
    """The client library is loaded in a worker thread by the cluster side; the DRA driver's registration
    must not wait for that import on the event loop."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from ascend_agent.config import Settings\n"
        "from ascend_agent.kubelet.dra import DraDriver\n"
        f"settings = Settings(kubelet_dir=Path({str(short_dir / 'device-plugins')!r}), kubelet_api='dra')\n"
        "DraDriver.open(settings, None)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightkube', 'httpx2')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


async def test_a_claim_asked_for_while_the_client_loads_waits_for_it(
    apiserver: ApiServer, short_dir: Path
) -> None:
    """The driver registers before the cluster side has loaded its client: a NodePrepareResources in that
    second is prepared once the client is there, not refused (the kubelet would back off)."""
    side = ClusterSide(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", lambda: [])
    settings = Settings(kubelet_dir=short_dir / "device-plugins", kubelet_api="dra", cdi_spec_dir=short_dir)
    driver = DraDriver.open(settings, side)
    driver.publish(Inventory((Chip.make(0, "910B4"),)))
    uid = apiserver.put_claim("train", ["npu-0"], driver="npu.huawei.com", pool="node-1")
    answers: dict[str, PreparedClaim | str] = {}
    asked_before_loaded: list[bool] = []
    answered = anyio.Event()

    async def prepare() -> None:
        asked_before_loaded.append(side.api is None)
        answers.update(await driver.service.prepare([ClaimRef("default", "train", uid)]))
        answered.set()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(prepare)
            tasks.start_soon(side.run)
            await answered.wait()
            tasks.cancel_scope.cancel()
    assert asked_before_loaded == [True]
    answer = answers[uid]
    assert isinstance(answer, PreparedClaim), answer
    assert [d.device_name for d in answer.devices] == ["npu-0"]


async def test_a_claim_says_why_when_the_cluster_side_could_not_start(short_dir: Path) -> None:
    kubeconfig = short_dir / "kubeconfig"
    kubeconfig.write_text("a: [b\n")
    side = ClusterSide(ClusterTarget("kubeconfig", kubeconfig), "node-1", lambda: [])
    await side.run()  # fails to load the kubeconfig and returns
    settings = Settings(kubelet_dir=short_dir / "device-plugins", kubelet_api="dra", cdi_spec_dir=short_dir)
    driver = DraDriver.open(settings, side)
    driver.publish(Inventory((Chip.make(0, "910B4"),)))
    answers = await driver.service.prepare([ClaimRef("default", "train", "u1")])
    assert answers["u1"] == (
        "cannot read ResourceClaim default/train: the cluster side is off: "
        f"cannot use kubeconfig {kubeconfig}: ParserError: while parsing a flow sequence"
    )


@pytest.mark.parametrize("mode", ["plain", "ascend-runtime"])
def test_every_cdi_device_of_a_claim_has_edits(mode: str) -> None:
    """CDI refuses a spec with a device without edits ("invalid device, empty device edits")."""
    chips = {f"npu-{i}": Chip.make(i, "910B4") for i in (0, 1)}
    base = container_base(mode, [DeviceNode("/dev/davinci_manager", "/dev/davinci_manager")])
    spec = claim_spec("npu.huawei.com", "u1", chips, container_spec(list(chips.values()), base))
    assert all(any(device["containerEdits"].values()) for device in spec["devices"])
    assert "ASCEND_VISIBLE_DEVICES=0,1" in spec["containerEdits"]["env"]


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def test_slice_names_of_a_long_node_name_stay_valid_and_distinct() -> None:
    node = ".".join(["n" * 62] * 4) + "-x"  # 252 characters: a valid node name
    names = [slice_name(node, "npu.huawei.com", index) for index in range(12)]
    assert all(len(name) <= 253 and _DNS_SUBDOMAIN.match(name) for name in names), names
    assert len(set(names)) == len(names)
    assert slice_name("node-1", "npu.huawei.com", 0) == "node-1-npu.huawei.com-0"


async def test_the_doctor_says_what_is_missing_of_a_dra_driver(short_dir: Path) -> None:
    settings = Settings(kubelet_dir=short_dir / "kubelet" / "device-plugins", kubelet_api="dra")
    checkpoint = short_dir / "kubelet" / "plugins" / "npu.huawei.com" / "checkpoint.json"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text("not json")
    checks = {check.check: check for check in await kubelet_checks(settings, None)}
    for name, path in (
        ("DRA registration socket", short_dir / "kubelet" / "plugins_registry" / "npu.huawei.com-reg.sock"),
        ("DRA plugin socket", checkpoint.parent / "dra.sock"),
    ):
        assert (checks[name].ok, checks[name].detail) == (False, f"{path} does not exist")
    assert checks["prepared claims"].ok is False
    assert checks["prepared claims"].detail.startswith(f"{checkpoint} is not a checkpoint of prepared claims")
    checkpoint.unlink()
    (claims,) = [c for c in await kubelet_checks(settings, None) if c.check == "prepared claims"]
    assert (claims.ok, claims.detail) == (True, f"none: no checkpoint {checkpoint} yet")


def test_a_chip_whose_health_is_unknown_is_never_evicted_for_it() -> None:
    """npu-smi down: the chip takes no new claims, but NoExecute would evict every pod for a tool's outage."""
    unknown = Chip.make(
        1,
        "910B4",
        health=Health.UNHEALTHY,
        health_unknown=True,
        reason="health unknown: npu-smi failed 3 times in a row: ret -8020",
    )
    (spec,) = pool_slices(
        Inventory((Chip.make(0, "910B4"), unknown)), DeviceTaints("npu.huawei.com", "NoExecute")
    )
    assert [d.get("taints") for d in spec["devices"]] == [
        None,
        [{"key": "npu.huawei.com/unhealthy", "value": "npu-smi-down", "effect": "NoSchedule"}],
    ]
