"""The Makefile's interpreter check: an old or missing Python stops with one line, before .venv exists.

The old interpreter is this one with ``sys.version_info`` replaced, so what the Makefile runs is real Python
reporting 3.10.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support import ROOT

_OLD_PYTHON = """#!/bin/sh
exec {python} -c 'import sys; sys.version_info = (3, 10, 12, "final", 0); exec(sys.argv[1])' "$2"
"""


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    # A parent make (`make test`) passes its flags down; this make must see only ours.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(
        ["make", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def _old_python(directory: Path) -> Path:
    script = directory / "python3.10"
    script.write_text(_OLD_PYTHON.format(python=sys.executable), encoding="utf-8")
    script.chmod(0o755)
    return script


def _minimum() -> str:
    match = re.search(r"^PYTHON_MIN := (\S+)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)
    assert match, "the Makefile names no PYTHON_MIN"
    return match.group(1)


def test_the_fake_interpreter_reports_3_10(tmp_path: Path) -> None:
    code = "import sys; print(sys.version_info[:2])"
    result = subprocess.run([_old_python(tmp_path), "-c", code], capture_output=True, text=True, timeout=30)
    assert result.stdout.strip() == "(3, 10)"


def test_an_old_python_stops_with_one_line_before_the_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python = _old_python(tmp_path)
    for target in ("install", "test", "run"):
        result = _make(target, f"VENV={venv}", f"PYTHON={python}")
        assert result.returncode != 0, target
        (line,) = result.stderr.splitlines()
        assert "needs Python 3.11 or newer" in line
        assert f"{python} is 3.10.12" in line
        assert "make PYTHON=python3.11" in line
        assert result.stdout == ""
        assert not venv.exists(), f"make {target} created the venv"


def test_a_missing_python_says_so(tmp_path: Path) -> None:
    result = _make("install", f"VENV={tmp_path / 'venv'}", f"PYTHON={tmp_path / 'no-such-python'}")
    assert result.returncode != 0
    (line,) = result.stderr.splitlines()
    assert "no-such-python is not found" in line and "make PYTHON=python3.11" in line


def test_a_new_enough_python_goes_on_to_make_the_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    result = _make("-n", "install", f"VENV={venv}", f"PYTHON={sys.executable}")
    assert result.returncode == 0, result.stderr
    assert f"{sys.executable} -m venv --clear {venv}" in result.stdout.splitlines()


def test_targets_without_python_do_not_check_it(tmp_path: Path) -> None:
    result = _make("-n", "clean", f"PYTHON={_old_python(tmp_path)}")
    assert result.returncode == 0, result.stderr
    assert "rm -rf" in result.stdout


def test_the_minimum_is_pyprojects() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["requires-python"] == f">={_minimum()}"


def test_helm_lint_without_python_3_12_stops_with_one_line(tmp_path: Path) -> None:
    """helm-sdkpy needs Python 3.12: an older HELM_PYTHON, or none found, is one line before .venv-helm."""
    venv = tmp_path / "venv-helm"
    old = _old_python(tmp_path)
    for python, says in ((str(old), f"but {old} is not"), ("", "but none is on PATH or under pyenv")):
        result = _make("helm-lint", f"HELM_VENV={venv}", f"HELM_PYTHON={python}")
        assert result.returncode != 0
        (line,) = result.stderr.splitlines()
        assert "make helm-lint needs Python 3.12 or newer for helm-sdkpy" in line and says in line, line
        assert "HELM_PYTHON=/path/to/python3.12" in line
        assert not venv.exists()


def test_helm_lint_takes_a_python_3_12(tmp_path: Path) -> None:
    python = tmp_path / "python3.12"
    script = _OLD_PYTHON.format(python=sys.executable).replace("(3, 10, 12,", "(3, 12, 1,")
    python.write_text(script, encoding="utf-8")
    python.chmod(0o755)
    venv = tmp_path / "venv-helm"
    result = _make("-n", "helm-lint", f"HELM_VENV={venv}", f"HELM_PYTHON={python}")
    assert result.returncode == 0, result.stderr
    assert f"{python} -m venv --clear {venv}" in result.stdout.splitlines()
    assert f"{venv}/bin/python charts/check.py lint" in result.stdout.splitlines()


def test_make_run_installs_only_what_running_needs(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    result = _make("-n", "run", f"VENV={venv}", f"PYTHON={sys.executable}")
    assert result.returncode == 0, result.stderr
    installs = [line for line in result.stdout.splitlines() if "pip install" in line]
    assert installs == [f"{venv}/bin/pip install --quiet --disable-pip-version-check -e ."]
    assert f"{venv}/.installed-stamp" not in result.stdout, "make run must not need the test tools"
