"""The examples in every module's docstrings run and hold."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import ascend_agent
import ascend_agent.backends
from tests.support import ROOT


def _modules() -> list[str]:
    """Every module of the package, backends/ too (installed as ascend_agent.backends from elsewhere)."""
    names = {"ascend_agent.backends"}
    for package in (ascend_agent, ascend_agent.backends):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if "._proto" not in info.name and not info.name.endswith("__main__"):
                names.add(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # examples read fixtures by their path in the repository
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
