"""The hand-over from the command line to the runner: the settings' sources arrive whole, ``-OO`` only where
its bytecode is installed, and a runner started by hand says what starts it."""

from __future__ import annotations

import importlib.util
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_agent import runner
from ascend_agent.config import SettingsSource

_VALUES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()


@given(
    overrides=st.dictionaries(st.text(min_size=1), _VALUES),
    config_file=st.none() | st.just(Path("/etc/ascend-agent/config.yaml")),
    from_environment=st.frozensets(st.text()),
)
def test_what_the_command_line_parsed_is_what_the_runner_loads(
    overrides: dict[str, object], config_file: Path | None, from_environment: frozenset[str]
) -> None:
    source = SettingsSource(overrides=overrides, config_file=config_file, from_environment=from_environment)
    assert runner.decode(runner.encode(source)) == source


def test_paths_travel_as_text_the_settings_take_back() -> None:
    source = SettingsSource(overrides={"kubelet_dir": Path("/var/lib/kubelet/device-plugins")})
    decoded = runner.decode(runner.encode(source))
    assert decoded.overrides == {"kubelet_dir": "/var/lib/kubelet/device-plugins"}
    assert decoded.load().kubelet_dir == source.load().kubelet_dir == Path("/var/lib/kubelet/device-plugins")


@pytest.fixture
def probe(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module standing in for the installed dependency whose bytecode says which level is compiled."""
    (short_dir / "bytecode_probe.py").write_text('"""A docstring -OO leaves out."""\n')
    monkeypatch.syspath_prepend(str(short_dir))
    monkeypatch.setattr(runner, "_BYTECODE_PROBE", "bytecode_probe")
    return short_dir / "bytecode_probe.py"


def test_without_the_OO_bytecode_the_runner_keeps_the_docstrings(probe: Path) -> None:
    py_compile.compile(str(probe), cfile=importlib.util.cache_from_source(str(probe)))  # level 0 only
    assert runner.interpreter_flags() == ["-P", "-X", "no_debug_ranges"]


def test_with_the_OO_bytecode_installed_the_runner_leaves_them_out(probe: Path) -> None:
    cached = importlib.util.cache_from_source(str(probe), optimization=2)
    py_compile.compile(str(probe), cfile=cached, optimize=2)
    assert runner.interpreter_flags() == ["-P", "-X", "no_debug_ranges", "-OO"]


def test_a_runner_started_by_hand_says_what_starts_it() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent.runner"], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == runner.EXIT_USAGE
    assert result.stderr == "ascend-agent: the runner is started by `ascend-agent run`, not by hand\n"


def test_flag_values_larger_than_a_pipe_holds_reach_the_runner_whole(short_dir: Path) -> None:
    """100 KB of one flag's value (a pipe holds 64 KiB, and nobody reads it before the exec) neither blocks
    the command line nor arrives cut: the runner refuses the whole name."""
    name = "b" * 100_000
    result = subprocess.run(
        [sys.executable, "-m", "ascend_agent", "run", "--backend", name, "--kubelet-dir", str(short_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == runner.EXIT_USAGE, result.stderr[-500:]
    assert f"unknown backend '{name}'" in result.stderr, result.stderr[-500:]
