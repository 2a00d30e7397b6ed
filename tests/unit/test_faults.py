"""faultPolicy: configured codes or prefixes, longest prefix first; the codes in words."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from ascend_agent.config import ConfigError, SettingsSource, read_config_file
from ascend_agent.health import faults
from ascend_agent.health.faults import FaultPolicy, describe
from ascend_agent.model import Fault


def test_doctests() -> None:
    assert doctest.testmod(faults).failed == 0


def test_longest_configured_prefix_wins() -> None:
    policy = FaultPolicy({"8C": "unhealthy", "8C1F": "healthy", "80e3a203": "healthy"})
    assert policy.verdict("8C1F8609") == "healthy"
    assert policy.verdict("8C03A000") == "unhealthy"
    assert policy.verdict("80E3A203") == "healthy", "case-insensitively"
    assert policy.verdict("80E18005") is None, "left to the fault table"


def test_describe() -> None:
    assert (
        describe("Alarm", [Fault("80E3A203", "heartbeat lost")])
        == "Alarm, error code 80E3A203 (heartbeat lost)"
    )
    assert describe("Critical", []) == "npu-smi reports health Critical"


def test_config_reads_the_policy(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        'faultPolicy: {"80E3A203": healthy, 8C: unhealthy, 80818200: unhealthy}\nflapThreshold: 0\n'
    )
    settings = SettingsSource({}, path).load()
    assert settings.fault_policy == (("80818200", "unhealthy"), ("80E3A203", "healthy"), ("8C", "unhealthy"))
    assert settings.flap_threshold == 0


def test_config_reads_the_taint_effects(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("draFaultTaints: {SeparateNPU: NoSchedule, SubHealthFault: NoSchedule}\n")
    settings = SettingsSource({}, path).load()
    assert settings.dra_fault_taints == (("SeparateNPU", "NoSchedule"), ("SubHealthFault", "NoSchedule"))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("faultPolicy: [80E3A203]\n", "must be a mapping"),
        ("faultPolicy: {xyz: healthy}\n", "'xyz' is not an error code"),
        ("faultPolicy: {80E3A203: fine}\n", "'fine' must be one of healthy, unhealthy"),
        ("draFaultTaints: [SeparateNPU]\n", "must be a mapping of fault classes"),
        ("draFaultTaints: {Separate: NoExecute}\n", "key 'Separate' is not a fault class"),
        ("draFaultTaints: {SeparateNPU: PreferNoSchedule}\n", "must be one of None, NoSchedule, NoExecute"),
        ("flapThreshold: -1\n", "at least 0"),
        ("flapQuiet: 0\n", "above 0"),
    ],
)
def test_bad_policy_and_flap_settings_are_one_line(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_config_file(path)
    assert words in str(caught.value) and "\n" not in str(caught.value)
