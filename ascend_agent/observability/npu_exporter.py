"""The chip series of /metrics also under the names, labels and units of Huawei's npu-exporter (MindCluster),
so that dashboards and alerts written for it keep working where the agent replaces it
(``npuExporterMetrics: true``; docs/metrics.md, "Huawei npu-exporter names")::

    use_npu_exporter_names(settings.npu_exporter_metrics)
    families = list(exposed)                   # the agent's families, node and holder labels on
    extra = list(npu_exporter_families(families)) if npu_exporter_names_on() else []

Every series is made from the agent's own at the time of the scrape: nothing is read twice. A per-chip series
carries npu-exporter's labels ``id`` (the physical chip id, as npu-exporter's), ``model_name``, ``vdie_id``,
``pcie_bus_info``, ``namespace``, ``pod_name``, ``container_name``, and ``node`` where the agent's do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

_on = False


def use_npu_exporter_names(on: bool) -> None:
    """From now on /metrics shows the npu-exporter names too (or no longer)."""
    global _on
    _on = on


def npu_exporter_names_on() -> bool:
    return _on


_MIB = 1024 * 1024
# npu-exporter writes all three holder labels so when several pods share a chip.
_SEVERAL_PODS = "not_displayed_for_multi_pod"
# The net health states npu-exporter counts as healthy (the driver's Init and Success).
_NET_HEALTHY = frozenset({"Success", "Init"})
# npu-exporter reports the first ten error codes: npu_chip_info_error_code, then _1 to _9.
_MOST_ERROR_CODES = 10
_CHIP_LABELS = ("id", "model_name", "vdie_id", "pcie_bus_info", "namespace", "pod_name", "container_name")


@dataclass(frozen=True, slots=True)
class _Chip:
    """What every per-chip series of npu-exporter is labelled with, from the agent's series of the device."""

    id: str
    model: str = ""
    bus_id: str = ""
    serial: str = ""
    node: str = ""
    holder: tuple[str, str, str] = ("", "", "")

    @property
    def held_alone(self) -> bool:
        """One container holds the chip: npu-exporter's ``container_npu_*`` series are given."""
        return bool(self.holder[2]) and self.holder[2] != _SEVERAL_PODS

    def labels(self, *, name_label: str = "model_name") -> dict[str, str]:
        labels = dict(zip(_CHIP_LABELS, (self.id, self.model, "", self.bus_id, *self.holder), strict=True))
        if name_label != "model_name":
            labels[name_label] = labels.pop("model_name")
        if self.node:
            labels["node"] = self.node
        return labels


class _Families:
    """The families made so far, by name, each with its samples' label names fixed by its first sample."""

    def __init__(self) -> None:
        self._made: dict[str, GaugeMetricFamily] = {}
        self._label_names: dict[str, list[str]] = {}

    def add(self, name: str, documentation: str, labels: Mapping[str, str], value: float) -> None:
        family = self._made.get(name)
        if family is None:
            self._label_names[name] = list(labels)
            family = self._made[name] = GaugeMetricFamily(name, documentation, labels=self._label_names[name])
        family.add_metric([labels.get(label, "") for label in self._label_names[name]], value)

    def __iter__(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._made.values())


def npu_exporter_families(families: Iterable[Metric]) -> Iterator[Metric]:
    """The npu-exporter families of the quantities in ``families`` (as /metrics shows them): each series
    the agent has a counterpart of, converted to npu-exporter's unit."""
    by_name = {family.name: family for family in families}
    node = next((s.labels["node"] for f in by_name.values() for s in f.samples if "node" in s.labels), "")
    on_node = {"node": node} if node else {}
    chips = _chips(by_name)
    made = _Families()
    _telemetry(by_name, chips, made)
    _health(by_name, chips, made, on_node)
    _error_codes(by_name, chips, made)
    _network(by_name, chips, made)
    for chip in chips.values():
        made.add(
            "npu_chip_info_name",
            "The chip's model (ascend_agent_chip_info); always 1.",
            chip.labels(name_label="name"),
            1,
        )
        if chip.serial:
            made.add(
                "npu_chip_info_serial_number",
                "The chip's serial number (ascend_agent_chip_info); always 1.",
                {**chip.labels(), "serial_number": chip.serial},
                1,
            )
    made.add("machine_npu_nums", "Chips on the node (ascend_agent_chip_info).", on_node, len(chips))
    yield from made


def _samples(by_name: Mapping[str, Metric], name: str) -> list[tuple[dict[str, str], float]]:
    family = by_name.get(name)
    return [] if family is None else [(dict(s.labels), s.value) for s in family.samples]


def _holder(labels: Mapping[str, str]) -> tuple[str, str, str]:
    holder = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""))
    return (_SEVERAL_PODS,) * 3 if any("," in value for value in holder) else holder


def _chip(chips: Mapping[str, _Chip], labels: Mapping[str, str]) -> _Chip:
    """The chip of a sample of the agent's; one not (yet) in ascend_agent_chip_info gets the labels its own
    sample has. A chip's device ID ends in its physical id: ``Ascend910-3``."""
    device = labels["device"]
    return chips.get(device) or _Chip(
        id=device.rpartition("-")[2], node=labels.get("node", ""), holder=_holder(labels)
    )


def _chips(by_name: Mapping[str, Metric]) -> dict[str, _Chip]:
    """Every chip of ascend_agent_chip_info by device ID, with the holder labels /metrics gives it."""
    chips: dict[str, _Chip] = {}
    for labels, _ in _samples(by_name, "ascend_agent_chip_info"):
        chips[labels["device"]] = replace(
            _chip({}, labels),
            model=labels.get("model", ""),
            bus_id=labels.get("bus_id", "").upper(),  # npu-exporter writes the hex digits upper case
            serial=labels.get("serial", ""),
        )
    return chips


# The agent's series npu-exporter has under another name, in the same unit: (ours, theirs, help).
_SAME_UNIT = (
    ("ascend_agent_chip_temperature_celsius", "npu_chip_info_temperature", "Chip temperature in °C"),
    ("ascend_agent_chip_power_watts", "npu_chip_info_power", "Chip power in W"),
    ("ascend_agent_chip_link_up", "npu_chip_info_link_status", "1 UP, 0 DOWN"),
)


def _copies(by_name: Mapping[str, Metric], chips: Mapping[str, _Chip], made: _Families) -> None:
    for ours, theirs, meaning in _SAME_UNIT:
        for labels, value in _samples(by_name, ours):
            made.add(theirs, f"{meaning} ({ours}).", _chip(chips, labels).labels(), value)


def _telemetry(by_name: Mapping[str, Metric], chips: Mapping[str, _Chip], made: _Families) -> None:
    _copies(by_name, chips, made)
    for labels, ratio in _samples(by_name, "ascend_agent_chip_utilization_ratio"):
        chip, percent = _chip(chips, labels), round(ratio * 100, 6)
        # On Ascend 950 npu-smi prints NPU Util, the whole chip's: npu-exporter's overall utilisation.
        overall = chip.model.startswith("950")
        name = "npu_chip_info_overall_utilization" if overall else "npu_chip_info_utilization"
        made.add(
            name,
            "Chip utilisation in % (ascend_agent_chip_utilization_ratio times 100).",
            chip.labels(),
            percent,
        )
        if chip.held_alone and not overall:
            made.add(
                "container_npu_utilization",
                "AICore utilisation in % of the chip a container holds alone.",
                chip.labels(),
                percent,
            )
    # A DDR size of 0 (npu-smi's "0 / 0" on 910B, A3) is no DDR memory: npu-exporter gives no DDR series then.
    no_ddr = {
        labels["device"]
        for labels, size in _samples(by_name, "ascend_agent_chip_memory_total_bytes")
        if not size
    }
    in_container: dict[str, tuple[_Chip, dict[str, float]]] = {}
    for ours, theirs in _MEMORY.items():
        for labels, size in _samples(by_name, ours):
            if "_hbm_" not in ours and labels["device"] in no_ddr:
                continue
            chip, megabytes = _chip(chips, labels), size / _MIB
            made.add(theirs, f"{ours} in MB (MiB, as npu-smi prints it).", chip.labels(), megabytes)
            if chip.held_alone:
                in_container.setdefault(labels["device"], (chip, {}))[1][theirs] = megabytes
    # npu-exporter's container memory is the HBM's on chips with HBM, else the DDR memory's.
    for chip, sizes in in_container.values():
        prefix = "npu_chip_info_hbm_" if "npu_chip_info_hbm_total_memory" in sizes else "npu_chip_info_"
        for part in ("total", "used"):
            megabytes_held = sizes.get(f"{prefix}{part}_memory")
            if megabytes_held is not None:
                made.add(
                    f"container_npu_{part}_memory",
                    f"Memory ({part}) in MB of the chip a container holds alone: HBM, else DDR.",
                    chip.labels(),
                    megabytes_held,
                )


_MEMORY = {
    "ascend_agent_chip_hbm_used_bytes": "npu_chip_info_hbm_used_memory",
    "ascend_agent_chip_hbm_total_bytes": "npu_chip_info_hbm_total_memory",
    "ascend_agent_chip_memory_used_bytes": "npu_chip_info_used_memory",
    "ascend_agent_chip_memory_total_bytes": "npu_chip_info_total_memory",
}


def _health(
    by_name: Mapping[str, Metric], chips: Mapping[str, _Chip], made: _Families, on_node: Mapping[str, str]
) -> None:
    """npu-exporter's health: 1 Healthy, 0 Unhealthy, -1 unknown (while npu-smi is down); and the counts."""
    down = any(value == 1 for _, value in _samples(by_name, "ascend_agent_npu_smi_down"))
    health: dict[str, float] = {}
    for labels, healthy in _samples(by_name, "ascend_agent_device_health"):
        if labels["device"] in chips:  # a vNPU's is not a chip's
            health[labels["device"]] = -1 if down else healthy
    for device, value in health.items():
        made.add(
            "npu_chip_info_health_status",
            "1 Healthy, 0 Unhealthy, -1 unknown "
            "(ascend_agent_device_health; -1 while ascend_agent_npu_smi_down is 1).",
            chips[device].labels(),
            value,
        )
    healthy = sum(value == 1 for value in health.values())
    unhealthy = sum(value == 0 for value in health.values())
    made.add("machine_healthy_npu_nums", "Healthy chips on the node.", on_node, healthy)
    made.add("machine_unhealthy_npu_nums", "Unhealthy chips on the node.", on_node, unhealthy)
    made.add(
        "machine_unknown_npu_nums",
        "Chips whose health is unknown.",
        on_node,
        len(chips) - healthy - unhealthy,
    )


def _error_codes(by_name: Mapping[str, Metric], chips: Mapping[str, _Chip], made: _Families) -> None:
    """Each chip's first ten error codes, in the order npu-smi lists them, as numbers."""
    listed: dict[str, tuple[_Chip, list[int]]] = {}
    for labels, _ in _samples(by_name, "ascend_agent_chip_fault"):
        chip, codes = listed.setdefault(labels["device"], (_chip(chips, labels), []))
        try:
            code = int(labels["code"], 16)
        except ValueError:  # not a driver's code: npu-exporter has no number for it
            continue
        if code not in codes:
            codes.append(code)
    for chip, codes in listed.values():
        for index, code in enumerate(codes[:_MOST_ERROR_CODES]):
            made.add(
                "npu_chip_info_error_code" + (f"_{index}" if index else ""),
                "An error code the chip reports, as a number (ascend_agent_chip_fault's code, hex).",
                chip.labels(),
                code,
            )


def _network(by_name: Mapping[str, Metric], chips: Mapping[str, _Chip], made: _Families) -> None:
    for labels, _ in _samples(by_name, "ascend_agent_chip_net_health_info"):
        made.add(
            "npu_chip_info_network_status",
            "1 while the net health is Success or Init, else 0 (ascend_agent_chip_net_health_info).",
            _chip(chips, labels).labels(),
            1 if labels.get("status") in _NET_HEALTHY else 0,
        )
