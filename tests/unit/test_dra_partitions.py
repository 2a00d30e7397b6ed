"""Dynamic vNPUs as partitionable devices, without processes: the counter sets and template devices of a
chip, the slices of whole nodes against the resource.k8s.io/v1 schema of Kubernetes 1.36 (counter sets in
slices of their own, at most 8 a slice, at most 64 devices a slice that consume counters), the vnpu:
setting's dynamic entries, NpuConfig and the claim's opaque configuration."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_agent._proto.dra import v1 as health_v1
from ascend_agent._proto.dra import v1alpha1 as health_v1alpha1
from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.container import container_spec
from ascend_agent.kubelet.dra.carving import Made, MadeVnpus
from ascend_agent.kubelet.dra.claimread import ClaimReader, ClaimRef
from ascend_agent.kubelet.dra.claims import Prepared
from ascend_agent.kubelet.dra.devices import DeviceTaints, chip_of, overlap, pool_slices
from ascend_agent.kubelet.dra.npuconfig import API_VERSION, KIND, NpuConfig, NpuConfigError, npu_config
from ascend_agent.kubelet.dra.partitions import chip_offer, template_device_name, template_device_of
from ascend_agent.kubelet.dra.service import DraService
from ascend_agent.kubelet.dra.slices import SlicePublisher
from ascend_agent.model import Carvable, Chip, ContainerBase, Health, Inventory, Template
from ascend_agent.vnpu_layout import DYNAMIC, is_dynamic, parse_layout
from backends.npusmi_vnpu import parse_info_vnpu, parse_template_info
from tests.support.apiserver import ApiServer
from tests.support.vnpu_node import INFO_VNPU_TWO, TEMPLATE_INFO
from tests.unit.test_dra import _slice, publish_until_settled, slice_writes

KUBERNETES = "1.36"
TAINTS = DeviceTaints("npu.huawei.com", "NoSchedule")
TEMPLATES_310P = parse_template_info(TEMPLATE_INFO)
# info-vnpu of a 310P3 (the shared sample): 8 AI cores, 21 GB, 7 AI CPUs and media units, PNGD NA.
TOTALS_310P = tuple(
    (label, total)
    for label, (_, total) in parse_info_vnpu(INFO_VNPU_TWO).resources.items()
    if total is not None
)
# Huawei's published templates (docs: vnpu.md); the totals are constructed: npu-smi's info-vnpu of these
# products is not among the samples.
TEMPLATES_910B = (
    Template("vir05_1c_8g", 5, 8, 1),
    Template("vir05_1c_16g", 5, 16, 1),
    Template("vir10_3c_16g", 10, 16, 3),
    Template("vir10_3c_16g_nm", 10, 16, 3),
    Template("vir10_4c_16g_m", 10, 16, 4),
    Template("vir10_3c_32g", 10, 32, 3),
)
TOTALS_910B = (("aicore", 20), ("memory", 64), ("aicpu", 7))
TEMPLATES_A3 = (Template("vir06_1c_16g", 6, 16, 1), Template("vir12_3c_32g", 12, 32, 3))
TOTALS_A3 = (("aicore", 24), ("memory", 64), ("aicpu", 6))


def test_a_310p_offers_each_template_as_often_as_its_counters_allow() -> None:
    offer = chip_offer(Carvable(1, TEMPLATES_310P, TOTALS_310P))
    counters = dict(offer.counters)
    assert counters == {
        "ai-cores": 8, "memory": 24, "ai-cpus": 7,
        "vpc": 12, "venc": 3, "vdec": 12, "jpegd": 16, "jpege": 4,
    }  # fmt: skip
    counts = {template.name: count for template, _, count in offer.templates}
    # AI CPUs bound vir02 (7 // 2), the 3 video encoders vir02_1c; the DVPP template takes all media units
    assert counts == {
        "vir01": 7, "vir02": 3, "vir02_1c": 3, "vir04": 1, "vir04_3c": 2,
        "vir04_3c_ndvpp": 2, "vir04_4c_dvpp": 1,
    }  # fmt: skip
    # npu-smi's PNGD is NA: no counter, and nothing consumes it
    assert all("pngd" not in dict(needs) for _, needs, _ in offer.templates)
    assert offer.left_out == ()


def test_a_counter_set_that_does_not_add_up_leaves_out_what_does_not_fit() -> None:
    too_big = Template("vir16", 16, 48, 8)
    offer = chip_offer(Carvable(2, (*TEMPLATES_310P[:2], too_big), TOTALS_310P))
    assert [t.name for t, _, _ in offer.templates] == ["vir01", "vir02"]
    assert offer.left_out == ("npu-2: template vir16 needs 16 ai-cores (the chip has 8); not offered",)
    # npu-smi gives no AI core total: the chip is no counter set; it is published whole, as a plain chip
    bare = chip_offer(Carvable(3, TEMPLATES_310P, (("memory", 21),)))
    assert bare.counters == () and bare.left_out == ("npu-3: npu-smi gives no AI core total",)
    chips = (Chip.make(3, "310P3", npu_id=3),)
    (spec,) = pool_slices(
        Inventory(chips, carvable=(Carvable(3, TEMPLATES_310P, (("memory", 21),)),)), TAINTS
    )
    assert [d["name"] for d in spec["devices"]] == ["npu-3"] and "consumesCounters" not in spec["devices"][0]


@pytest.mark.parametrize(
    ("model", "chips", "templates", "totals", "counter_slices", "device_slices", "devices"),
    [
        ("910B4", 8, TEMPLATES_910B, TOTALS_910B, 1, 2, 8 * (1 + 4 + 4 + 2 + 2 + 1 + 2)),
        ("910_9392", 16, TEMPLATES_A3, TOTALS_A3, 2, 2, 16 * (1 + 4 + 2)),
        ("310P3", 4, TEMPLATES_310P, TOTALS_310P, 1, 2, 4 * (1 + 7 + 3 + 3 + 1 + 2 + 2 + 1)),
    ],
)
def test_node_slices_are_valid_for_kubernetes_1_36(
    model: str,
    chips: int,
    templates: tuple[Template, ...],
    totals: tuple[tuple[str, int], ...],
    counter_slices: int,
    device_slices: int,
    devices: int,
) -> None:
    node = tuple(Chip.make(i, model, npu_id=i // 2 if model == "910_9392" else i) for i in range(chips))
    inventory = Inventory(node, carvable=tuple(Carvable(i, templates, totals) for i in range(chips)))
    specs = pool_slices(inventory, TAINTS)
    counters = [s for s in specs if "sharedCounters" in s]
    assert [len(s["sharedCounters"]) for s in counters] == [
        min(8, chips - 8 * i) for i in range(counter_slices)
    ]
    published = [s for s in specs if "devices" in s]
    assert len(published) == device_slices and all(len(s["devices"]) <= 64 for s in published)
    assert sum(len(s["devices"]) for s in published) == devices
    for index, spec in enumerate(specs):
        assert kubernetes_validate.validate(_slice(spec, index), KUBERNETES, strict=True) == KUBERNETES
    names = {c["name"] for s in counters for c in s["sharedCounters"]}
    for spec in published:
        for device in spec["devices"]:
            (consumed,) = device["consumesCounters"]
            assert consumed["counterSet"] in names


def test_a_tainted_dynamic_chip_taints_its_template_devices() -> None:
    chip = Chip.make(0, "310P3", npu_id=0).with_health(
        Chip.make(0, "310P3").health.UNHEALTHY, "npu-smi: Critical"
    )
    specs = pool_slices(Inventory((chip,), carvable=(Carvable(0, TEMPLATES_310P, TOTALS_310P),)), TAINTS)
    devices = [d for s in specs for d in s.get("devices", ())]
    assert all(d["taints"][0]["value"] == "npu-smi--Critical" for d in devices)


def test_template_device_names_round_trip_and_overlap_their_chip() -> None:
    for template in TEMPLATES_310P + TEMPLATES_910B + TEMPLATES_A3:
        name = template_device_name(12, template.name, 3)
        assert template_device_of(name) == (12, template.name)
        assert chip_of(name) == "npu-12"
        assert overlap("npu-12", name) and not overlap(name, template_device_name(12, template.name, 4))
    assert template_device_of("npu-1-vnpu-116") is None and template_device_of("npu-1") is None


def test_the_vnpu_setting_makes_chips_dynamic() -> None:
    layout = parse_layout({"dynamic": True, "1": ["vir02"], "310P3": {"dynamic": True}})
    assert layout == (("*", DYNAMIC), ("1", ("vir02",)), ("310P3", DYNAMIC))
    assert is_dynamic(layout, Chip.make(0, "910B4")) and not is_dynamic(layout, Chip.make(1, "310P3"))
    assert not is_dynamic(layout, Chip.make(2, "310"))  # cannot be split
    assert not is_dynamic(parse_layout({"dynamic": False}), Chip.make(0, "310P3"))
    for bad, words in (
        ({"dynamic": "yes"}, "dynamic must be true or false"),
        ({"3": {"dynamic": True, "templates": []}}, "3: unknown field 'templates'"),
        ({"310B1": {"dynamic": True}}, "310B1: 310B1 chips cannot be split into vNPUs"),
        ({"3": {"dynamic": False}}, "3: {dynamic: false} is no layout"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_layout(bad)


@given(
    st.dictionaries(
        st.sampled_from(["apiVersion", "kind", "runtime", "template", "templat", "extra"]),
        st.one_of(st.text(max_size=12), st.integers(), st.none(), st.sampled_from(["plain", "vir04", KIND])),
        max_size=5,
    )
)
def test_npu_config_is_a_config_or_one_line_naming_the_field(entry: dict[str, Any]) -> None:
    entry = {"apiVersion": API_VERSION, "kind": KIND, **entry}
    try:
        config = npu_config([entry])
    except NpuConfigError as exc:
        assert "\n" not in str(exc)
        unknown = sorted(k for k in entry if k not in ("apiVersion", "kind", "runtime", "template"))
        if entry["apiVersion"] == API_VERSION and entry["kind"] == KIND and unknown:
            assert f"unknown field '{unknown[0]}'" in str(exc)
        return
    assert set(entry) <= {"apiVersion", "kind", "runtime", "template"}
    assert config == NpuConfig(entry.get("runtime"), entry.get("template"))


def test_the_claims_config_follows_the_classs_for_its_request() -> None:
    reader = ClaimReader(lambda: None, "npu.huawei.com", "node-1")
    claim = ClaimRef("default", "infer", "uid-1")
    config = [
        {
            "source": "FromClaim",
            "requests": ["small"],
            "opaque": {"driver": "npu.huawei.com", "parameters": "claim"},
        },
        {
            "source": "FromClass",
            "requests": ["small"],
            "opaque": {"driver": "npu.huawei.com", "parameters": "class"},
        },
        {"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": "other driver"}},
        {
            "source": "FromClaim",
            "requests": ["big"],
            "opaque": {"driver": "npu.huawei.com", "parameters": "big"},
        },
    ]
    results = [
        {"request": "small/first", "driver": "npu.huawei.com", "pool": "node-1", "device": "npu-0-vir02-0"},
        {"request": "big", "driver": "npu.huawei.com", "pool": "node-1", "device": "npu-1"},
    ]
    found = {
        "metadata": {"uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": results, "config": config}}},
    }
    small, big = reader._results(claim, found)
    assert small.parameters == ("class", "claim") and big.parameters == ("big",)


def test_the_record_of_made_vnpus_survives_what_the_checkpoint_does_not(tmp_path: Path) -> None:
    path = tmp_path / "vnpus.json"
    made, aside = MadeVnpus.open(path)
    assert aside is None and list(made) == []
    entry = Made("0b1c2d3e-aaaa-bbbb-cccc-123456789abc", "npu-1-vir04-0", 1, 116, "vir04")
    made.add(entry)
    assert list(MadeVnpus.open(path)[0]) == [entry] and made.ids_on(1) == {116}
    for damage in (b'{"version": 1, "vnpus": [{"claim": "../x"', b'{"version": 1, "vnpus": [{"claim": 3}]}'):
        path.write_bytes(damage)
        again, aside = MadeVnpus.open(path)
        assert list(again) == [] and aside is not None and aside.kept_as.exists()
        assert "is not a record of vNPUs made" in aside.reason
    path.symlink_to(tmp_path / "elsewhere")
    again, aside = MadeVnpus.open(path)
    assert aside is not None and "symbolic link" in aside.reason and not path.is_symlink()


_TEMPLATE = st.builds(
    Template,
    name=st.sampled_from(["vir01", "vir02", "vir04", "vir08", "vir16", "vir05_1c_8g", "vir12_3c_32g"]),
    aicore=st.integers(1, 64),
    memory_gb=st.one_of(st.none(), st.integers(0, 128)),
    aicpu=st.one_of(st.none(), st.integers(0, 16)),
    media=st.lists(
        st.tuples(st.sampled_from(["vpc", "venc", "vdec", "jpegd", "jpege", "pngd"]), st.integers(0, 20)),
        max_size=3,
    ).map(tuple),
)
_TOTALS = st.lists(
    st.tuples(
        st.sampled_from(["aicore", "memory", "aicpu", "vpc", "venc", "vdec", "jpegd", "mystery"]),
        st.integers(0, 64),
    ),
    max_size=8,
).map(lambda pairs: tuple(dict(pairs).items()))


@given(st.lists(_TEMPLATE, max_size=6, unique_by=lambda t: t.name).map(tuple), _TOTALS)
def test_what_a_chip_offers_never_adds_up_to_more_than_it_has(
    templates: tuple[Template, ...], totals: tuple[tuple[str, int], ...]
) -> None:
    offer = chip_offer(Carvable(0, templates, totals))
    counters = dict(offer.counters)
    if not counters:
        assert offer.templates == () and len(offer.left_out) == 1
        return
    assert counters["ai-cores"] > 0 and "mystery" not in counters
    for _, needs, count in offer.templates:
        assert count >= 1
        for counter, need in needs:
            assert count * need <= counters[counter]
    offered = {t.name for t, _, _ in offer.templates}
    assert len(offered) + len(offer.left_out) == len(templates)


async def test_a_template_device_is_in_the_health_stream_with_its_chips_health(tmp_path: Path) -> None:
    prepared, _ = Prepared.open(tmp_path / "checkpoint.json", tmp_path / "cdi", "npu.huawei.com", "boot-1")
    service = DraService("npu.huawei.com", "node-1", prepared, None)
    chip = Chip.make(1, "310P3", npu_id=1).with_health(Health.UNHEALTHY, "Alarm")
    offer = chip_offer(Carvable(1, TEMPLATES_310P, TOTALS_310P))
    service.publish([chip], lambda chips: container_spec(chips, ContainerBase()), offers={1: offer})
    updates = service.health_updates(health_v1)
    first = await updates.__anext__()
    await updates.aclose()
    health = {d.device.device_name: (d.health, d.message) for d in first.devices}
    names = {template_device_name(1, t.name, i) for t, _, count in offer.templates for i in range(count)}
    assert "npu-1-vir04-0" in names and names | {"npu-1"} == set(health)
    assert {health[name] for name in names} == {health["npu-1"]}
    assert health["npu-1"][0] == health_v1.HealthStatus.UNHEALTHY


@pytest.mark.parametrize(("api", "version"), [(health_v1, "v1"), (health_v1alpha1, "v1alpha1")])
async def test_the_log_says_which_health_service_the_kubelet_opened(
    tmp_path: Path, api: Any, version: str, caplog: pytest.LogCaptureFixture
) -> None:
    prepared, _ = Prepared.open(tmp_path / "checkpoint.json", tmp_path / "cdi", "npu.huawei.com", "boot-1")
    service = DraService("npu.huawei.com", "node-1", prepared, None)
    service.publish([Chip.make(0, "910B3")], lambda chips: container_spec(chips, ContainerBase()))
    caplog.set_level("INFO", logger="ascend_agent.kubelet.dra.service")
    updates = service.health_updates(api)
    await updates.__anext__()
    await updates.aclose()
    said = [r.getMessage() for r in caplog.records if "DRAResourceHealth" in r.getMessage()]
    assert said == [f"the kubelet watches the devices' health through {version}.DRAResourceHealth"], said


def _drop_counters(body: dict[str, Any]) -> None:
    """What an API server with DRAPartitionableDevices off (1.34, 1.35) keeps of a written slice."""
    spec = body.get("spec") or {}
    spec.pop("sharedCounters", None)
    for device in spec.get("devices") or ():
        device.pop("consumesCounters", None)


async def test_an_api_server_that_drops_counters_gets_the_chips_whole_and_no_template_devices(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Without counters a dynamic chip and its template devices were each allocatable, together: two claims
    could get the same chip. The templates are left out, the chips published whole, said once."""
    caplog.set_level(logging.INFO, logger="ascend_agent.cluster")
    apiserver.rewrite_writes("resourceslices", _drop_counters)
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=2.0)
    chips = tuple(Chip.make(i, "310P3") for i in range(2))
    publisher = SlicePublisher("npu.huawei.com", "NoSchedule", refresh=0.2)
    publisher.observe(
        Inventory(chips, carvable=tuple(Carvable(i, TEMPLATES_310P, TOTALS_310P) for i in range(2)))
    )

    def whole(found: list[dict[str, Any]]) -> bool:
        return sorted(d["name"] for s in found for d in s["spec"].get("devices") or ()) == ["npu-0", "npu-1"]

    try:
        _, writes = await publish_until_settled(apiserver, api, publisher, whole)
    finally:
        await api.close()
    assert slice_writes(apiserver) == writes, "written again after the chips were published whole"
    said = [r.getMessage() for r in caplog.records if "dropped the counter sets" in r.getMessage()]
    assert len(said) == 1 and "their chips are published whole instead" in said[0], said
