"""dcmi failures are told by their return code, however an npu-smi build words the line around it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_agent.backends.tool import DCMI_CODES, dcmi_code, diagnose

CONSTRUCTED = Path(__file__).parent.parent / "fixtures" / "npu-smi-constructed"


@pytest.mark.parametrize(
    "line",
    [
        "dcmi module initialize failed. ret is -8020",
        "dcmi model initialize failed. ret is -8020",
        "dcmi module initialized failed. ret is -8020",
        "dcmi model initialized failed, because the device is used. ret is -8020",
        "DCMI module initialize failed, card 0 is busy: ret = -8020",
    ],
)
def test_each_wording_of_a_busy_chip_is_busy(line: str) -> None:
    error = diagnose(f"DrvMngGetConsoleLogLevel failed. (g_conLogLevel=3)\n{line}\n")
    assert error is not None
    assert error.reason == "busy"
    assert "ret -8020" in error.cause and "another process holds the device" in error.cause


def test_a_real_wording_of_8020_is_not_no_chips_found() -> None:
    error = diagnose((CONSTRUCTED / "error-info-dcmi-8020-model-initialized.txt").read_text())
    assert error is not None and error.reason == "busy"


@pytest.mark.parametrize(("code", "words"), [(-8255, "not supported"), (-8010, "sending a message")])
def test_the_vnpu_era_codes_are_named(code: int, words: str) -> None:
    error = diagnose(f"dcmi module initialize failed. ret is {code}\n")
    assert error is not None
    assert f"ret {code}" in error.cause and words in error.cause


def test_an_unknown_code_is_named_by_its_number() -> None:
    error = diagnose("dcmi module initialize failed. ret is -8999\n")
    assert error is not None
    assert "ret -8999" in error.cause and "not known" in error.cause


def test_every_known_code_has_its_own_words() -> None:
    for code in DCMI_CODES:
        error = diagnose(f"dcmi module initialize failed. ret is {code}")
        assert error is not None and f"ret {code}" in error.cause
        assert "not known" not in error.cause and error.next_step


# Noise holds no code of its own, and no "permission denied", which diagnose names before any code.
_noise = st.text(st.characters(blacklist_characters="-", blacklist_categories=("Cs",)), max_size=40).filter(
    lambda text: "ret" not in text.lower() and "permission denied" not in text.lower()
)


@given(
    before=_noise,
    clause=_noise,
    module=st.sampled_from(["module", "model"]),
    verb=st.sampled_from(["initialize", "initialized"]),
    separator=st.sampled_from([" is ", " = ", ": ", " is  "]),
    code=st.integers(min_value=-8999, max_value=-8000),
)
def test_the_code_is_found_wherever_it_is(
    before: str, clause: str, module: str, verb: str, separator: str, code: int
) -> None:
    text = f"{before}\ndcmi {module} {verb} failed,{clause}. ret{separator}{code}\n"
    assert dcmi_code(text) == code
    error = diagnose(text)
    assert error is not None and str(code) in error.cause


def test_text_without_dcmi_is_no_dcmi_failure() -> None:
    assert dcmi_code("ret is -8020") is None
