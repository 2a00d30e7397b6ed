"""The node summary ``kubectl ascend`` reads: made from an inventory, written, read back; and what the plugin
prints of it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from ascend_agent.faultclass import FaultClass
from ascend_agent.kubectl_plugin import render
from ascend_agent.model import Chip, Fault, Health, Holder, Inventory
from ascend_agent.node_summary import (
    DATA_KEY,
    RENEW_SECONDS,
    NodeSummary,
    SummaryError,
    configmap_name,
    stamped,
    summary_document,
)

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC).timestamp()


def _inventory() -> Inventory:
    fault = Fault("80E3A203", fault_class=FaultClass.RESTART_NPU)
    sick = Chip.make(3, "910B4", faults=(fault,), fault_class=FaultClass.RESTART_NPU)
    sick = sick.with_health(Health.UNHEALTHY, "RestartNPU: error code 80E3A203")
    chips = [Chip.make(n, "910B4") for n in range(3)] + [sick]
    chips[1] = Chip.make(1, "910B4", held=True).with_health(Health.UNHEALTHY, "held")
    return Inventory(chips=tuple(chips))


def _holders(chip: Chip) -> list[Holder]:
    return [Holder("team-a", "train-0", "main", "npu")] if chip.phys_id == 2 else []


def _written(now: float = NOW) -> NodeSummary:
    document = summary_document(_inventory(), _holders, (True, ""), "dra")
    return NodeSummary.parse({DATA_KEY: stamped(document, "n1", now)}, "kube-system/x")


def test_a_summary_reads_back_as_written() -> None:
    summary = _written()
    assert (summary.node, summary.mode, summary.ready) == ("n1", "dra", True)
    assert summary.updated.timestamp() == NOW
    by_id = {chip.id: chip for chip in summary.chips}
    assert by_id["Ascend910-2"].used_by == ("team-a/train-0 (claim npu)",)
    assert by_id["Ascend910-1"].flap_held and not by_id["Ascend910-1"].healthy
    assert by_id["Ascend910-3"].fault_class == "RestartNPU"


def test_the_document_compares_equal_while_nothing_changed() -> None:
    """The write time is added at the write: an unchanged inventory is no new summary to write."""
    first = summary_document(_inventory(), _holders, (True, ""), "device-plugin")
    assert first == summary_document(_inventory(), _holders, (True, ""), "device-plugin")
    assert first != summary_document(_inventory(), _holders, (False, "kubelet gone"), "device-plugin")


def test_the_views_count_chips_in_use_and_free() -> None:
    text = render([_written()], "table", unhealthy=False, now=NOW + 30)
    assert "4 chips on 1 node: 2 healthy, 1 in use, 1 free" in text
    assert "Ascend910-1, Ascend910-3 (RestartNPU)" in text and "30s ago" in text
    wide = render([_written()], "wide", unhealthy=True, now=NOW).splitlines()
    assert [line.split()[1] for line in wide[1:] if line.startswith("n1")] == ["Ascend910-1", "Ascend910-3"]
    shown = json.loads(render([_written()], "json", unhealthy=False, now=NOW))
    assert shown["totals"] == {"nodes": 1, "chips": 4, "healthy": 2, "inUse": 1, "free": 1}


def test_a_summary_past_twice_its_renewal_is_stale_and_says_how_old() -> None:
    summary = _written()
    assert not summary.stale(NOW + 2 * RENEW_SECONDS)
    later = NOW + 2 * RENEW_SECONDS + 1
    assert summary.stale(later)
    assert "n1: summary last written 30m ago" in render([summary], "table", unhealthy=False, now=later)


def test_long_node_names_still_make_a_valid_object_name() -> None:
    names = {configmap_name("a" * 240 + suffix) for suffix in ("x" * 13, "y" * 13)}
    assert len(names) == 2 and all(len(name) <= 253 for name in names)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(_JSON)
def test_any_json_is_a_summary_or_one_clear_error(value: object) -> None:
    try:
        NodeSummary.parse({DATA_KEY: json.dumps(value)}, "kube-system/x")
    except SummaryError as exc:
        assert str(exc).startswith("kube-system/x: summary.json is not a node summary")


def test_a_chip_whose_vnpu_a_pod_uses_is_in_use_not_free() -> None:
    chip = {"id": "Ascend310P-1", "model": "310P3", "health": "Healthy", "usedBy": []}
    part = {**chip, "id": "Ascend310P-2c-101-1", "chip": "Ascend310P-1", "template": "vir02",
            "usedBy": [{"namespace": "a", "pod": "p"}]}  # fmt: skip
    raw = {"node": "n1", "updated": "2026-12-07T12:00:00Z", "agent": {"version": "0.1.0", "ready": True},
           "chips": [chip, {**chip, "id": "Ascend310P-2"}], "vnpus": [part]}  # fmt: skip
    summary = NodeSummary.parse({DATA_KEY: json.dumps(raw)}, "kube-system/x")
    assert "2 chips on 1 node: 2 healthy, 1 in use, 1 free" in render([summary], "table", False, NOW)
    wide = render([summary], "wide", unhealthy=False, now=NOW)
    assert "Ascend310P-2c-101-1 (vir02 of Ascend310P-1)" in wide and "a/p" in wide
