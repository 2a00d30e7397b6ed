"""Settings: layering and validation, without a process."""

from __future__ import annotations

from pathlib import Path

import pytest

from ascend_agent.config import ConfigError, Settings, SettingsSource, camel_case, read_config_file


def test_camel_case_keys() -> None:
    assert camel_case("fake_chips") == "fakeChips"
    assert camel_case("health_failure_threshold") == "healthFailureThreshold"
    assert camel_case("backend") == "backend"


def test_file_under_overrides(short_dir: Path) -> None:
    path = short_dir / "c.yaml"
    path.write_text("backend: fake\nfakeChips: 4\nhealthyStates: [OK]\nkubeletDir: /x\n")
    settings = SettingsSource({"fake_chips": 2, "mode": None}, path).load()
    assert settings.backend == "fake"
    assert settings.fake_chips == 2
    assert settings.healthy_states == ("OK",)
    assert settings.kubelet_dir == Path("/x")
    assert settings.mode == Settings().mode


def test_empty_file_is_defaults(short_dir: Path) -> None:
    path = short_dir / "c.yaml"
    path.write_text("")
    assert read_config_file(path) == {}
    assert SettingsSource({}, path).load() == Settings()


def test_derived_paths() -> None:
    settings = Settings(host_root=Path("/host"))
    assert settings.effective_dev_root == Path("/host/dev")
    assert settings.effective_sys_root == Path("/host/sys")
    assert Settings(host_root=Path("/host"), dev_root=Path("/d")).effective_dev_root == Path("/d")


@pytest.mark.parametrize(
    "text",
    [
        "replicas: 0\n",
        "healthInterval: -1\n",
        "healthyStates: OK\n",
        "mode: 3\n",
        "replicas: true\n",
        "logLevel: x\n",
    ],
)
def test_invalid_values_name_the_key(short_dir: Path, text: str) -> None:
    path = short_dir / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        SettingsSource({}, path).load()
    assert str(path) in str(caught.value)
    assert text.split(":")[0] in str(caught.value)
