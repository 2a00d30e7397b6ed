"""The vNPU parsers over the samples, hypothesis on re-spaced and re-bordered samples and on any text, and the
runners against a fake npu-smi."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_agent.backends.npusmi import NpuSmiError, NpuSmiParseError
from ascend_agent.backends.npusmi_vnpu import (
    check_done,
    create_vnpu,
    parse_info_vnpu,
    parse_template_info,
    query_vnpus,
    unsupported,
)
from ascend_agent.model import Template, VNpu
from tests.support import FIXTURES
from tests.support.npusmi_fake import FakeNpuSmi

VNPU = FIXTURES / "vnpu"
TEMPLATES = (VNPU / "310P3-template-info.txt").read_text()
TWO = (VNPU / "310P3-info-vnpu-i1-c0.txt").read_text()
NONE = (VNPU / "310P3-info-vnpu-i2-c0-none.txt").read_text()


def test_template_info_sample() -> None:
    templates = parse_template_info(TEMPLATES)
    assert [t.name for t in templates] == [
        "vir01", "vir02", "vir02_1c", "vir04", "vir04_3c", "vir04_3c_ndvpp", "vir04_4c_dvpp",
    ]  # fmt: skip
    media = (("vpc", 3), ("venc", 1), ("jpegd", 4), ("pngd", 0), ("vdec", 3), ("jpege", 1))
    assert templates[1] == Template("vir02", aicore=2, memory_gb=6, aicpu=2, media=media)
    assert templates[4].aicpu == 3 and dict(templates[4].media)["vdec"] == 6
    # the media units of the second row (PNGD VDEC JPEGE) under the first's (VPC VENC JPEGD)
    assert dict(templates[6].media) == {"vpc": 12, "venc": 3, "jpegd": 16, "pngd": 0, "vdec": 12, "jpege": 4}


def test_info_vnpu_with_two() -> None:
    state = parse_info_vnpu(TWO)
    assert state.resources["aicore"] == (2, 8)
    assert state.resources["memory"] == (3, 21)
    assert state.resources["pngd"] == (None, None)
    assert state.vnpus == (
        VNpu(116, "vir04", vgroup_id=0, container_id="3f2a9c1d7b4e", status="1"),
        VNpu(117, "vir02", vgroup_id=1, container_id="ffffffffffff", status="0"),
    )
    assert [v.in_container for v in state.vnpus] == [True, False]


def test_a_free_count_below_zero_keeps_the_chips_totals() -> None:
    """vir04 + 2 x vir02 take 8 AI CPUs of a 310P3's 7: npu-smi then prints ``-1/7``, and the whole resources
    row was dropped, so the dynamic chip lost its totals and left the DRA pool."""
    overcommitted = TWO.replace("| 2/8       3/21      1/7 ", "| 0/8       -3/21     -1/7")
    assert overcommitted != TWO
    state = parse_info_vnpu(overcommitted)
    assert (state.resources["aicore"], state.resources["memory"], state.resources["aicpu"]) == (
        (0, 8),
        (-3, 21),
        (-1, 7),
    )


@pytest.mark.parametrize("shown", ["", "-", "NA", "na", "ffffffffffff", "FFFFFFFFFFFF", "000000000000"])
def test_a_container_column_that_names_no_container(shown: str) -> None:
    assert not VNpu(100, "vir02", container_id=shown).in_container


def test_info_vnpu_without_any() -> None:
    state = parse_info_vnpu(NONE)
    assert state.vnpus == ()
    assert state.total("aicore") == 8 and state.total("memory") == 21


def test_a_row_fewer_than_the_total_is_refused() -> None:
    cut = "\n".join(line for line in TWO.splitlines() if "117" not in line)
    with pytest.raises(NpuSmiParseError, match="Total number of vnpu: 2"):
        parse_info_vnpu(cut)


def _id_of_117(shown: str) -> str:
    """The two-vNPU sample with vNPU 117's id cell showing ``shown`` (its width kept when it fits)."""
    return TWO.replace("|  117      |", f"|  {shown.ljust(9)}|")


@pytest.mark.parametrize(
    ("shown", "said"),
    [
        ("116", "info-vnpu lists vNPU id 116 twice (vNPU ids are unique per node)"),
        ("1" * 5000, "info-vnpu: vNPU id '11111111111111111111'... (5000 characters) is not a number"),
        ("\u0661\u0661\u0667", "info-vnpu: vNPU id '\u0661\u0661\u0667' is not a number of at most 9 digits"),
    ],
)
def test_a_vnpu_id_npu_smi_cannot_mean_refuses_the_table(shown: str, said: str) -> None:
    with pytest.raises(NpuSmiParseError) as refused:
        parse_info_vnpu(_id_of_117(shown))
    assert str(refused.value).startswith(said)


_ID_CELLS = st.one_of(
    st.integers(0, 10**12).map(str), st.text(st.characters(categories=["Nd"]), min_size=1, max_size=12)
)


@given(_ID_CELLS, _ID_CELLS)
def test_vnpu_ids_read_are_unique_ascii_numbers(first: str, second: str) -> None:
    text = _id_of_117(second).replace("|  116      |", f"|  {first.ljust(9)}|")
    try:
        state = parse_info_vnpu(text)
    except NpuSmiParseError:
        return
    assert [v.vnpu_id for v in state.vnpus] == [int(first), int(second)]
    assert int(first) != int(second) and first.isascii() and second.isascii()


def test_a_total_of_5000_digits_refuses_the_table() -> None:
    with pytest.raises(NpuSmiParseError, match="no 'Total number of vnpu' line"):
        parse_info_vnpu(TWO.replace("vnpu: 2 ", "vnpu: " + "2" * 5000 + " "))


def test_a_template_name_that_is_no_template_refuses_the_table() -> None:
    with pytest.raises(NpuSmiParseError, match="info-vnpu: vNPU 117 has template 'vir02x'"):
        parse_info_vnpu(TWO.replace("vir02               |", "vir02x              |"))


def test_set_command_answers() -> None:
    check_done((VNPU / "create-vnpu-ok.txt").read_text(), "create")
    check_done((VNPU / "destroy-vnpu-ok.txt").read_text(), "destroy")
    with pytest.raises(NpuSmiError, match="create failed: the template is not supported"):
        check_done("  Status : FAILED\n  Message : the template is not supported\n", "create")
    with pytest.raises(NpuSmiError, match="create failed: garbage"):
        check_done("garbage\n", "create")


def test_unsupported_answers() -> None:
    assert unsupported("Error: dcmi_create_vdevice failed, ret = -8255")
    assert unsupported("This device does not support querying vnpu information.")
    assert unsupported(
        "npu-smi cannot reach the chips (dcmi module initialize failed, ret -8255): not supported"
    )
    assert not unsupported("dcmi module initialize failed. ret is -8005")
    assert not unsupported("dcmi module initialize failed. ret is -82550")


def _respaced(text: str, data: st.DataObject) -> str:
    """The sample with every run of spaces made 1 to 6 wide and, maybe, the right-hand borders dropped."""
    drop_right = data.draw(st.booleans())
    lines = []
    for line in text.splitlines():
        line = re.sub(r" {2,}", lambda _: " " * data.draw(st.integers(2, 6)), line)
        if drop_right and line.rstrip().endswith("|") and line.count("|") >= 2:
            line = line.rstrip()[:-1]
        lines.append(line)
    return "\n".join(lines) + "\n"


@given(st.data())
def test_templates_parse_alike_whatever_the_spacing(data: st.DataObject) -> None:
    assert parse_template_info(_respaced(TEMPLATES, data)) == parse_template_info(TEMPLATES)


@given(st.data(), st.sampled_from([TWO, NONE]))
def test_vnpus_parse_alike_whatever_the_spacing(data: st.DataObject, text: str) -> None:
    assert parse_info_vnpu(_respaced(text, data)) == parse_info_vnpu(text)


_SAMPLE_LINES = [*TEMPLATES.splitlines(), *TWO.splitlines(), "| Total number of vnpu: 1 |"]


@given(st.lists(st.one_of(st.sampled_from(_SAMPLE_LINES), st.text(max_size=60)), max_size=30))
def test_any_text_gives_a_result_or_a_parse_error(lines: list[str]) -> None:
    text = "\n".join(lines)
    for parse in (parse_template_info, parse_info_vnpu):
        with contextlib.suppress(NpuSmiParseError):
            parse(text)


@pytest.fixture
def npu_smi(tmp_path: Path) -> FakeNpuSmi:
    return FakeNpuSmi(tmp_path / "npu-smi")


async def test_query_vnpus_runs_the_command(npu_smi: FakeNpuSmi) -> None:
    npu_smi.set_output("info -t info-vnpu -i 1 -c 0", TWO)
    state = await query_vnpus(str(npu_smi.path), 1, 0, 5)
    assert state is not None and [v.vnpu_id for v in state.vnpus] == [116, 117]


@pytest.mark.parametrize(
    "said", ["dcmi_get_vnpu_info failed, ret = -8255\n", "Error: This device does not support vnpu.\n"]
)
async def test_a_chip_without_vnpu_support_is_none(npu_smi: FakeNpuSmi, said: str) -> None:
    npu_smi.set_error("info -t info-vnpu -i 0 -c 0", said)
    assert await query_vnpus(str(npu_smi.path), 0, 0, 5) is None


async def test_another_failure_is_an_error(npu_smi: FakeNpuSmi) -> None:
    npu_smi.set_mode("fail")
    with pytest.raises(NpuSmiError, match="-8005"):
        await query_vnpus(str(npu_smi.path), 0, 0, 5)


async def test_create_that_the_chip_refuses(npu_smi: FakeNpuSmi, tmp_path: Path) -> None:
    npu_smi.set_vnpu_state(
        tmp_path, {(1, 0): {"phys": 1, "aicore": 8, "memory": 21, "aicpu": 7, "vnpus": []}},
        {"vir02": (2, 6, 2)}, reject=["vir02"],
    )  # fmt: skip
    with pytest.raises(NpuSmiError, match="create-vnpu -i 1 -c 0 -f vir02 exited with status 1"):
        await create_vnpu(str(npu_smi.path), 1, 0, "vir02", 5)
