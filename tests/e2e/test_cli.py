"""The command line as a subprocess: list, version, and the exit-2 contract for bad usage or configuration."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
import typer

from ascend_agent.cli import app
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


def _option_rows(help_text: str) -> dict[str, str]:
    """Each option's row of ``--help``: its first name -> the row, whitespace collapsed."""
    rows: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in help_text.splitlines():
        starts = re.match(r"^  (--[\w-]+)", line)
        if starts:
            current = rows.setdefault(starts.group(1), [])
        elif not line.startswith("   "):
            current = None
        if current is not None:
            current.append(line)
    return {flag: " ".join(" ".join(lines).split()) for flag, lines in rows.items()}


@pytest.mark.parametrize("command", ["run", "list", "doctor"])
def test_help_shows_every_default_from_the_settings(command: str) -> None:
    result = cli(command, "--help", env={"COLUMNS": "400"})
    assert result.returncode == 0, result.stderr
    rows = _option_rows(result.stdout)
    defaults = Settings()
    options = [flag for flag in rows if flag not in ("--help", "--json")]
    assert "--config" in options and len(options) >= 8, rows
    for flag in options:
        name = flag.removeprefix("--").replace("-", "_")
        value = getattr(defaults, name, None)
        shown = re.search(r"\[default: ([^\]]+)\]", rows[flag])
        assert shown is not None, rows[flag]
        if value is not None:
            assert shown.group(1) == str(value), flag


def _every_option(command: str) -> list[click.Option]:
    group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    return [param for param in group.commands[command].params if isinstance(param, click.Option)]


# 80 columns, a pipe with no COLUMNS (what `| less`, a log or CI get), and a narrow terminal (click lays help
# out in 50 columns at least): COLUMNS, and the widest line allowed.
_WIDTHS = {"80 columns": ("80", 80), "no terminal": ("", 80), "40 columns": ("40", 50)}


@pytest.mark.parametrize("width", _WIDTHS)
@pytest.mark.parametrize("command", ["run", "list", "doctor", "ranktable", "kubelet-sim"])
def test_help_never_cuts_a_name_a_variable_or_a_default(command: str, width: str) -> None:
    columns, widest_allowed = _WIDTHS[width]
    result = cli(command, "--help", env={"COLUMNS": columns})
    assert result.returncode == 0, result.stderr
    assert "\u2026" not in result.stdout and "..." not in result.stdout, "nothing is cut"
    text = " ".join(result.stdout.split())
    for option in _every_option(command):
        for name in (*option.opts, *option.secondary_opts):
            assert re.search(rf"(^|\s){re.escape(name)}(\s|$)", result.stdout, re.MULTILINE), name
        if isinstance(option.envvar, str):
            assert f"[env var: {option.envvar}]" in text, option.envvar
        shown = re.search(r"\[default: [^\]]+\]", " ".join((option.help or "").split()))
        if shown:
            assert shown.group() in text, shown.group()
    widest = max(len(line) for line in result.stdout.splitlines())
    assert widest <= widest_allowed, f"a line of {widest} columns"


def test_run_help_lists_the_flags_by_group() -> None:
    result = cli("run", "--help", env={"COLUMNS": "80"})
    headings = re.findall(r"^(\S.*) options:$", result.stdout, re.MULTILINE)
    assert headings == [
        "General", "Kubelet", "Backend", "Health", "Cluster",
        "Volcano", "DRA", "vNPU", "Training", "Observability",
    ]  # fmt: skip
    sections = dict(
        zip(headings, re.split(r"^\S.* options:$", result.stdout, flags=re.MULTILINE)[1:], strict=True)
    )
    where = {
        flag: group for group, body in sections.items() for flag in _option_rows(body) if flag != "--help"
    }
    assert sorted(where) == sorted(option.opts[0] for option in _every_option("run")), (
        "each flag in one group"
    )
    for flag, group in {
        "--kubelet-dir": "Kubelet", "--backend": "Backend", "--fake-chips": "Backend",
        "--hot-reset": "Health", "--flap-threshold": "Health", "--kubeconfig": "Cluster",
        "--volcano": "Volcano", "--device-info": "Volcano", "--kubelet-api": "DRA",
        "--dra-driver-name": "DRA",
        "--dry-run-vnpu": "vNPU", "--hccn-tool": "Training", "--link-down-debounce": "Training",
        "--metrics-address": "Observability", "--log-level": "Observability", "--config": "General",
    }.items():  # fmt: skip
        assert where[flag] == group, flag


def test_version_flag() -> None:
    result = cli("--version")
    assert (result.returncode, result.stdout) == (0, cli("version").stdout)
    assert result.stdout.startswith("ascend-agent 0.")
    # ranktable's own --version (the table's) is another option.
    table = cli("ranktable", "--pod", "ns/pod", "--version", "9")
    assert table.returncode == 2 and "--version is 1.0 or 1.2" in table.stderr, table.stderr


def test_a_mistyped_command_is_named_once() -> None:
    result = cli("lst")
    assert result.returncode == 2
    assert result.stderr.count("Did you mean") == 1, result.stderr
    assert "No such command 'lst'. Did you mean 'list'?" in result.stderr
    assert "\u256d" not in result.stderr, "a line, not a box"
