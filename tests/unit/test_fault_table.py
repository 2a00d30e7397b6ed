"""The fault table and the grading: Huawei's shipped files built in, each chip's worst class, unknown codes,
FaultFrequency and FaultDuration escalation over a clock the test moves, faultPolicy first; bad fault-config
files refused in one line naming the key. Chips come from the shared ``npu-smi info -t health`` samples."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_agent.backends.npusmi import parse_health
from ascend_agent.cluster.faultconfig import table_from
from ascend_agent.faultclass import HUAWEI_NAMES, FaultClass
from ascend_agent.health.faulttable import (
    CLASS_KEYS,
    FaultConfigError,
    FaultTable,
    parse_code,
    parse_fault_code,
)
from ascend_agent.health.grading import FaultGrading
from ascend_agent.model import Chip, Fault, Health, Inventory
from tests.support.clock import ManualClock
from tests.support.training_fixtures import read

ALARM = "npu-smi-info-t-health_fixture-alarm.txt"
OK = "npu-smi-info-t-health_fixture-ok.txt"


def _chip_from(sample: str) -> Chip:
    """Chip 0 as the devfs backend makes it from a health sample (its command line cut off)."""
    detail = parse_health(read(sample).split("\n", 1)[1])
    return Chip.make(0, "910B3", faults=detail.faults, health_status=detail.status)


def _chip(*codes: str, column: str = "Alarm") -> Chip:
    return Chip.make(0, "910B3", faults=tuple(Fault(code) for code in codes), health_status=column)


def _graded(grading: FaultGrading, chip: Chip) -> Chip:
    return grading.apply(Inventory((chip,))).chips[0]


def test_the_built_in_table_is_huaweis_file() -> None:
    shipped = json.loads(read("huawei-faultCode.json"))
    table = FaultTable.builtin()
    for key, codes in shipped.items():
        for code in codes:
            found = table.class_of(parse_code(code))
            assert found is not None and found >= CLASS_KEYS[key], (key, code)
    # Two codes are in two lists: the more severe wins.
    assert table.class_of(0xB4060011) == max(
        CLASS_KEYS[key] for key, codes in shipped.items() if "B4060011" in codes
    )
    assert len(table.classes) == len({parse_code(c) for codes in shipped.values() for c in codes})
    assert table.frequency[0x80E18005].times == 3
    assert table.duration[0x81078603].handling is FaultClass.PRE_SEPARATE_NPU


def test_the_alarm_sample_is_restartnpu_and_unhealthy() -> None:
    chip = _graded(FaultGrading.builtin(), _chip_from(ALARM))
    assert [(fault.code, fault.fault_class) for fault in chip.faults] == [
        ("A4025021", FaultClass.NOT_HANDLE),
        ("8C03A000", FaultClass.RESTART_NPU),
        ("8C084E00", FaultClass.FREE_RESTART_NPU),
    ]
    assert chip.fault_class is FaultClass.RESTART_NPU
    assert chip.health is Health.UNHEALTHY
    assert chip.reason.startswith("RestartNPU: Alarm, error codes A4025021 (")


def test_the_ok_sample_has_no_class() -> None:
    chip = _graded(FaultGrading.builtin(), _chip_from(OK))
    assert (chip.fault_class, chip.health, chip.faults) == (None, Health.HEALTHY, ())


@pytest.mark.parametrize(
    ("codes", "worst", "health"),
    [
        (["A4025021"], FaultClass.NOT_HANDLE, Health.HEALTHY),
        (["81A3880C"], FaultClass.SUB_HEALTH, Health.HEALTHY),
        (["80C98008"], FaultClass.RESTART_REQUEST, Health.HEALTHY),
        (["80E01801"], FaultClass.RESTART_BUSINESS, Health.HEALTHY),
        (["8C084E00"], FaultClass.FREE_RESTART_NPU, Health.UNHEALTHY),
        (["A4025021", "8C03A000"], FaultClass.RESTART_NPU, Health.UNHEALTHY),
        (["8118043C", "81A3880C"], FaultClass.PRE_SEPARATE_NPU, Health.UNHEALTHY),
        (["80E3A201", "8C03A000"], FaultClass.SEPARATE_NPU, Health.UNHEALTHY),
    ],
)
def test_the_most_severe_class_wins_and_decides_health(
    codes: list[str], worst: FaultClass, health: Health
) -> None:
    chip = _graded(FaultGrading.builtin(), _chip(*codes))
    assert (chip.fault_class, chip.health) == (worst, health)


def test_an_unknown_code_is_named_and_graded_as_huawei_does(caplog: pytest.LogCaptureFixture) -> None:
    grading = FaultGrading.builtin()
    with caplog.at_level(logging.WARNING):
        chip = _graded(grading, _chip("12345678"))
        _graded(grading, _chip("12345678", "80E3A201"))
    assert (chip.fault_class, chip.health) == (FaultClass.SEPARATE_NPU, Health.UNHEALTHY)
    assert caplog.text.count("12345678") == 1, "once while the chip reports it"
    assert "fault code 12345678, which the fault table (built in) does not name: graded SeparateNPU" in (
        caplog.text
    )
    # Health Warning bounds every code's severity to minor: Huawei leaves a minor unknown code alone.
    chip = _graded(FaultGrading.builtin(), _chip("12345678", column="Warning"))
    assert (chip.fault_class, chip.health) == (FaultClass.NOT_HANDLE, Health.HEALTHY)


def test_fault_policy_grades_before_the_table() -> None:
    grading = FaultGrading.builtin({"8C03A000": "healthy", "A402": "unhealthy"})
    chip = _graded(grading, _chip("8C03A000"))
    assert (chip.fault_class, chip.health) == (FaultClass.NOT_HANDLE, Health.HEALTHY)
    assert _graded(grading, _chip("A4025021")).fault_class is FaultClass.SEPARATE_NPU


def test_a_chip_unhealthy_for_another_reason_keeps_it() -> None:
    chip = _chip("A4025021").with_health(Health.UNHEALTHY, "device node /dev/davinci0 is missing")
    graded = _graded(FaultGrading.builtin(), chip)
    assert (graded.fault_class, graded.reason) == (FaultClass.NOT_HANDLE, chip.reason)


_FREQUENCY = {
    "FaultFrequency": [
        {
            "EventId": ["A4025021"],
            "TimeWindow": 600,
            "Times": 2,
            "FaultHandling": "RestartNPU",
            "ReleaseTimeWindow": 60,
        }
    ]
}


def test_fault_frequency_raises_the_class_and_releases_it() -> None:
    clock = ManualClock()
    table = FaultTable.builtin().replaced(customization=json.dumps(_FREQUENCY))
    grading = FaultGrading(table, clock=clock)
    assert _graded(grading, _chip("A4025021")).fault_class is FaultClass.NOT_HANDLE  # once
    clock.now += 10
    assert _graded(grading, _chip()).fault_class is None
    clock.now += 10
    again = _graded(grading, _chip("A4025021"))  # twice within 600 s
    assert (again.fault_class, again.health) == (FaultClass.RESTART_NPU, Health.UNHEALTHY)
    assert again.reason.startswith("RestartNPU (raised by FaultFrequency or FaultDuration): ")
    clock.now += 10
    gone = _graded(grading, _chip())
    assert gone.fault_class is FaultClass.RESTART_NPU, "still twice within the window"
    clock.now += 600
    assert _graded(grading, _chip()).fault_class is None, "out of the window, released after 60 s"


_DURATION = {
    "FaultDuration": [
        {"EventId": ["81078603"], "FaultTimeout": 20, "RecoverTimeout": 60, "FaultHandling": "PreSeparateNPU"}
    ]
}


def test_fault_duration_raises_the_class_until_it_has_recovered() -> None:
    clock = ManualClock()
    table = FaultTable.builtin().replaced(customization=json.dumps(_DURATION))
    grading = FaultGrading(table, clock=clock)
    assert _graded(grading, _chip("81078603")).fault_class is FaultClass.NOT_HANDLE
    clock.now += 20
    assert _graded(grading, _chip("81078603")).fault_class is FaultClass.PRE_SEPARATE_NPU
    clock.now += 5
    assert _graded(grading, _chip()).fault_class is FaultClass.PRE_SEPARATE_NPU, "recovering"
    clock.now += 60
    chip = _graded(grading, _chip())
    assert (chip.fault_class, chip.health) == (None, Health.HEALTHY)


def test_the_shipped_customization_escalates_the_link_down_code() -> None:
    """Huawei's own file: 81078603 (NotHandleFault) lasting 20 s is PreSeparateNPU."""
    clock = ManualClock()
    grading = FaultGrading(FaultTable.builtin(), clock=clock)
    _graded(grading, _chip("81078603"))
    clock.now += 20
    assert _graded(grading, _chip("81078603")).fault_class is FaultClass.PRE_SEPARATE_NPU


def test_a_new_table_changes_the_grade_and_wakes_the_agent() -> None:
    woken = []
    grading = FaultGrading(FaultTable.builtin(), on_change=lambda: woken.append(1))
    data = {"faultCode.json": json.dumps({"SubHealthFaultCodes": ["8C03A000"]})}
    assert grading.update(table_from(data, FaultTable.builtin()))
    assert not grading.update(table_from(data, FaultTable.builtin())), "the same table again"
    assert woken == [1]
    assert _graded(grading, _chip("8C03A000")).fault_class is FaultClass.SUB_HEALTH
    assert _graded(grading, _chip("80E3A201")).fault_class is FaultClass.SEPARATE_NPU, (
        "the file is replaced whole: a code it does not name is unknown"
    )


def _customization(**changes: Any) -> str:
    entry: dict[str, Any] = {**_FREQUENCY["FaultFrequency"][0], **changes}
    return json.dumps({"FaultFrequency": [entry]})


_DEEP_LIST = "[" * 100_000 + "]" * 100_000
_DEEP_OBJECT = '{"x":' * 100_000 + "1" + "}" * 100_000
_LONG_CODE = json.dumps({"NotHandleFaultCodes": ["G" * 100_000]})


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"faultcode.json": "{}"}, "unknown key 'faultcode.json'"),
        ({"faultCode.json": "{"}, "faultCode.json: not JSON"),
        ({"faultCode.json": "[]"}, "faultCode.json: must be a JSON object"),
        ({"faultCode.json": _DEEP_LIST}, "faultCode.json: its arrays or objects nest too deep"),
        ({"faultCustomization.json": _DEEP_OBJECT}, "faultCustomization.json: its arrays or objects nest"),
        ({"faultCode.json": _LONG_CODE}, "G... (100000 characters)' is not a hex"),
        ({"faultCode.json": '{"RestartNPUCode": []}'}, "faultCode.json: unknown key 'RestartNPUCode'"),
        ({"faultCode.json": '{"RestartNPUCodes": ["8C03A00G"]}'}, "NPUCodes: '8C03A00G' is not a hex"),
        ({"faultCode.json": '{"RestartNPUCodes": "8C03A000"}'}, "NPUCodes: must be a list of hex codes"),
        ({"faultCustomization.json": _customization(TimeWindow=30)}, "TimeWindow must be a number from 60"),
        ({"faultCustomization.json": _customization(Times=0)}, "FaultFrequency[0]: Times must be"),
        ({"faultCustomization.json": _customization(ReleaseTimeWindow=-5)}, "ReleaseTimeWindow must be"),
        ({"faultCustomization.json": _customization(FaultHandling="Reboot")}, "FaultHandling 'Reboot' is"),
        ({"faultCustomization.json": _customization(EventId=["xyz"])}, "EventId: 'xyz' is not a hex"),
        ({"faultCustomization.json": _customization(Extra=1)}, "FaultFrequency[0]: unknown key 'Extra'"),
        (
            {"faultCustomization.json": json.dumps({"FaultDuration": [{"EventId": ["81078603"],
             "FaultTimeout": 601, "FaultHandling": "SeparateNPU"}]})},
            "FaultDuration[0]: FaultTimeout must be a number from 0 to 600, not 601",
        ),
        (
            {"faultCustomization.json": json.dumps({"FaultDuration": [{"EventId": ["81078603"],
             "RecoverTimeout": 86401, "FaultHandling": "SeparateNPU"}]})},
            "RecoverTimeout must be a number from 0 to 86400",
        ),
    ],
)  # fmt: skip
def test_a_bad_fault_config_is_refused_in_one_line_naming_the_key(data: dict[str, str], words: str) -> None:
    with pytest.raises(FaultConfigError) as caught:
        table_from(data, FaultTable.builtin())
    assert words in str(caught.value) and "\n" not in str(caught.value), caught.value


def test_huaweis_other_keys_are_accepted() -> None:
    data = {"SwitchFaultCode.json": "{}", "PollInterval": "300"}
    assert table_from(data, FaultTable.builtin()).classes == FaultTable.builtin().classes


_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=24), inner, max_size=4),
    max_leaves=20,
)
_KEYED = st.dictionaries(
    st.sampled_from([*CLASS_KEYS, "FaultFrequency", "FaultDuration", "x"]), _JSONISH, max_size=4
)


@given(document=_KEYED | _JSONISH, raw=st.text(max_size=40))
def test_any_file_is_a_table_or_one_line(document: Any, raw: str) -> None:
    for text in (json.dumps(document), raw):
        for key in ("faultCode.json", "faultCustomization.json"):
            try:
                table_from({key: text}, FaultTable({}))
            except FaultConfigError as exc:
                assert "\n" not in str(exc)


def test_every_class_has_a_huawei_name() -> None:
    assert [fault_class.huawei for fault_class in FaultClass] == list(HUAWEI_NAMES)
    assert all(FaultClass.from_huawei(name).huawei == name for name in HUAWEI_NAMES)
    assert parse_fault_code("{}") == {}
