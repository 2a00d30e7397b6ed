"""The vnpu: layout: what loads and what is refused, which chips an entry names, and hypothesis on the plan:
it never destroys a held vNPU, ends with exactly the wanted templates, fits the chip and is empty the second
time."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_agent.config import ConfigError, SettingsSource
from ascend_agent.model import Chip, Template, VNpu
from ascend_agent.vnpu_layout import ChipState, absent_chips, parse_layout, plan_chip, templates_for

TEMPLATES = {
    "vir01": Template("vir01", 1, 3, 1),
    "vir02": Template("vir02", 2, 6, 2),
    "vir02_1c": Template("vir02_1c", 2, 6, 1),
    "vir04": Template("vir04", 4, 12, 4),
}
CHIP = Chip.make(1, "310P3", npu_id=1)
AICORES = 8


def test_a_config_file_layout_loads_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text('vnpu: {3: [vir04, vir02], "310P3": [vir02, vir02], "910B4": []}\n')
    assert SettingsSource({}, config).load().vnpu == (
        ("3", ("vir04", "vir02")),
        ("310P3", ("vir02", "vir02")),
        ("910B4", ()),
    )
    config.write_text('vnpu: {"310P3": [vir08]}\n')
    with pytest.raises(ConfigError) as refused:
        SettingsSource({}, config).load()
    assert str(refused.value).startswith(
        f"config file {config}: vnpu 310P3: vir08 is not a template of a 310P3"
    )
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (
            {"310P3": ["vir04", "vir04", "vir02"]},
            "310P3: vir04, vir04, vir02 need 10 AI cores; a 310P3 chip has 8",
        ),
        ({"910B4": ["vir02"]}, "910B4: vir02 is not a template of a 910B4 chip"),
        ({"310B1": ["vir02"]}, "310B1: 310B1 chips cannot be split into vNPUs"),
        ({"0": ["vir02", "vir05_1c_16g"]}, "0: no chip offers vir02, vir05_1c_16g together"),
        ({"0": ["vir16", "vir16", "vir04"]}, "0: vir16, vir16, vir04 need 36 AI cores"),
        ({"0": ["virX"]}, "0: 'virX' is not a vNPU template name"),
        ({"0": "vir02"}, "0: must be a list of template names"),
        ({"A100": ["vir02"]}, "'A100' is neither a physical chip id (3) nor an Ascend chip name (310P3)"),
        (["vir02"], "must map chips to template lists"),
        (
            {"\u0661": ["vir02"]},
            "key '\u0661' is neither a physical chip id (ASCII digits, 3) nor a chip name",
        ),
        ({"1234567": ["vir02"]}, "key 1234567...: a physical chip id has at most 6 digits"),
        ({"3": ["vir02"], "03": ["vir04"]}, "3: chip 3 has two entries"),
    ],
)
def test_refused_layouts(layout: object, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_layout(layout)
    assert str(refused.value).startswith(message)


def test_a_physical_id_entry_wins_over_the_chip_name() -> None:
    layout = parse_layout({"310P3": ["vir02"], "1": ["vir04"]})
    assert templates_for(layout, CHIP) == ("vir04",)
    assert templates_for(layout, Chip.make(2, "310P3")) == ("vir02",)
    assert templates_for(layout, Chip.make(2, "910B4")) is None


def test_a_chip_id_key_is_its_number() -> None:
    assert parse_layout({"03": ["vir02"]}) == (("3", ("vir02",)),)
    assert templates_for(parse_layout({"01": ["vir04"]}), CHIP) == ("vir04",)


def test_a_chip_id_the_node_does_not_have_is_one_line() -> None:
    chips = [Chip.make(phys, "310P3") for phys in range(4)]
    assert absent_chips(parse_layout({"3": ["vir02"], "310P3": []}), chips) == ""
    assert absent_chips(parse_layout({"9": ["vir02"], "1": []}), chips) == (
        "vnpu: chip 9 is not on this node (its chips: 0, 1, 2, 3); nothing created"
    )
    assert absent_chips(parse_layout({"9": [], "12": []}), []) == (
        "vnpu: chips 9, 12 are not on this node (its chips: none found); nothing created"
    )


def test_a_template_the_chip_does_not_offer_is_refused() -> None:
    plan = plan_chip(CHIP, ["vir08"], ChipState((), AICORES), TEMPLATES, lambda v: False)
    assert plan.refused.startswith("vnpu: chip 1 (310P3) offers no template vir08")
    assert plan.commands() == []


_templates = st.sampled_from(sorted(TEMPLATES))


@st.composite
def _situations(draw: st.DrawFn) -> tuple[list[VNpu], list[str], set[int]]:
    """vNPUs on a chip now (within its cores), a wanted list that fits the chip, and the IDs held."""
    now: list[VNpu] = []
    cores = 0
    for index, template in enumerate(draw(st.lists(_templates, max_size=6))):
        if cores + TEMPLATES[template].aicore <= AICORES:
            cores += TEMPLATES[template].aicore
            now.append(VNpu(116 + index, template))
    wanted: list[str] = []
    cores = 0
    for template in draw(st.lists(_templates, max_size=6)):
        if cores + TEMPLATES[template].aicore <= AICORES:
            cores += TEMPLATES[template].aicore
            wanted.append(template)
    held = set(draw(st.sets(st.sampled_from([v.vnpu_id for v in now]) if now else st.nothing())))
    return now, wanted, held


@given(_situations())
def test_the_plan_holds_the_layout_and_never_destroys_a_held_vnpu(
    situation: tuple[list[VNpu], list[str], set[int]],
) -> None:
    now, wanted, held = situation
    plan = plan_chip(CHIP, wanted, ChipState(tuple(now), AICORES), TEMPLATES, lambda v: v.vnpu_id in held)
    assert not plan.refused
    destroyed = {v.vnpu_id for v in plan.destroy}
    assert not destroyed & held
    assert destroyed <= {v.vnpu_id for v in now}
    after = [v for v in now if v.vnpu_id not in destroyed]
    after += [VNpu(200 + i, t) for i, t in enumerate(plan.create)]
    assert sum(TEMPLATES[v.template].aicore for v in after) <= AICORES
    in_use = {v.vnpu_id for v in plan.in_use}
    assert in_use <= held
    wanted_now = Counter(v.template for v in after if v.vnpu_id not in in_use) + Counter(plan.waiting)
    assert wanted_now == Counter(wanted)
    again = plan_chip(CHIP, wanted, ChipState(tuple(after), AICORES), TEMPLATES, lambda v: v.vnpu_id in held)
    assert (again.destroy, again.create) == ((), ()), "the second time issues nothing"
    assert again.in_use == plan.in_use and Counter(again.waiting) == Counter(plan.waiting)


def test_a_layout_is_held_to_the_chips_ai_cpus_too() -> None:
    """vir02, vir02, vir04 fit a 310P3's 8 AI cores but take 8 of its 7 AI CPUs (template-info's figures):
    refused, as the examples' layout was not; beside a vir04 a container holds, a second vir02 waits."""
    templates = {
        "vir02": Template("vir02", 2, 6, 2),
        "vir04": Template("vir04", 4, 12, 4),
        "vir02_1c": Template("vir02_1c", 2, 6, 1),
    }
    plan = plan_chip(CHIP, ["vir02", "vir02", "vir04"], ChipState((), 8, aicpu=7), templates, lambda v: False)
    assert plan.refused == (
        "vnpu: chip 1 (310P3): vir02, vir02, vir04 need 8 AI CPUs; the chip has 7; nothing created"
    )
    assert not plan_chip(
        CHIP, ["vir02_1c", "vir02_1c", "vir04"], ChipState((), 8, 7), templates, lambda v: False
    ).refused
    held = VNpu(116, "vir04")
    now = ChipState((held, VNpu(117, "vir02")), 8, aicpu=7)
    plan = plan_chip(CHIP, ["vir02", "vir02"], now, templates, lambda v: v is held)
    assert (plan.create, plan.waiting) == ((), ("vir02",))
