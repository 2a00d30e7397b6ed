"""The agent's chip series under Huawei npu-exporter's names, labels and units
(ascend_agent.observability.npu_exporter), from families as /metrics shows them, and through /metrics' own
collection with the switch on and off."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from ascend_agent import observability
from ascend_agent.observability.npu_exporter import npu_exporter_families, use_npu_exporter_names
from tests.support import ROOT

NODE = "node-a"
FREE = {"node": NODE, "namespace": "", "pod": "", "container": ""}
HELD = {"node": NODE, "namespace": "train", "pod": "job-0", "container": "main"}


def _family(name: str, *samples: tuple[dict[str, str], float]) -> Metric:
    family = Metric(name, "", "gauge")
    for labels, value in samples:
        family.add_sample(name, labels, value)
    return family


def _info(device: str, holder: dict[str, str] = FREE, **labels: str) -> tuple[dict[str, str], float]:
    chip = {
        "device": device,
        "model": "910B3",
        "bus_id": "0000:c1:00.0",
        "driver_version": "25.0.rc1",
        "firmware_version": "7.7.0.1.231",
        "serial": "",
    } | labels
    return {**chip, **holder}, 1.0


def _of(device: str, holder: dict[str, str] = FREE, **labels: str) -> dict[str, str]:
    return {"device": device, **labels, **holder}


def _mapped(*families: Metric) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(dict(s.labels), s.value) for s in f.samples] for f in npu_exporter_families(families)}


def _chip_labels(phys_id: str, holder: tuple[str, str, str] = ("", "", "")) -> dict[str, str]:
    return {
        "id": phys_id,
        "model_name": "910B3",
        "vdie_id": "",
        "pcie_bus_info": "0000:C1:00.0",
        "namespace": holder[0],
        "pod_name": holder[1],
        "container_name": holder[2],
        "node": NODE,
    }


def test_telemetry_takes_npu_exporters_names_labels_and_units() -> None:
    mapped = _mapped(
        _family("ascend_agent_chip_info", _info("Ascend910-3"), _info("Ascend910-5", HELD, serial="SN5")),
        _family("ascend_agent_chip_temperature_celsius", (_of("Ascend910-3"), 41)),
        _family("ascend_agent_chip_power_watts", (_of("Ascend910-3"), 181.4)),
        _family(
            "ascend_agent_chip_utilization_ratio", (_of("Ascend910-3"), 0.57), (_of("Ascend910-5", HELD), 1)
        ),
        _family("ascend_agent_chip_hbm_used_bytes", (_of("Ascend910-3"), 3199 * 2**20)),
        _family("ascend_agent_chip_hbm_total_bytes", (_of("Ascend910-3"), 65536 * 2**20)),
        _family("ascend_agent_chip_memory_used_bytes", (_of("Ascend910-3"), 1024 * 2**20)),
        _family("ascend_agent_chip_memory_total_bytes", (_of("Ascend910-3"), 15 * 2**30)),
    )
    three = _chip_labels("3")
    assert mapped["npu_chip_info_temperature"] == [(three, 41)]
    assert mapped["npu_chip_info_power"] == [(three, 181.4)]
    assert mapped["npu_chip_info_utilization"] == [
        (three, 57),
        (_chip_labels("5", ("train", "job-0", "main")), 100),
    ]
    assert mapped["npu_chip_info_hbm_used_memory"] == [(three, 3199)]
    assert mapped["npu_chip_info_hbm_total_memory"] == [(three, 65536)]
    assert mapped["npu_chip_info_used_memory"] == [(three, 1024)]
    assert mapped["npu_chip_info_total_memory"] == [(three, 15360)]
    # The model under npu_chip_info_name's own label name; the serial number only where the agent read one.
    assert mapped["npu_chip_info_name"][0] == (
        {**{k: v for k, v in three.items() if k != "model_name"}, "name": "910B3"},
        1,
    )
    assert [labels["serial_number"] for labels, _ in mapped["npu_chip_info_serial_number"]] == ["SN5"]
    assert mapped["machine_npu_nums"] == [({"node": NODE}, 2)]
    # Only the chip one container holds has the container series, and without HBM of its own none of memory.
    assert mapped["container_npu_utilization"] == [(_chip_labels("5", ("train", "job-0", "main")), 100)]
    assert "container_npu_total_memory" not in mapped


def test_a_chip_held_alone_has_its_container_memory_shared_ones_none() -> None:
    shared = {"node": NODE, "namespace": "a,b", "pod": "p,q", "container": "c,c"}
    mapped = _mapped(
        _family(
            "ascend_agent_chip_info",
            _info("Ascend910-0", HELD),
            _info("Ascend310P-1", HELD, model="310P3"),
            _info("Ascend910-2", shared),
        ),
        _family(
            "ascend_agent_chip_hbm_used_bytes",
            (_of("Ascend910-0", HELD), 10 * 2**20),
            (_of("Ascend910-2", shared), 5 * 2**20),
        ),
        _family(
            "ascend_agent_chip_hbm_total_bytes",
            (_of("Ascend910-0", HELD), 64 * 2**20),
            (_of("Ascend910-2", shared), 64 * 2**20),
        ),
        _family(
            "ascend_agent_chip_memory_used_bytes",
            (_of("Ascend910-0", HELD), 1 * 2**20),
            (_of("Ascend310P-1", HELD), 3 * 2**20),
            (_of("Ascend910-2", shared), 0),
        ),
        _family(
            "ascend_agent_chip_memory_total_bytes",
            (_of("Ascend910-0", HELD), 2 * 2**20),
            (_of("Ascend310P-1", HELD), 4 * 2**20),
            (_of("Ascend910-2", shared), 0),
        ),
    )
    ddr = {labels["id"]: value for labels, value in mapped["npu_chip_info_total_memory"]}
    assert ddr == {"0": 2, "1": 4}, "npu-smi's 0 / 0 is no DDR memory"
    by_id = {labels["id"]: value for labels, value in mapped["container_npu_used_memory"]}
    assert by_id == {"0": 10, "1": 3}, "HBM where the chip has it, else its DDR memory; none for chip 2"
    assert {labels["id"]: value for labels, value in mapped["container_npu_total_memory"]} == {
        "0": 64,
        "1": 4,
    }
    multi = [labels for labels, _ in mapped["npu_chip_info_hbm_used_memory"] if labels["id"] == "2"]
    assert multi == [_chip_labels("2", ("not_displayed_for_multi_pod",) * 3)]


def test_ascend_950s_npu_util_is_npu_exporters_overall_utilisation() -> None:
    mapped = _mapped(
        _family("ascend_agent_chip_info", _info("npu-0", HELD, model="950PR")),
        _family("ascend_agent_chip_utilization_ratio", (_of("npu-0", HELD), 0.25)),
    )
    assert [value for _, value in mapped["npu_chip_info_overall_utilization"]] == [25]
    assert "npu_chip_info_utilization" not in mapped and "container_npu_utilization" not in mapped


def test_health_is_one_zero_and_minus_one_while_npu_smi_is_down() -> None:
    chips = _family(
        "ascend_agent_chip_info", _info("Ascend310P-0"), _info("Ascend310P-1"), _info("Ascend310P-2")
    )
    health = _family(
        "ascend_agent_device_health",
        (_of("Ascend310P-0", resource="huawei.com/Ascend310P"), 1),
        (_of("Ascend310P-1", resource="huawei.com/Ascend310P"), 0),
        (_of("Ascend310P-2c-100-2", resource="huawei.com/Ascend310P-2c"), 1),
    )
    mapped = _mapped(chips, health, _family("ascend_agent_npu_smi_down", ({"node": NODE}, 0)))
    assert [(labels["id"], value) for labels, value in mapped["npu_chip_info_health_status"]] == [
        ("0", 1),
        ("1", 0),
    ]
    counts = {name: mapped[name][0][1] for name in mapped if name.startswith("machine_")}
    assert counts == {
        "machine_npu_nums": 3,
        "machine_healthy_npu_nums": 1,
        "machine_unhealthy_npu_nums": 1,
        "machine_unknown_npu_nums": 1,
    }

    down = _mapped(chips, health, _family("ascend_agent_npu_smi_down", ({"node": NODE}, 1)))
    assert [value for _, value in down["npu_chip_info_health_status"]] == [-1, -1]
    assert down["machine_unknown_npu_nums"][0][1] == 3 and down["machine_healthy_npu_nums"][0][1] == 0


def test_error_codes_are_numbers_under_npu_exporters_ten_names() -> None:
    codes = [f"80E3A2{n:02X}" for n in range(12)]
    faults = [(_of("Ascend910-1", code=code, fault_class="RestartNPU"), 1.0) for code in codes]
    faults.insert(1, (_of("Ascend910-1", code="80E3A200", fault_class=""), 1.0))  # the same code once more
    faults.append((_of("Ascend910-1", code="scripted", fault_class=""), 1.0))
    mapped = _mapped(
        _family("ascend_agent_chip_info", _info("Ascend910-1")), _family("ascend_agent_chip_fault", *faults)
    )
    assert mapped["npu_chip_info_error_code"] == [(_chip_labels("1"), 0x80E3A200)]
    assert [mapped[f"npu_chip_info_error_code_{i}"][0][1] for i in range(1, 10)] == [
        int(code, 16) for code in codes[1:10]
    ]
    assert "npu_chip_info_error_code_10" not in mapped, "npu-exporter reports the first ten"


def test_link_and_net_health_become_npu_exporters_network_series() -> None:
    mapped = _mapped(
        _family("ascend_agent_chip_info", _info("Ascend910-0"), _info("Ascend910-1"), _info("Ascend910-2")),
        _family("ascend_agent_chip_link_up", (_of("Ascend910-0"), 1), (_of("Ascend910-1"), 0)),
        _family(
            "ascend_agent_chip_net_health_info",
            (_of("Ascend910-0", status="Success"), 1),
            (_of("Ascend910-1", status="Init"), 1),
            (_of("Ascend910-2", status="Receive timeout"), 1),
        ),
    )
    assert [(labels["id"], value) for labels, value in mapped["npu_chip_info_link_status"]] == [
        ("0", 1),
        ("1", 0),
    ]
    network = [(labels["id"], value) for labels, value in mapped["npu_chip_info_network_status"]]
    assert network == [("0", 1), ("1", 1), ("2", 0)]


def test_without_a_node_name_or_holders_the_labels_are_npu_exporters_alone() -> None:
    mapped = _mapped(
        _family("ascend_agent_chip_info", ({"device": "Ascend910-7", "model": "910B4", "bus_id": ""}, 1)),
        _family("ascend_agent_chip_temperature_celsius", ({"device": "Ascend910-7"}, 50)),
    )
    ((labels, value),) = mapped["npu_chip_info_temperature"]
    assert value == 50 and labels == {
        "id": "7",
        "model_name": "910B4",
        "vdie_id": "",
        "pcie_bus_info": "",
        "namespace": "",
        "pod_name": "",
        "container_name": "",
    }
    assert mapped["machine_npu_nums"] == [({}, 1)]


@pytest.fixture
def temperature() -> Iterator[None]:
    observability.CHIP_INFO.clear()
    observability.label_series_with_node("")  # as an agent made in this process left it
    observability.CHIP_INFO.labels(
        device="Ascend910-4",
        model="910B3",
        bus_id="0000:81:00.0",
        driver_version="",
        firmware_version="",
        serial="",
    ).set(1)
    observability.CHIP_TEMPERATURE.clear()  # what other tests in this process left in the registry
    observability.CHIP_TEMPERATURE.labels(device="Ascend910-4").set(44)
    try:
        yield
    finally:
        use_npu_exporter_names(False)
        observability.CHIP_TEMPERATURE.remove("Ascend910-4")
        observability.CHIP_INFO.clear()


@pytest.mark.usefixtures("temperature")
def test_metrics_show_the_names_only_while_switched_on() -> None:
    def exposed() -> dict[str, list[tuple[dict[str, str], float]]]:
        text = generate_latest(observability._EXPOSED).decode()
        return {
            f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)
        }

    off = exposed()
    assert "ascend_agent_chip_temperature_celsius" in off and "npu_chip_info_temperature" not in off
    use_npu_exporter_names(True)
    on = exposed()
    assert on["npu_chip_info_temperature"] == [
        (
            {
                "id": "4",
                "model_name": "910B3",
                "vdie_id": "",
                "pcie_bus_info": "0000:81:00.0",
                "namespace": "",
                "pod_name": "",
                "container_name": "",
            },
            44.0,
        )
    ]
    assert on["ascend_agent_chip_temperature_celsius"] == off["ascend_agent_chip_temperature_celsius"]
    use_npu_exporter_names(False)
    assert "npu_chip_info_temperature" not in exposed()


def test_every_name_made_is_in_the_metrics_reference() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(\w+)`", doc[doc.index("## Huawei npu-exporter names") :]))
    every = [
        _family(
            "ascend_agent_chip_info",
            _info("Ascend910-0", HELD, serial="S"),
            _info("npu-1", HELD, model="950PR"),
        ),
        *(
            _family(name, (_of("Ascend910-0", HELD), 1), (_of("npu-1", HELD), 1))
            for name in (
                "ascend_agent_chip_temperature_celsius",
                "ascend_agent_chip_power_watts",
                "ascend_agent_chip_utilization_ratio",
                "ascend_agent_chip_hbm_used_bytes",
                "ascend_agent_chip_hbm_total_bytes",
                "ascend_agent_chip_memory_used_bytes",
                "ascend_agent_chip_memory_total_bytes",
                "ascend_agent_device_health",
                "ascend_agent_chip_link_up",
            )
        ),
        _family("ascend_agent_chip_fault", *((_of("npu-1", code=f"8{n}"), 1) for n in range(10))),
        _family("ascend_agent_chip_net_health_info", (_of("npu-1", status="Init"), 1)),
    ]
    made = {re.sub(r"_code_\d$", "_code_X", name) for name in _mapped(*every)}
    assert len(made) == 22
    assert not made - documented, f"not in docs/metrics.md: {sorted(made - documented)}"
