"""Settings: layering and validation, without a process."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from ascend_agent.config import ConfigError, Origin, Settings, SettingsSource, camel_case, read_config_file
from ascend_agent.model import CHIP_NAMES, chip_name, classify


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


GBK_COMMENT = "# 节点配置\n".encode("gbk")  # a comment as saved by an editor set to GBK


def test_a_file_that_is_not_utf8_names_the_file_and_the_byte(short_dir: Path) -> None:
    path = short_dir / "c.yaml"
    path.write_bytes(b"backend: fake\n" + GBK_COMMENT)
    with pytest.raises(ConfigError) as caught:
        SettingsSource({}, path).load()
    assert str(caught.value) == (
        f"config file {path} is not UTF-8: byte 0xbd at offset 16 (line 2); save it as UTF-8"
    )


def test_utf8_comments_are_fine(short_dir: Path) -> None:
    path = short_dir / "c.yaml"
    path.write_text("backend: fake\n# 节点配置\n", encoding="utf-8")
    assert SettingsSource({}, path).load().backend == "fake"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 0.001, 0.999, 0, -1, True])
@pytest.mark.parametrize("name", ["health_interval", "npu_smi_timeout"])
def test_seconds_must_be_finite_and_at_least_one(name: str, value: float) -> None:
    with pytest.raises(ConfigError) as caught:
        SettingsSource({name: value}).load()
    assert str(caught.value) == f"--{name.replace('_', '-')} must be a finite number of seconds, at least 1"


@pytest.mark.parametrize("text", ["healthInterval: .nan\n", "healthInterval: .inf\n", "npuSmiTimeout: 0.5\n"])
def test_seconds_from_the_file_are_checked_too(short_dir: Path, text: str) -> None:
    path = short_dir / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="must be a finite number of seconds, at least 1"):
        SettingsSource({}, path).load()


def test_the_minimum_itself_is_accepted() -> None:
    settings = SettingsSource({"health_interval": 1, "npu_smi_timeout": 1.0}).load()
    assert (settings.health_interval, settings.npu_smi_timeout) == (1.0, 1.0)


def test_the_effective_settings_say_where_each_value_came_from(short_dir: Path) -> None:
    path = short_dir / "c.yaml"
    path.write_text("fakeChips: 4\nhealthyStates: [OK]\nbackend: devfs\n")
    source = SettingsSource(
        {"backend": "fake", "kubelet_dir": "/k", "mode": None},
        path,
        from_environment=frozenset({"kubelet_dir"}),
    )
    effective = source.load_effective()
    assert effective.settings == source.load()
    entries = {key: (value, origin) for key, value, origin in effective.entries()}
    assert [key for key, _, _ in effective.entries()] == [camel_case(f.name) for f in fields(Settings)]
    assert entries["backend"] == ("fake", Origin.FLAG)
    assert entries["kubeletDir"] == (Path("/k"), Origin.ENV)
    assert entries["fakeChips"] == (4, Origin.FILE)
    assert entries["healthyStates"] == (("OK",), Origin.FILE)
    assert entries["mode"] == ("plain", Origin.DEFAULT)
    assert entries["devRoot"] == (None, Origin.DEFAULT)


def test_the_effective_settings_as_one_line_and_as_fields() -> None:
    effective = SettingsSource({"fake_chips": 2, "metrics_address": ""}).load_effective()
    line = str(effective)
    assert line.startswith("backend=devfs (default), kubeletDir=/var/lib/kubelet/device-plugins (default), ")
    assert "fakeChips=2 (flag)" in line
    assert 'metricsAddress="" (flag)' in line
    assert "devRoot=unset (default)" in line
    assert "healthyStates=[OK, Warning] (default)" in line
    assert line.count("(") == len(fields(Settings))
    as_fields = json.loads(json.dumps(effective.as_fields()))
    assert as_fields["fakeChips"] == {"value": 2, "from": "flag"}
    assert as_fields["kubeletDir"] == {"value": "/var/lib/kubelet/device-plugins", "from": "default"}
    assert as_fields["healthyStates"] == {"value": ["OK", "Warning"], "from": "default"}


def test_a_bad_value_from_the_environment_names_the_variable() -> None:
    source = SettingsSource({"replicas": 0}, from_environment=frozenset({"replicas"}))
    with pytest.raises(ConfigError, match=r"^ASCEND_AGENT_REPLICAS must be a whole number"):
        source.load()


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("fakeChipz", "did you mean fakeChips?"),
        ("health_interval", "did you mean healthInterval?"),
        ("metricAddress", "did you mean metricsAddress?"),
        ("replica", "did you mean replicas?"),
        ("kubeletdir", "did you mean kubeletDir?"),
        ("colour", "settings are the flags in camelCase: --kubelet-dir is kubeletDir"),
    ],
)
def test_an_unknown_key_names_the_nearest_setting(short_dir: Path, key: str, hint: str) -> None:
    path = short_dir / "c.yaml"
    path.write_text(f"{key}: 2\n")
    with pytest.raises(ConfigError) as caught:
        SettingsSource({}, path).load()
    assert str(caught.value) == f"config file {path}: unknown setting {key!r} ({hint})"


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("backend: fake\nfakeChips: 2\nreplicas: 1\nfakeChips: 4\n", "fakeChips", (2, 4)),
        ("{fakeChips: 2, fakeChips: 4}\n", "fakeChips", (1, 1)),
        ('vnpu:\n  "310P3": [vir02]\n  "310P3": [vir04]\n', "310P3", (2, 3)),
    ],
)
def test_a_key_given_twice_is_refused_with_its_lines(
    short_dir: Path, text: str, key: str, lines: tuple[int, int]
) -> None:
    path = short_dir / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        SettingsSource({}, path).load()
    assert str(caught.value) == (
        f"config file {path}: {key} is given twice (lines {lines[0]} and {lines[1]}); keep one"
    )


@pytest.mark.parametrize(
    ("given", "hint"),
    [
        ("910b4", "Huawei prints it 910B4"),
        ("910B9", "the nearest is 910B1"),
        ("9100", "the nearest is 910A"),
        ("310p3", "Huawei prints it 310P3"),
        ("910_9399", "the nearest is 910_9391"),
        ("Ascend950pr", "Huawei prints it 950PR"),
    ],
)
def test_a_model_must_be_a_name_its_family_really_has(short_dir: Path, given: str, hint: str) -> None:
    """``model:`` once took anything the generation patterns matched (``910b4``, ``910B9``, ``9100``):
    only names Huawei prints are taken, and a refusal names the nearest one."""
    path = short_dir / "c.yaml"
    path.write_text(f"model: '{given}'\n")
    with pytest.raises(ConfigError) as caught:
        SettingsSource({}, path).load()
    (line,) = str(caught.value).splitlines()
    assert line.startswith(f"config file {path}: model {given!r} is not an Ascend chip name")
    assert hint in line
    with pytest.raises(ConfigError, match="--fake-model"):
        SettingsSource({"fake_model": given}).load()


@pytest.mark.parametrize(
    "name", ["910B4", "910B4-1", "910ProB", "910_9392", "310P3", "950PR", "Ascend910B3", 310]
)
def test_every_real_chip_name_is_taken(short_dir: Path, name: str | int) -> None:
    path = short_dir / "c.yaml"
    path.write_text(f"model: {name}\n")
    assert SettingsSource({}, path).load().model == str(name)


def test_every_chip_name_a_model_may_say_is_of_its_own_family() -> None:
    """``model:`` takes the names of CHIP_NAMES and the agent then treats the chip as its generation: each
    name, with ``Ascend`` before it or not, must classify as the family it is listed under."""
    for family, names in CHIP_NAMES.items():
        for name in names:
            for spelt in (name, f"Ascend{name}", f"Ascend {name}"):
                assert chip_name(spelt) == spelt
                assert classify(spelt) is family, f"{spelt} is listed under {family.value}"


def test_a_refused_name_is_cut_in_the_message(short_dir: Path) -> None:
    path = short_dir / "c.yaml"
    path.write_text(f"model: '{'9' * 5000}'\n")
    with pytest.raises(ConfigError) as caught:
        SettingsSource({}, path).load()
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"api_qps": -1.0}, "--api-qps must be a finite number of at least 0 (0: off)"),
        ({"api_qps": float("inf")}, "--api-qps must be a finite number of at least 0 (0: off)"),
        ({"api_burst": 0}, "--api-burst must be a whole number of at least 1"),
    ],
)
def test_the_rate_limit_refuses_bad_values_in_one_line(given: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        SettingsSource(given).load()
    assert str(caught.value) == message


def test_the_rate_limit_defaults_and_file_keys(short_dir: Path) -> None:
    assert (Settings().api_qps, Settings().api_burst) == (5.0, 10)
    path = short_dir / "c.yaml"
    path.write_text("apiQps: 0\napiBurst: 50\n")
    settings = SettingsSource({}, path).load()
    assert (settings.api_qps, settings.api_burst) == (0.0, 50)
