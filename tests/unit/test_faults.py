"""The fault policy: configured prefixes before the defaults, longest prefix first, else the Health column."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from ascend_agent.config import ConfigError, SettingsSource, read_config_file
from ascend_agent.health import faults
from ascend_agent.health.faults import DEFAULT_FAULT_POLICY, FaultPolicy, describe
from ascend_agent.model import Fault


def test_doctests() -> None:
    assert doctest.testmod(faults).failed == 0


def test_defaults_follow_huaweis_classes() -> None:
    assert DEFAULT_FAULT_POLICY["80E3A203"] == "unhealthy", "RestartNPUCodes"
    assert DEFAULT_FAULT_POLICY["80E3A201"] == "unhealthy", "SeparateNPUCodes"
    assert DEFAULT_FAULT_POLICY["80E21007"] == "healthy", "NotHandleFaultCodes"
    assert DEFAULT_FAULT_POLICY["81A3880C"] == "healthy", "SubHealthFaultCodes"
    assert "80C98008" not in DEFAULT_FAULT_POLICY, "RestartRequestCodes: the Health column decides"
    assert all(code == code.upper() and len(code) == 8 for code in DEFAULT_FAULT_POLICY)


def test_longest_configured_prefix_wins() -> None:
    policy = FaultPolicy({"8C": "unhealthy", "8C1F": "healthy", "80e3a203": "healthy"})
    assert policy.verdict("8C1F8609") == "healthy"
    assert policy.verdict("8C03A000") == "unhealthy"
    assert policy.verdict("80E3A203") == "healthy", "configured entries are asked before the defaults"
    assert policy.verdict("80e18005") == "unhealthy", "the defaults, case-insensitively"
    assert policy.verdict("12345678") is None


@pytest.mark.parametrize(
    ("column", "codes", "healthy"),
    [
        (False, [], False),  # Alarm, no code: the Health column
        (True, [], True),
        (False, ["80E21007"], True),  # Alarm with only informational codes
        (False, ["80E21007", "80E18005"], False),  # one fatal code is enough
        (True, ["80E18005"], False),  # Warning with a fatal code
        (False, ["12345678"], False),  # an unknown code: the Health column
        (True, ["12345678", "80E21007"], True),
        (False, ["12345678", "80E21007"], False),
    ],
)
def test_healthy(column: bool, codes: list[str], healthy: bool) -> None:
    assert FaultPolicy({}).healthy(column, [Fault(code) for code in codes]) is healthy


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


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("faultPolicy: [80E3A203]\n", "must be a mapping"),
        ("faultPolicy: {xyz: healthy}\n", "'xyz' is not an error code"),
        ("faultPolicy: {80E3A203: fine}\n", "'fine' must be one of healthy, unhealthy"),
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
