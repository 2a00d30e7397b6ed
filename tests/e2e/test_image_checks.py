"""The checks `make image-test` runs inside the image (tests/image/in-image.sh), run here against this
tree's agent: when make image-test fails, the image is at fault, not the script."""

from __future__ import annotations

import compileall
import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

IN_IMAGE = ROOT / "tests" / "image" / "in-image.sh"


def _with_agent(directory: Path, script: str) -> dict[str, str]:
    """The environment with an ``ascend-agent`` first on PATH: runs ``script`` (sh), then this agent."""
    agent = directory / "ascend-agent"
    agent.write_text(f'#!/bin/sh\n{script}\nexec {sys.executable} -m ascend_agent "$@"\n', encoding="utf-8")
    agent.chmod(0o755)
    return {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}"}


def _in_image(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # As the image is built: the package's bytecode, at both levels, beside its source.
    for tree in (ROOT / "ascend_agent", ROOT / "backends"):
        compileall.compile_dir(tree, quiet=1, optimize=[0, 2])
    return subprocess.run(
        ["sh", str(IN_IMAGE)], env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )


def test_the_checks_pass_against_this_tree(tmp_path: Path) -> None:
    result = _in_image(_with_agent(tmp_path, ""))
    assert result.returncode == 0, result.stderr + result.stdout
    assert "Registered resource huawei.com/Ascend910" in result.stdout
    assert "ListAndWatch huawei.com/Ascend910: 8 devices, 8 healthy" in result.stdout
    assert result.stdout.rstrip().endswith("both stopped with status 0")


def test_an_agent_that_dies_fails_them_at_once_with_its_log(tmp_path: Path) -> None:
    env = _with_agent(tmp_path, 'if [ "$1" = run ]; then echo "no chips for you" >&2; exit 3; fi')
    result = _in_image(env)
    assert result.returncode == 1
    first = result.stderr.splitlines()[0]
    assert first == "in-image: the agent exited while waiting for 'Registered resource huawei.com/Ascend910'"
    assert "no chips for you" in result.stderr
