"""docs/migration.md, the guide to replacing Huawei's device plugin, against what the agent really has: every
flag of Huawei's plugin is in its table once, and every flag, setting and mode it names here exists."""

from __future__ import annotations

import re

import click
import typer

from ascend_agent.cli import app
from ascend_agent.config import MODES, file_schema
from tests.support import ROOT

GUIDE = ROOT / "docs" / "migration.md"
README = ROOT / "README.md"
# Huawei's plugin's flags: MindCluster component/ascend-device-plugin/main.go (2026-08-21), the health
# endpoint's flags it registers (ascend-common healthz.RegisterFlags), -softShareCoreScaling of later sources
# and -useAscendDocker of earlier ones.
HUAWEI_FLAGS = {
    "-fdFlag", "-volcanoType", "-version", "-edgeLogFile", "-listWatchPeriod", "-autoStowing", "-logLevel",
    "-maxAge", "-logFile", "-maxBackups", "-presetVirtualDevice", "-use310PMixedInsert", "-hotReset",
    "-shareDevCount", "-linkdownTimeout", "-dealWatchHandler", "-checkCachedPods", "-enableSlowNode",
    "-thirdPartyScanDelay", "-deviceResetTimeout", "-softShareDevConfigDir", "-softShareCoreScaling",
    "-useSingleDieMode", "-getPodFromKubelet", "--enable-healthz", "--healthz-address", "--tls-cert-file",
    "--tls-private-key-file", "-useAscendDocker",
}  # fmt: skip


def _table() -> list[tuple[str, str]]:
    """The rows of the flags' table: (Huawei's column, ours)."""
    section = GUIDE.read_text(encoding="utf-8").split("## Huawei's flags", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    cells = [[cell.strip() for cell in row.strip()[1:-1].split(" | ")] for row in rows]
    assert all(len(row) == 2 for row in cells), [row for row in cells if len(row) != 2]
    return [(theirs, ours) for theirs, ours in cells]


def _run_options() -> set[str]:
    group = typer.main.get_command(app)
    assert isinstance(group, click.Group)
    names = {"--version"}  # the command line's own: ascend-agent --version
    for param in group.commands["run"].params:
        if isinstance(param, click.Option):
            names.update(param.opts, param.secondary_opts)
    return names


def test_every_flag_of_huaweis_plugin_is_in_the_table_once() -> None:
    named = [flag for theirs, _ in _table() for flag in re.findall(r"`(--?[A-Za-z][\w-]*)`", theirs)]
    assert sorted(named) == sorted(HUAWEI_FLAGS)


def test_every_flag_and_setting_the_table_names_exists() -> None:
    options, settings = _run_options(), set(file_schema()["properties"])
    for theirs, ours in _table():
        named = re.findall(r"`(?:ascend-agent )?(--[a-z][\w-]*)", ours)
        keys = re.findall(r"`([a-z][A-Za-z]+):", ours)
        assert named or keys or "no equivalent" in ours, theirs
        for flag in named:
            assert flag in options, f"{theirs}: {flag} is no flag of ascend-agent run"
        for key in keys:
            assert key in settings, f"{theirs}: {key} is no setting"


def test_the_modes_it_names_are_the_agents() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split("## Which mode", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ")][1:]
    named = {match.group(1) for row in rows if (match := re.match(r"`([a-z-]+)`", row[1]))}
    assert named == set(MODES)


def test_the_guide_has_its_parts_and_the_readme_points_at_it() -> None:
    headings = re.findall(r"^## (.+)$", GUIDE.read_text(encoding="utf-8"), re.MULTILINE)
    for part in ("Before the cut-over", "Which mode", "The cut-over", "What running pods keep", "Going back"):
        assert any(heading.startswith(part) for heading in headings), part
    readme = README.read_text(encoding="utf-8")
    assert "(docs/migration.md)" in readme
    # The README once said hot reset and vNPUs were not supported, beside the sections that describe them.
    for line in readme.splitlines():
        assert not ("not supported" in line and ("-hotReset" in line or "-presetVirtualDevice" in line)), line
