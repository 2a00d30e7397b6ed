"""The vNPU layout of the config (``vnpu:``) and the plan that makes a chip hold it; pure, no I/O.

A key is a physical chip id in ASCII digits (``"3"``) or a chip name (``"310P3"``: every chip of that name
without an entry of its own); a value lists the templates the chip should hold, ``[]`` for none, or is
``{dynamic: true}``: the chip is carved by the claims a DRA driver prepares, not by the layout. A top-level
``dynamic: true`` makes every chip without an entry of its own dynamic::

    layout = parse_layout({"3": ["vir04", "vir02"], "310P3": ["vir02", "vir02"]})   # ValueError: one line
    wanted = templates_for(layout, chip)                                             # None: not managed
    step = plan_chip(chip, wanted, state, templates, held=lambda vnpu: vnpu.in_container)
    step.commands()   # ["npu-smi set -t destroy-vnpu -i 1 -c 0 -v 117", "npu-smi set -t create-vnpu ..."]

The layout is checked twice: at load against the published templates of each product (a name key must fit
one product of its generation; a physical id key, some product), and before anything runs against the node:
an id key must name one of its chips, and each chip must offer the templates (its ``template-info``) and have
the AI cores and AI CPUs they need (vir04 + 2 x vir02 fit a 310P3's 8 AI cores, not its 7 AI CPUs). Memory is
not checked: what ``info-vnpu`` calls the chip's memory is what is usable (21 GB on a 310P3), less than the
templates' own figures add up to on a full chip (4 x vir02_1c: 24 GB).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from ascend_agent.model import (
    Chip,
    Template,
    UnknownModelError,
    VNpu,
    classify,
    is_chip_id,
    normalise_model,
)
from ascend_agent.naming import vnpu_suffix

# ((chip name or physical id, (template, ...)), ...), in the order the config gives them.
Layout = tuple[tuple[str, tuple[str, ...]], ...]
# The templates of a dynamic chip's entry (never a template name), and the key of the top-level entry.
DYNAMIC = ("dynamic",)
EVERY_CHIP = "*"
# The device IDs containers hold now, as the kubelet knows them (its PodResources API); None while that is
# unknown (the socket does not answer). A vNPU among them is never destroyed, a chip among them never split;
# while unknown, nothing is destroyed and no whole chip split.
HeldDevices = Callable[[], Collection[str] | None]


@dataclass(frozen=True, slots=True)
class Product:
    """A product line that can split its chips: its generation (``model.Generation`` value), AI cores per
    chip and templates, as Huawei publishes them."""

    name: str
    generation: str
    aicores: int
    templates: frozenset[str]


def _media(vpc: int, venc: int, jpegd: int, pngd: int, vdec: int, jpege: int) -> tuple[tuple[str, int], ...]:
    return (("vpc", vpc), ("venc", venc), ("jpegd", jpegd), ("pngd", pngd), ("vdec", vdec), ("jpege", jpege))


# A 310P3's templates as ``npu-smi info -t template-info`` lists them: the 310P product's template names, and
# what the fake backend's dynamic 310P chips carve.
TEMPLATES_310P3 = (
    Template("vir01", 1, 3, 1, _media(1, 0, 2, 0, 1, 0)),
    Template("vir02", 2, 6, 2, _media(3, 1, 4, 0, 3, 1)),
    Template("vir02_1c", 2, 6, 1, _media(3, 1, 4, 0, 3, 1)),
    Template("vir04", 4, 12, 4, _media(6, 1, 8, 0, 6, 2)),
    Template("vir04_3c", 4, 12, 3, _media(6, 1, 8, 0, 6, 2)),
    Template("vir04_3c_ndvpp", 4, 12, 3, _media(0, 0, 0, 0, 0, 0)),
    Template("vir04_4c_dvpp", 4, 12, 4, _media(12, 3, 16, 0, 12, 4)),
)

PRODUCTS = (
    Product("Atlas training (910)", "910A", 32, frozenset({"vir02", "vir04", "vir08", "vir16"})),
    Product("Atlas inference (310P)", "310P", 8, frozenset(template.name for template in TEMPLATES_310P3)),
    Product("Atlas A2 training (910B)", "910B", 24, frozenset({"vir06_1c_16g", "vir12_3c_32g"})),
    Product(
        "Atlas A2 inference (910B)",
        "910B",
        20,
        frozenset(
            {
                "vir05_1c_8g",
                "vir05_1c_16g",
                "vir10_3c_16g",
                "vir10_3c_16g_nm",
                "vir10_4c_16g_m",
                "vir10_3c_32g",
            }
        ),
    ),
    Product("Atlas A3 training", "910A3", 48, frozenset({"vir06_1c_16g", "vir12_3c_32g"})),
    Product("Atlas A3 inference", "910A3", 40, frozenset({"vir05_1c_16g", "vir10_3c_32g"})),
)
SPLITTABLE_GENERATIONS = frozenset(product.generation for product in PRODUCTS)
_CORES = re.compile(r"^vir(\d+)")
_CPUS = re.compile(r"^vir[0-9]+_([0-9]{1,3})c(?:_|$)")


class LayoutRefused(ValueError):
    """The layout names what the node does not have (a chip id it lacks); the message is the one line."""


def template_cores(template: str) -> int:
    """The AI cores a template's name gives (``vir04_3c`` -> 4)."""
    match = _CORES.match(template)
    if match is None:
        raise ValueError(f"{template!r} is not a vNPU template name")
    return int(match.group(1))


def parse_layout(value: object) -> Layout:
    """The ``vnpu:`` setting, checked against the published templates; ``ValueError`` in one line.

    >>> parse_layout({3: ["vir04", "vir02"], "310P3": []})
    (('3', ('vir04', 'vir02')), ('310P3', ()))
    >>> parse_layout({"310P3": ["vir04", "vir04", "vir02"]})
    Traceback (most recent call last):
    ValueError: 310P3: vir04, vir04, vir02 need 10 AI cores; a 310P3 chip has 8
    """
    if isinstance(value, tuple):
        value = dict(value)
    if not isinstance(value, dict):
        raise ValueError('must map chips to template lists, e.g. {"3": [vir04, vir02], "310P3": [vir02]}')
    layout: list[tuple[str, tuple[str, ...]]] = []
    for raw_key, raw_templates in value.items():
        if raw_key in ("dynamic", EVERY_CHIP):
            every = raw_templates == DYNAMIC or _dynamic(str(raw_key), {"dynamic": raw_templates})
            if every:
                layout.append((EVERY_CHIP, DYNAMIC))
            continue
        key = str(raw_key) if isinstance(raw_key, int) and not isinstance(raw_key, bool) else raw_key
        if not isinstance(key, str) or not key.strip() or not key.isascii():
            raise ValueError(
                f"key {str(raw_key)[:40]!r} is neither a physical chip id (ASCII digits, 3) nor a chip "
                "name (310P3)"
            )
        if is_chip_id(key):
            key = str(int(key))  # "03" is chip 3
        elif key.isdigit():
            raise ValueError(f"key {key[:20]}...: a physical chip id has at most 6 digits")
        if raw_templates == DYNAMIC or (isinstance(raw_templates, dict) and _dynamic(key, raw_templates)):
            if key in dict(layout):
                raise ValueError(f"{key}: chip {key} has two entries")
            _check_splittable(key)
            layout.append((key, DYNAMIC))
            continue
        if isinstance(raw_templates, tuple):
            raw_templates = list(raw_templates)
        if isinstance(raw_templates, dict):
            raise ValueError(f"{key}: {{dynamic: false}} is no layout; give a template list, [] for none")
        if not isinstance(raw_templates, list) or not all(isinstance(t, str) for t in raw_templates):
            raise ValueError(f"{key}: must be a list of template names, e.g. [vir02, vir02]; [] for none")
        templates = tuple(raw_templates)
        if key in dict(layout):
            raise ValueError(f"{key}: chip {key} has two entries")
        _check_entry(key, templates)
        layout.append((key, templates))
    return tuple(layout)


def _dynamic(key: str, entry: dict[object, object]) -> bool:
    """Whether ``{dynamic: ...}`` makes the chip dynamic; ValueError naming an unknown field or a value
    that is not true or false."""
    unknown = sorted(str(field) for field in entry if field != "dynamic")
    if unknown:
        raise ValueError(f"{key}: unknown field {unknown[0][:40]!r} (a chip's entry is a template list or "
                         "{dynamic: true})")  # fmt: skip
    flag = entry.get("dynamic")
    if not isinstance(flag, bool):
        raise ValueError(f"{key}: dynamic must be true or false, not {str(flag)[:40]!r}")
    return flag


def _generation_of(key: str) -> str:
    """The generation a chip name ``key`` names; ValueError for a key that is no chip name."""
    try:
        return classify(key).value
    except UnknownModelError:
        raise ValueError(
            f"{key!r} is neither a physical chip id (3) nor an Ascend chip name (310P3)"
        ) from None


def _check_splittable(key: str) -> None:
    """ValueError when a chip name ``key`` names chips that cannot be split into vNPUs."""
    if is_chip_id(key):
        return
    generation = _generation_of(key)
    if generation not in SPLITTABLE_GENERATIONS:
        raise ValueError(f"{key}: {normalise_model(key)} chips cannot be split into vNPUs")


def _check_entry(key: str, templates: tuple[str, ...]) -> None:
    for template in templates:
        try:
            vnpu_suffix(template)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
    if is_chip_id(key):
        products: tuple[Product, ...] = PRODUCTS
        what = f"chip {key}"
    else:
        generation = _generation_of(key)
        products = tuple(product for product in PRODUCTS if product.generation == generation)
        what = f"a {normalise_model(key)} chip"
        if not products:
            raise ValueError(f"{key}: {normalise_model(key)} chips cannot be split into vNPUs")
    if not templates:
        return
    offering = [product for product in products if set(templates) <= product.templates]
    if not offering:
        foreign = sorted({t for t in templates if not any(t in product.templates for product in products)})
        if foreign:
            known = ", ".join(sorted({t for product in products for t in product.templates}))
            raise ValueError(f"{key}: {', '.join(foreign)} is not a template of {what} (templates: {known})")
        raise ValueError(f"{key}: no chip offers {', '.join(sorted(set(templates)))} together")
    cores = sum(template_cores(t) for t in templates)
    most = max(product.aicores for product in offering)
    if cores > most:
        has = f"no chip that offers them has more than {most}" if is_chip_id(key) else f"{what} has {most}"
        raise ValueError(f"{key}: {', '.join(templates)} need {cores} AI cores; {has}")


def templates_for(layout: Layout, chip: Chip) -> tuple[str, ...] | None:
    """The templates ``layout`` gives ``chip``: its physical id's entry, else its name's; None when neither
    names it (its vNPUs are left as they are)."""
    entries = dict(layout)
    own = entries.get(str(chip.phys_id))
    if own is not None:
        return own
    for key, templates in layout:
        if key != EVERY_CHIP and not is_chip_id(key) and normalise_model(key).lower() == chip.model.lower():
            return templates
    return entries.get(EVERY_CHIP)


def dynamic_entries(layout: Layout | None) -> Layout:
    """The entries of ``layout`` that make chips dynamic."""
    return tuple((key, templates) for key, templates in layout or () if templates == DYNAMIC)


def is_dynamic(layout: Layout | None, chip: Chip) -> bool:
    """Whether ``layout`` makes ``chip`` dynamic: carved by the claims prepared on it.

    >>> layout = parse_layout({"dynamic": True, "1": ["vir02"]})
    >>> is_dynamic(layout, Chip.make(0, "310P3")), is_dynamic(layout, Chip.make(1, "310P3"))
    (True, False)
    """
    return (
        layout is not None
        and chip.generation.value in SPLITTABLE_GENERATIONS
        and templates_for(layout, chip) == DYNAMIC
    )


def absent_chips(layout: Layout, chips: Sequence[Chip]) -> str:
    """The refusal line when ``layout`` names a physical chip id the node does not have; "" otherwise.

    >>> absent_chips((("9", ("vir02",)),), [Chip.make(0, "310P3"), Chip.make(1, "310P3")])
    'vnpu: chip 9 is not on this node (its chips: 0, 1); nothing created'
    """
    present = {str(chip.phys_id) for chip in chips}
    absent = [key for key, _ in layout if is_chip_id(key) and key not in present]
    if not absent:
        return ""
    have = ", ".join(str(phys) for phys in sorted(chip.phys_id for chip in chips)) or "none found"
    which = f"chip {absent[0]} is" if len(absent) == 1 else f"chips {', '.join(absent)} are"
    return f"vnpu: {which} not on this node (its chips: {have}); nothing created"


@dataclass(frozen=True, slots=True)
class ChipState:
    """What npu-smi says a chip holds now: its vNPUs, its AI cores and AI CPUs (None where unknown)."""

    vnpus: tuple[VNpu, ...]
    aicore: int | None = None
    aicpu: int | None = None


@dataclass(frozen=True, slots=True)
class ChipPlan:
    """What makes one chip hold its layout: vNPUs to destroy, templates to create, vNPUs that stay because a
    container holds them, templates that wait for those; ``refused`` (one line) when the layout cannot be
    held at all, and then nothing else is set. ``unread``: refused because npu-smi could not say what the
    chip holds now, not because of the layout (asked again the next time the layout is applied)."""

    chip: Chip
    destroy: tuple[VNpu, ...] = ()
    create: tuple[str, ...] = ()
    in_use: tuple[VNpu, ...] = ()
    waiting: tuple[str, ...] = ()
    refused: str = ""
    unread: bool = False

    @property
    def empty(self) -> bool:
        return not (self.destroy or self.create)

    def commands(self) -> list[str]:
        """The npu-smi commands, destroys first, as they run."""
        where = f"-i {self.chip.npu_id} -c {self.chip.chip_on_card}"
        return [f"npu-smi set -t destroy-vnpu {where} -v {v.vnpu_id}" for v in self.destroy] + [
            f"npu-smi set -t create-vnpu {where} -f {t}" for t in self.create
        ]


def plan_chip(
    chip: Chip,
    wanted: Sequence[str],
    state: ChipState,
    templates: Mapping[str, Template],
    held: Callable[[VNpu], bool],
) -> ChipPlan:
    """The steps from ``state`` to ``wanted`` on ``chip``. vNPUs of a wanted template are kept (those a
    container holds first); others are destroyed unless ``held``; what is missing is created, as far as the
    AI cores left by vNPUs still held allow.

    >>> chip = Chip.make(1, "310P3", npu_id=1)
    >>> now = ChipState((VNpu(116, "vir04"), VNpu(117, "vir02")), aicore=8)
    >>> offered = {"vir02": Template("vir02", 2), "vir04": Template("vir04", 4)}
    >>> plan_chip(chip, ["vir02", "vir02"], now, offered, held=lambda v: False).commands()
    ['npu-smi set -t destroy-vnpu -i 1 -c 0 -v 116', 'npu-smi set -t create-vnpu -i 1 -c 0 -f vir02']
    """
    name = f"chip {chip.phys_id} ({chip.model})"
    unknown = sorted({t for t in wanted if t not in templates})
    if unknown:
        return ChipPlan(
            chip,
            refused=f"vnpu: {name} offers no template {', '.join(unknown)} (npu-smi info -t template-info "
            f"lists {', '.join(sorted(templates)) or 'none'}); nothing created",
        )
    need = sum(templates[t].aicore for t in wanted)
    if state.aicore is not None and need > state.aicore:
        return ChipPlan(
            chip,
            refused=f"vnpu: {name}: {', '.join(wanted)} need {need} AI cores; the chip has {state.aicore}; "
            "nothing created",
        )
    need_cpus = sum(templates[t].aicpu or 0 for t in wanted)
    if state.aicpu is not None and need_cpus > state.aicpu:
        return ChipPlan(
            chip,
            refused=f"vnpu: {name}: {', '.join(wanted)} need {need_cpus} AI CPUs; the chip has "
            f"{state.aicpu}; nothing created",
        )
    missing = Counter(wanted)
    ordered = sorted(state.vnpus, key=lambda v: (not held(v), v.vnpu_id))
    kept: list[VNpu] = []
    extra: list[VNpu] = []
    for vnpu in ordered:
        if missing[vnpu.template] > 0:
            missing[vnpu.template] -= 1
            kept.append(vnpu)
        else:
            extra.append(vnpu)
    in_use = tuple(v for v in extra if held(v))
    destroy = tuple(sorted((v for v in extra if not held(v)), key=lambda v: v.vnpu_id))
    create: list[str] = []
    waiting: list[str] = []
    used = sum(_cores(v.template, templates) for v in (*kept, *in_use))
    used_cpus = sum(_cpus(v.template, templates) for v in (*kept, *in_use))
    for template in wanted:
        if missing[template] == 0:
            continue
        missing[template] -= 1
        cores, cpus = templates[template].aicore, templates[template].aicpu or 0
        over_cpus = state.aicpu is not None and used_cpus + cpus > state.aicpu
        if (state.aicore is not None and used + cores > state.aicore) or over_cpus:
            waiting.append(template)
        else:
            used += cores
            used_cpus += cpus
            create.append(template)
    return ChipPlan(chip, destroy, tuple(create), in_use, tuple(waiting))


def _cores(template: str, templates: Mapping[str, Template]) -> int:
    known = templates.get(template)
    return known.aicore if known is not None else template_cores(template)


def _cpus(template: str, templates: Mapping[str, Template]) -> int:
    """A template's AI CPUs: template-info's figure, else what its name says (``_3c``), else none counted."""
    known = templates.get(template)
    if known is not None and known.aicpu is not None:
        return known.aicpu
    found = _CPUS.search(template)
    return int(found.group(1)) if found else 0
