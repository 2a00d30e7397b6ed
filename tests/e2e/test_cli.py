"""The command line as a subprocess: list, version, and the exit-2 contract for bad usage or configuration."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ascend_agent.config import Settings
from tests.support.cli import run_cli

cli = run_cli


def test_version() -> None:
    result = cli("version")
    assert result.returncode == 0
    assert result.stdout.startswith("ascend-agent 0.")


def test_list_json_fake(short_dir: Path) -> None:
    state = short_dir / "state.json"
    state.write_text('{"unhealthy": [1], "absent": [2]}')
    result = cli(
        "list",
        "--backend",
        "fake",
        "--fake-chips",
        "4",
        "--fake-model",
        "310P3",
        "--fake-state",
        str(state),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [row["id"] for row in rows] == ["Ascend310P-0", "Ascend310P-1", "Ascend310P-2", "Ascend310P-3"]
    assert [row["health"] for row in rows] == ["Healthy", "Unhealthy", "Unhealthy", "Healthy"]
    assert {row["resource"] for row in rows} == {"huawei.com/Ascend310P"}
    assert rows[2]["device"] == "/dev/davinci2"
    assert rows[2]["phys_id"] == 2
    assert rows[0]["model"] == "310P3"
    assert "absent" in rows[2]["reason"]


def test_list_text_names_the_columns() -> None:
    result = cli("list", "--backend", "fake", "--fake-chips", "2")
    assert result.returncode == 0
    header, first, _ = result.stdout.splitlines()
    assert header.split()[:3] == ["id", "model", "health"]
    assert first.split()[:3] == ["Ascend910-0", "910B4", "Healthy"]


def test_settings_precedence_flag_over_env_over_file(short_dir: Path) -> None:
    config = short_dir / "config.yaml"
    config.write_text("backend: fake\nfakeChips: 3\nfakeModel: 310P3\n")
    from_file = json.loads(cli("list", "--config", str(config), "--json").stdout)
    assert len(from_file) == 3 and from_file[0]["model"] == "310P3"
    env = {"ASCEND_AGENT_FAKE_CHIPS": "5"}
    from_env = json.loads(cli("list", "--config", str(config), "--json", env=env).stdout)
    assert len(from_env) == 5
    from_flag = json.loads(
        cli("list", "--config", str(config), "--fake-chips", "2", "--json", env=env).stdout
    )
    assert len(from_flag) == 2
    config_env = {"ASCEND_AGENT_CONFIG": str(config)}
    assert len(json.loads(cli("list", "--json", env=config_env).stdout)) == 3


@pytest.mark.parametrize(
    ("files", "args", "message"),
    [
        ({}, ["run", "--backend", "nope"], "unknown backend 'nope'"),
        ({}, ["run", "--config", "{dir}/missing.yaml"], "cannot read config file"),
        ({"bad.yaml": "backend: [fake\n"}, ["run", "--config", "{dir}/bad.yaml"], "is not valid YAML"),
        (
            {"keys.yaml": "fakeChipz: 3\n"},
            ["run", "--config", "{dir}/keys.yaml"],
            "unknown setting 'fakeChipz' (did you mean fakeChips?)",
        ),
        ({"type.yaml": "fakeChips: many\n"}, ["run", "--config", "{dir}/type.yaml"], "fakeChips must be"),
        (
            {"twice.yaml": "fakeChips: 2\nfakeChips: 3\n"},
            ["run", "--config", "{dir}/twice.yaml"],
            "fakeChips is given twice (lines 1 and 2)",
        ),
        ({"list.yaml": "- a\n"}, ["run", "--config", "{dir}/list.yaml"], "must be a mapping"),
        ({"s.json": "{nope"}, ["run", "--backend", "fake", "--fake-state", "{dir}/s.json"], "not valid JSON"),
        (
            {"s.json": '{"sick": [1]}'},
            ["run", "--backend", "fake", "--fake-state", "{dir}/s.json"],
            "unknown key",
        ),
        ({}, ["run", "--backend", "fake", "--fake-model", "H100"], "--fake-model 'H100'"),
        ({}, ["run", "--fake-chips", "0"], "--fake-chips must be"),
        ({}, ["run", "--mode", "magic"], "--mode must be one of"),
        ({}, ["run", "--metrics-address", "nowhere"], "--metrics-address"),
        ({}, ["run", "--fake-chips", "x"], "Invalid value"),
        ({}, ["run", "--no-such-flag"], "No such option"),
    ],
)
def test_bad_usage_or_configuration_exits_2_with_one_line(
    short_dir: Path, files: dict[str, str], args: list[str], message: str
) -> None:
    for name, text in files.items():
        (short_dir / name).write_text(text)
    result = cli(
        *[arg.replace("{dir}", str(short_dir)) for arg in args], "--kubelet-dir", str(short_dir / "k")
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    if not message.startswith(("Invalid", "No such")):
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert result.stderr.startswith("ascend-agent: ")


@pytest.mark.parametrize("command", ["run", "list", "doctor", "kubelet-sim", "version"])
def test_help_of_every_command(command: str) -> None:
    result = cli(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout


@pytest.mark.parametrize("command", ["run", "list", "doctor"])
def test_help_shows_every_default_from_the_settings(command: str) -> None:
    result = cli(command, "--help", env={"COLUMNS": "400"})
    assert result.returncode == 0, result.stderr
    lines = {line.split()[1]: line for line in result.stdout.splitlines() if line.startswith("│ --")}
    defaults = Settings()
    options = [flag for flag in lines if flag not in ("--help", "--json")]
    assert "--config" in options and len(options) >= 8, lines
    for flag in options:
        name = flag.removeprefix("--").replace("-", "_")
        value = getattr(defaults, name, None)
        shown = re.search(r"\[default: ([^\]]+)\]", lines[flag])
        assert shown is not None, lines[flag]
        if value is not None:
            assert shown.group(1) == str(value), flag
