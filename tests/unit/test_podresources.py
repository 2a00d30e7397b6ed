"""Which pod holds which chip, asked of a PodResources stand-in over its unix socket."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import anyio.to_thread
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_agent.config import Settings
from ascend_agent.doctor.holders import holders_check
from ascend_agent.kubelet.podresources import (
    MAX_ANSWER,
    MAX_DEVICES,
    PodHolders,
    PodResourcesError,
    holders_of,
    list_holders,
)
from ascend_agent.model import Chip, Holder, VNpu
from tests.support.podresources import PodResourcesStandin

T = "huawei.com/Ascend910"


async def test_holders_by_chip_and_replica(podresources: PodResourcesStandin) -> None:
    podresources.hold("huawei.com/Ascend910", ["Ascend910-3-0"], "team-a", "train-0", "main")
    podresources.hold("huawei.com/Ascend910", ["Ascend910-3-1", "Ascend910-4-0"], "team-b", "infer", "server")
    podresources.hold("nvidia.com/gpu", ["Ascend910-5-0"], "other", "gpu-pod", "c")
    holders = await list_holders(podresources.path)
    chip3, chip4, chip5 = (Chip.make(i, "910B3") for i in (3, 4, 5))
    assert holders.of(chip3, replicas=2) == (
        Holder("team-a", "train-0", "main"),
        Holder("team-b", "infer", "server"),
    )
    assert holders.of(chip4, replicas=2) == (Holder("team-b", "infer", "server"),)
    assert holders.of(chip5, replicas=2) == (), "another resource's device of the same name is not ours"


async def test_missing_socket_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(
        PodResourcesError, match=r"does not exist \(is the pod-resources directory mounted\?\)"
    ):
        await list_holders(tmp_path / "absent.sock")


async def test_refusing_socket_costs_one_warning_and_empty_holders(
    podresources: PodResourcesStandin, caplog: pytest.LogCaptureFixture
) -> None:
    podresources.hold("huawei.com/Ascend910", ["Ascend910-0"], "ns", "p", "c")
    view = PodHolders(podresources.path, interval=5)
    assert await view.refresh() is True
    podresources.refuse = True
    for _ in range(3):
        await view.refresh()
    assert view.holders.by_device == {}
    assert view.error is not None and "refused List: pod resources are not ready" in view.error
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    podresources.refuse = False
    assert await view.refresh() is True
    assert view.error is None


async def test_a_change_found_by_an_asked_refresh_wakes_the_agent(podresources: PodResourcesStandin) -> None:
    """An Allocate or the hot reset asks PodResources itself (``refresh``), not the poller's loop: a change
    it finds is told all the same (the agent reconciles on it under --volcano), once."""
    view = PodHolders(podresources.path, interval=5)
    told: list[object] = []
    view.on_change = lambda: told.append(view.holders)
    podresources.hold("huawei.com/Ascend910", ["Ascend910-0"], "ns", "p", "c")
    assert await view.refresh() is True
    assert await view.refresh() is False
    assert len(told) == 1 and told[0] is view.holders


async def test_an_answer_asked_before_the_last_one_taken_in_is_dropped(
    podresources: PodResourcesStandin,
) -> None:
    """Two asks at once (the poller's and an Allocate's), answered out of order: the older answer, which
    still lists the pod, does not undo the newer one, which lists it no more."""
    podresources.hold("huawei.com/Ascend910", ["Ascend910-0"], "ns", "p", "c")
    view = PodHolders(podresources.path, interval=5)
    assert await view.refresh() is True
    told: list[object] = []
    view.on_change = lambda: told.append(view.holders)
    podresources.stall_next()
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(view.refresh)  # asked first: its answer, the pod on Ascend910-0, held back
            await anyio.to_thread.run_sync(podresources.wait_calls, 2)
            podresources.release_all()
            assert await view.refresh() is True  # asked second, answered first: the pod went
            podresources.release_stalled()
    assert view.holders.by_device == {}, "the older answer was taken in after the newer one"
    assert len(told) == 1


async def test_dra_claims_name_their_holders_by_driver_and_device(podresources: PodResourcesStandin) -> None:
    driver = "npu.huawei.com"
    podresources.claim(driver, "node-1", "npu-1", "team-a", "train-0", "main", "train")
    podresources.claim(driver, "node-1", "npu-1", "ops", "monitor", "exporter", "watch-all")
    podresources.claim(driver, "node-1", "npu-3-vnpu-130", "team-b", "infer", "server", "small")
    podresources.claim("gpu.example.com", "node-1", "npu-2", "other", "gpu-pod", "c", "gpus")
    podresources.hold("huawei.com/Ascend910", ["Ascend910-2"], "team-c", "plugin-pod", "c")
    podresources.claim(driver, "node-1", "", "team-d", "odd", "c", "no-device")  # a resource without a device
    holders = await list_holders(podresources.path)
    assert all(device for _, device in holders.by_claimed), "a claim resource without a device names none"
    chip1, chip2 = Chip.make(1, "910B3"), Chip.make(2, "910B3")
    assert holders.of_claimed(driver, chip1) == (
        Holder("ops", "monitor", "exporter", "watch-all"),
        Holder("team-a", "train-0", "main", "train"),
    )
    assert [str(h) for h in holders.of_claimed(driver, chip1)][1] == "team-a/train-0/main (claim train)"
    assert holders.of_claimed(driver, chip2) == (), "another driver's device of the same name is not ours"
    assert holders.of(chip2, replicas=1) == (Holder("team-c", "plugin-pod", "c"),), "device plugins as before"
    vnpu = Chip.make(3, "310P3").slice(VNpu(130, "vir02"))
    assert holders.of_claimed(driver, vnpu) == (Holder("team-b", "infer", "server", "small"),)
    assert holders.of_claimed(driver, Chip.make(3, "310P3")) == (), "a vNPU's holder does not hold its chip"
    podresources.claim(driver, "node-1", "npu-4-vir04-0", "team-c", "carved", "main", "vir04")
    carved = await list_holders(podresources.path)
    assert carved.of_claimed(driver, Chip.make(4, "310P3")) == (
        Holder("team-c", "carved", "main", "vir04"),
    ), "a template device carved from a dynamic chip at prepare is held on that chip"


async def test_the_doctor_names_a_pod_on_a_template_device_of_a_failing_chip(
    podresources: PodResourcesStandin,
) -> None:
    driver = "npu.huawei.com"
    podresources.claim(driver, "node-1", "npu-1-vir04-0", "team-a", "infer", "main", "small")
    settings = Settings(kubelet_api="dra", pod_resources_socket=podresources.path)
    check = await holders_check(settings, [(driver, "npu-1")])
    assert (check.ok, check.detail) == (False, "npu-1 held by team-a/infer/main (claim small)")


async def test_an_answer_over_4_mib_is_refused_before_it_is_read(
    podresources: PodResourcesStandin, podresources_api: ModuleType
) -> None:
    pb = podresources_api
    podresources.answer = pb.ListPodResourcesResponse(
        pod_resources=[pb.PodResources(name="p" * MAX_ANSWER, namespace="ns")]
    )
    with pytest.raises(PodResourcesError) as refused:
        await list_holders(podresources.path)
    said = str(refused.value).removeprefix(f"{podresources.path} answered List with ")
    assert re.fullmatch(
        rf"\d+ bytes, over the {MAX_ANSWER} read \(a node of a few hundred pods answers well "
        r"under 1 MiB\)",
        said,
    ), said


async def test_an_answer_naming_more_devices_than_a_node_has_is_refused(
    podresources: PodResourcesStandin,
) -> None:
    podresources.hold(T, [f"Ascend910-{n}" for n in range(MAX_DEVICES + 1)], "ns", "p", "c")
    with pytest.raises(PodResourcesError, match=f"answered List with more than {MAX_DEVICES} devices"):
        await list_holders(podresources.path)


_NAMES = st.text(st.sampled_from("ab-1\u00e9"), max_size=6)
_CLAIMS = st.lists(st.tuples(_NAMES, st.lists(st.tuples(_NAMES, _NAMES), max_size=3)), max_size=2)
_CONTAINERS = st.lists(
    st.tuples(_NAMES, st.lists(st.tuples(_NAMES, st.lists(_NAMES, max_size=3)), max_size=2), _CLAIMS),
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(pods=st.lists(st.tuples(_NAMES, _NAMES, _CONTAINERS), max_size=4), cpus=st.lists(st.integers(0, 999)))
def test_the_answer_is_read_as_protobuf_decodes_it(
    podresources_api: ModuleType, pods: list[Any], cpus: list[int]
) -> None:
    """Read field by field, an answer gives the holders protobuf's own decoder finds in it, whatever fields
    the read steps over (CPU ids, memory, topology, CDI devices)."""
    pb = podresources_api
    message = pb.ListPodResourcesResponse()
    expected_devices: dict[tuple[str, str], set[Holder]] = {}
    expected_claims: dict[tuple[str, str], set[Holder]] = {}
    for name, namespace, containers in pods:
        pod = message.pod_resources.add(name=name, namespace=namespace, cpu_ids=cpus)
        for container_name, devices, claims in containers:
            container = pod.containers.add(name=container_name, cpu_ids=cpus)
            container.memory.add(memory_type="hugepages-2Mi", size=1 << 21)
            for resource, ids in devices:
                container.devices.add(resource_name=resource, device_ids=ids).topology.nodes.add(ID=1)
                for device_id in ids:
                    expected_devices.setdefault((resource, device_id), set()).add(
                        Holder(namespace, name, container_name)
                    )
            for claim, resources in claims:
                entry = container.dynamic_resources.add(claim_name=claim, claim_namespace=namespace)
                for driver, device in resources:
                    entry.claim_resources.add(driver_name=driver, device_name=device, pool_name="node-1")
                    entry.claim_resources[-1].cdi_devices.add(name=f"{driver}/claim={device}")
                    if device:
                        expected_claims.setdefault((driver, device), set()).add(
                            Holder(namespace, name, container_name, claim)
                        )
    holders = holders_of(message.SerializeToString())
    assert holders.by_device == {key: tuple(sorted(found)) for key, found in expected_devices.items()}
    assert holders.by_claimed == {key: tuple(sorted(found)) for key, found in expected_claims.items()}
