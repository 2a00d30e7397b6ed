"""charts/ascend-agent/files/alert-rules.yaml through Prometheus' own promtool: the rules parse (and a rule
that does not is refused), and in tests/prometheus/alert-rules.test.yaml each alert fires on the failure it
names and none on a healthy node."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.prometheus.tools import tool
from tests.support import ROOT

RULES = ROOT / "charts" / "ascend-agent" / "files" / "alert-rules.yaml"
UNIT_TESTS = ROOT / "tests" / "prometheus" / "alert-rules.test.yaml"
HEALTHY = "healthy node"


def _promtool(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _alerts() -> dict[str, dict[str, Any]]:
    (group,) = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return {rule["alert"]: rule for rule in group["rules"]}


def test_the_rules_parse() -> None:
    result = _promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_a_rule_whose_expression_does_not_parse_is_refused(tmp_path: Path) -> None:
    text = RULES.read_text(encoding="utf-8")
    good = "max by (node) (ascend_agent_npu_smi_down) == 1"
    assert good in text
    broken = tmp_path / "alert-rules.yaml"
    broken.write_text(text.replace(good, "max by (node) (ascend_agent_npu_smi_down == 1"), encoding="utf-8")
    result = _promtool("check", "rules", broken)
    assert result.returncode != 0
    assert "AscendNpuSmiFailing" in result.stdout + result.stderr, result.stdout + result.stderr


def test_each_alert_fires_on_its_failure_and_none_on_a_healthy_node(tmp_path: Path) -> None:
    alerts = _alerts()
    spec = yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))
    cases = {case["name"]: case for case in spec["tests"]}
    assert set(cases) == {*alerts, HEALTHY}, "one case per alert, and the healthy node"
    quiet = cases.pop(HEALTHY)["alert_rule_test"]
    assert sorted(check["alertname"] for check in quiet) == sorted(alerts)
    assert all(check["exp_alerts"] == [] for check in quiet)
    for name, case in cases.items():
        firing = [check for check in case["alert_rule_test"] if check["exp_alerts"]]
        assert firing and {check["alertname"] for check in case["alert_rule_test"]} == {name}, name
        for check in firing:
            for expected in check["exp_alerts"]:
                assert expected["exp_labels"]["severity"] == alerts[name]["labels"]["severity"], name
                expected["exp_annotations"] = alerts[name]["annotations"]
    spec["rule_files"] = [str(RULES)]
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    result = _promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout
