"""The backend registry: the built-in backends by name, any other through the ``ascend_agent.backends``
entry-point group of an installed distribution (here one on ``sys.path``, as pip would leave it). A start
reads no distribution's entry points for a built-in backend: the agent held 0.17 to 0.19 MiB more when it
did."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from ascend_agent.backends import BUILT_IN, backend_for, backend_names, load_backend
from ascend_agent.backends.devfs import DevfsBackend
from ascend_agent.backends.fake import FakeBackend
from ascend_agent.config import ConfigError, Settings

THIRD_PARTY = """
class ThirdPartyBackend:
    def __init__(self, settings):
        self.settings = settings
"""


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A distribution that registers ``vendor`` and also tries to take the built-in name ``fake``."""
    (tmp_path / "vendor_npu_backend.py").write_text(THIRD_PARTY)
    info = tmp_path / "vendor_npu-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-npu\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[ascend_agent.backends]\n"
        "vendor = vendor_npu_backend:ThirdPartyBackend\n"
        "fake = vendor_npu_backend:ThirdPartyBackend\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_the_built_in_backends_load_without_reading_the_distributions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def scan(**_: str) -> None:
        raise AssertionError("the installed distributions' entry points were read")

    monkeypatch.setattr(importlib.metadata, "entry_points", scan)
    assert load_backend("devfs") is DevfsBackend
    assert load_backend("fake") is FakeBackend
    assert sorted(BUILT_IN) == ["devfs", "fake"]


def test_another_distribution_adds_a_backend_but_cannot_take_a_built_in_name(third_party: Path) -> None:
    vendor = load_backend("vendor")
    assert vendor.__name__ == "ThirdPartyBackend"
    assert vendor.__module__ == "vendor_npu_backend"
    assert load_backend("fake") is FakeBackend
    assert backend_names() == ["devfs", "fake", "vendor"]
    settings = Settings(backend="vendor")
    assert backend_for(settings).settings is settings  # type: ignore[attr-defined]


def test_an_unknown_name_is_a_config_error_naming_every_backend(third_party: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        backend_for(Settings(backend="nope"))
    assert str(raised.value) == "--backend: unknown backend 'nope' (known: devfs, fake, vendor)"
