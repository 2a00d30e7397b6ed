"""docs/metrics.md against the agent: every registered metric is documented with its type and labels; the
alert rules (charts/ascend-agent/files/alert-rules.yaml, which the doc includes) use documented metrics, group
by node and cover docs/troubleshooting.md's table of symptoms. promtool runs them: tests/prometheus/."""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

import yaml
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.metrics import MetricWrapperBase

import ascend_agent
from tests.support import ROOT

DOC = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
RULES = ROOT / "charts" / "ascend-agent" / "files" / "alert-rules.yaml"
README = (ROOT / "README.md").read_text(encoding="utf-8")
TROUBLESHOOTING = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")

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
    (group,) = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    rules: list[dict[str, Any]] = group["rules"]
    return rules


def test_the_doc_shows_the_charts_rules_file() -> None:
    """The doc site includes the rules file (pymdownx.snippets, paths from the repository's root), so the
    rules are written once."""
    section = DOC.split("\n## Alert rules\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block == f'--8<-- "{RULES.relative_to(ROOT)}"\n'


def _troubleshooting_symptoms() -> list[str]:
    section = TROUBLESHOOTING.split("\n## By symptom\n", 1)[1].split("\n## ", 1)[0]
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


def test_alerts_group_by_node() -> None:
    """By the agent's ``node`` label, never by the scrape's ``instance``: the agent pod's restart (a new
    instance) does not end an alert and raise it again."""
    for rule in _rules():
        groupings = re.findall(r"\b(by|on) \(([^)]*)\)", rule["expr"])
        assert groupings, f"{rule['alert']}: no by (node, ...)"
        for _, labels in groupings:
            assert "node" in labels.split(", ") and "instance" not in labels, (rule["alert"], labels)
