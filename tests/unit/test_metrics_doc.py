"""docs/metrics.md against the agent: every registered metric is documented with its type and labels, and the
alert rules use documented metrics, cover the README's troubleshooting table and (with promtool) fire."""

from __future__ import annotations

import importlib
import pkgutil
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.metrics import MetricWrapperBase

import ascend_agent
from tests.support import ROOT

DOC = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")

_ROW = re.compile(r"^\| `(ascend_agent_\w+)` \| (\w+) \|([^|]*)\| (.+) \|$", re.MULTILINE)
_TYPES = {"counter", "gauge", "histogram"}


def _documented() -> dict[str, tuple[str, frozenset[str]]]:
    """Exposed name -> (type, labels), from the doc's table."""
    rows: dict[str, tuple[str, frozenset[str]]] = {}
    for name, kind, labels, _ in _ROW.findall(DOC):
        assert name not in rows, f"{name} is documented twice"
        rows[name] = (kind, frozenset(re.findall(r"`(\w+)`", labels)))
    return rows


def _registered() -> dict[str, tuple[str, frozenset[str]]]:
    """Exposed name -> (type, labels) of every metric the agent's modules define."""
    for module in pkgutil.walk_packages(ascend_agent.__path__, "ascend_agent."):
        if "._proto" not in module.name and not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    metrics: dict[str, tuple[str, frozenset[str]]] = {}
    for module_name, module in list(importlib.sys.modules.items()):  # type: ignore[attr-defined]
        if not module_name.startswith("ascend_agent"):
            continue
        for value in vars(module).values():
            if isinstance(value, MetricWrapperBase):
                kind: str = value._type
                name: str = value._name + {"counter": "_total", "info": "_info"}.get(kind, "")
                metrics[name] = ("gauge" if kind == "info" else kind, frozenset(value._labelnames))
    return metrics


def test_the_table_is_well_formed() -> None:
    rows = _documented()
    assert len(rows) >= 20
    for name, (kind, _) in rows.items():
        assert kind in _TYPES, name
        assert name.endswith("_total") == (kind == "counter"), (
            f"{name}: counters and only counters end in _total"
        )


def test_every_registered_metric_is_documented() -> None:
    registered, documented = _registered(), _documented()
    assert "ascend_agent_devices" in registered, "found none of the agent's metrics"
    exposed = set(
        re.findall(r"^# TYPE (ascend_agent_\w+) ", generate_latest(REGISTRY).decode(), re.MULTILINE)
    )
    assert set(registered) == exposed, "the names worked out here are not the exposed ones"
    missing = sorted(set(registered) - set(documented))
    assert not missing, f"not in docs/metrics.md: {missing}"
    for name, (kind, labels) in registered.items():
        assert documented[name] == (kind, labels), (
            f"{name}: the doc says {documented[name]}, the code {kind, labels}"
        )


def test_the_readme_links_the_reference() -> None:
    assert "(docs/metrics.md)" in README


def _rules() -> list[dict[str, Any]]:
    (block,) = re.findall(r"```yaml\n(.*?)```", DOC, re.DOTALL)
    (group,) = yaml.safe_load(block)["groups"]
    rules: list[dict[str, Any]] = group["rules"]
    return rules


def _troubleshooting_symptoms() -> list[str]:
    section = README.split("### Troubleshooting by symptom", 1)[1].split("\n### ", 1)[0]
    rows = [
        line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| symptom")
    ]
    return [row.split(" | ")[0].removeprefix("| ").replace("`", "") for row in rows]


def test_one_alert_per_troubleshooting_row() -> None:
    symptoms = _troubleshooting_symptoms()
    assert len(symptoms) >= 7
    assert sorted(rule["annotations"]["symptom"] for rule in _rules()) == sorted(symptoms)


def test_alerts_use_documented_metrics_and_say_what_to_do() -> None:
    documented = _documented()
    for rule in _rules():
        assert re.fullmatch(r"Ascend[A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert {"symptom", "summary", "description"} <= set(rule["annotations"])
        for metric in re.findall(r"ascend_agent_\w+", rule["expr"]):
            assert re.sub(r"_(bucket|sum|count)$", "", metric) in documented, (rule["alert"], metric)


# Each alert's failure as series (promtool's notation, one sample a minute), with the labels it fires with.
_N = 'instance="n1"'
_R = 'resource="huawei.com/Ascend910"'
_FIRING: dict[str, tuple[list[tuple[str, str]], dict[str, str], str]] = {
    "AscendNoHealthyChips": (
        [(f'ascend_agent_devices{{{_N},{_R},health="Healthy"}}', "0x20")],
        {"instance": "n1", "resource": "huawei.com/Ascend910"},
        "10m",
    ),
    "AscendNoChipsFound": (
        [(f'ascend_agent_build_info{{{_N},version="0.1.0"}}', "1x20")],
        {"instance": "n1", "version": "0.1.0"},
        "15m",
    ),
    "AscendNpuSmiMissing": (
        [(f'ascend_agent_npu_smi_failures_total{{{_N},reason="missing"}}', "1+1x20")],
        {"instance": "n1"},
        "10m",
    ),
    "AscendNpuSmiFailing": (
        [(f"ascend_agent_npu_smi_down{{{_N}}}", "1x20")],
        {"instance": "n1"},
        "10m",
    ),
    "AscendDriverNotVisible": (
        [(f'ascend_agent_npu_smi_failures_total{{{_N},reason="driver"}}', "1+1x20")],
        {"instance": "n1"},
        "10m",
    ),
    "AscendChipsBusy": (
        [(f'ascend_agent_npu_smi_failures_total{{{_N},reason="busy"}}', "1+1x40")],
        {"instance": "n1"},
        "30m",
    ),
    "AscendChipFaultCode": (
        [(f'ascend_agent_chip_fault{{{_N},device="Ascend910-3",code="80E3A203"}}', "1x20")],
        {"instance": "n1", "device": "Ascend910-3", "code": "80E3A203"},
        "5m",
    ),
    "AscendChipFlapping": (
        [(f'ascend_agent_chip_held{{{_N},device="Ascend910-3"}}', "1x20")],
        {"instance": "n1", "device": "Ascend910-3"},
        "5m",
    ),
    "AscendChipNetworkUnhealthy": (
        [(f'ascend_agent_chip_network_unhealthy{{{_N},device="Ascend910-3"}}', "1x20")],
        {"instance": "n1", "device": "Ascend910-3"},
        "5m",
    ),
    "AscendChipLeftToAPerson": (
        [(f'ascend_agent_resets_total{{{_N},result="hung"}}', "0+1x20")],
        {"instance": "n1"},
        "10m",
    ),
    "AscendChipUnhealthy": (
        [(f'ascend_agent_device_health{{{_N},{_R},device="Ascend910-3"}}', "0x20")],
        {"instance": "n1", "resource": "huawei.com/Ascend910", "device": "Ascend910-3"},
        "5m",
    ),
    "AscendAllocateRefused": (
        [(f'ascend_agent_allocations_total{{{_N},{_R},code="FAILED_PRECONDITION"}}', "0+1x20")],
        {"instance": "n1", "resource": "huawei.com/Ascend910", "code": "FAILED_PRECONDITION"},
        "10m",
    ),
    "AscendKubeletNotWatching": (
        [(f"ascend_agent_kubelet_stream_open{{{_N},{_R}}}", "0x20")],
        {"instance": "n1", "resource": "huawei.com/Ascend910"},
        "5m",
    ),
}

# A healthy node: eight healthy chips, npu-smi answering, Allocate succeeding, the kubelet watching.
_HEALTHY = [
    (f'ascend_agent_build_info{{{_N},version="0.1.0"}}', "1x20"),
    (f'ascend_agent_devices{{{_N},{_R},health="Healthy"}}', "8x20"),
    (f'ascend_agent_devices{{{_N},{_R},health="Unhealthy"}}', "0x20"),
    (f'ascend_agent_device_health{{{_N},{_R},device="Ascend910-3"}}', "1x20"),
    (f'ascend_agent_allocations_total{{{_N},{_R},code="OK"}}', "0+2x20"),
    (f"ascend_agent_kubelet_stream_open{{{_N},{_R}}}", "1x20"),
    (f'ascend_agent_chip_held{{{_N},device="Ascend910-3"}}', "0x20"),
    (f'ascend_agent_chip_network_unhealthy{{{_N},device="Ascend910-3"}}', "0x20"),
    (f"ascend_agent_npu_smi_down{{{_N}}}", "0x20"),
]


def _series(pairs: list[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"series": series, "values": values} for series, values in pairs]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) is not installed")
def test_each_alert_fires_on_its_failure_and_not_on_a_healthy_node(tmp_path: Path) -> None:
    rules = {rule["alert"]: rule for rule in _rules()}
    assert set(_FIRING) == set(rules)
    (block,) = re.findall(r"```yaml\n(.*?)```", DOC, re.DOTALL)
    (tmp_path / "rules.yaml").write_text(block, encoding="utf-8")
    tests = [
        {
            "interval": "1m",
            "input_series": _series(series),
            "alert_rule_test": [
                {
                    "eval_time": at,
                    "alertname": name,
                    "exp_alerts": [
                        {
                            "exp_labels": labels | rules[name]["labels"],
                            "exp_annotations": rules[name]["annotations"],
                        }
                    ],
                }
            ],
        }
        for name, (series, labels, at) in _FIRING.items()
    ]
    tests.append(
        {
            "interval": "1m",
            "input_series": _series(_HEALTHY),
            "alert_rule_test": [{"eval_time": "20m", "alertname": name, "exp_alerts": []} for name in rules],
        }
    )
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    result = subprocess.run(
        ["promtool", "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
