"""Dynamic vNPUs as partitionable devices (resource.k8s.io/v1 ``sharedCounters``, ``consumesCounters``): pure.

A dynamic chip is one counter set, ``npu-<phys id>``, holding what it has in all (AI cores, memory, AI CPUs,
the media units npu-smi counts), and it is published as devices that consume from it: the whole chip
(consuming all of it) and, per template it offers, as many devices as the chip could hold of that template
alone (``npu-1-vir04-0``, ``npu-1-vir04-1``), each consuming what the template takes. The scheduler then
never hands out a chip and a part of it, nor parts that add up to more than the chip::

    offer = chip_offer(carvable)        # counters, templates with their counts, and what was left out
    offer.counter_set()                 # {"name": "npu-1", "counters": {"ai-cores": {"value": "8"}, ...}}
    offer.consumption(template)         # [{"counterSet": "npu-1", "counters": {...}}]
    template_device_of("npu-1-vir04-3c-0")   # (1, "vir04_3c")
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ascend_agent.model import Carvable, Template

# npu-smi's labels (info-vnpu, template-info) and the counter names they are published under (DNS labels).
_COUNTER_NAMES = {"aicore": "ai-cores", "memory": "memory", "aicpu": "ai-cpus"}
_MEDIA = ("vpc", "venc", "vdec", "jpegd", "jpege", "pngd")
_TEMPLATE_DEVICE = re.compile(r"npu-([0-9]{1,6})-(vir[0-9]{2}(?:-[0-9a-z]+)*)-([0-9]{1,3})")
# What a template's name says: AI cores, then AI CPUs (``_3c``) and memory (``_32g``) where it names them.
_TEMPLATE_NAME = re.compile(r"vir([0-9]{1,3})(?:_([0-9]{1,3})c)?(?:_([0-9]{1,4})g)?(?:_[a-z]+)?")
# resource.k8s.io/v1: counter sets per slice of their own.
MAX_COUNTER_SETS = 8


def counter_set_name(phys_id: int) -> str:
    """The counter set of a dynamic chip: ``npu-<phys id>``, its whole device's name."""
    return f"npu-{phys_id}"


def template_device_name(phys_id: int, template: str, index: int) -> str:
    """A template device's name (a DNS label: ``_`` becomes ``-``).

    >>> template_device_name(1, "vir04_3c", 0)
    'npu-1-vir04-3c-0'
    """
    return f"npu-{phys_id}-{template.replace('_', '-')}-{index}"


def template_device_of(name: str) -> tuple[int, str] | None:
    """The chip's physical id and the template of a template device's name; None for any other name.

    >>> template_device_of("npu-1-vir04-3c-0"), template_device_of("npu-1-vnpu-116")
    ((1, 'vir04_3c'), None)
    """
    found = _TEMPLATE_DEVICE.fullmatch(name)
    if found is None:
        return None
    return int(found.group(1)), found.group(2).replace("-", "_")


def _counter(label: str) -> str | None:
    return _COUNTER_NAMES.get(label) or (label if label in _MEDIA else None)


def _value(counter: str, amount: int) -> str:
    return f"{amount}Gi" if counter == "memory" else str(amount)


@dataclass(frozen=True, slots=True)
class ChipOffer:
    """What a dynamic chip offers: its counters (name -> amount), each template it can carve with what it
    consumes and how many of it the chip could hold, and one line per template left out."""

    phys_id: int
    counters: tuple[tuple[str, int], ...]
    templates: tuple[tuple[Template, tuple[tuple[str, int], ...], int], ...]
    left_out: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return counter_set_name(self.phys_id)

    def counter_set(self) -> dict[str, object]:
        return {"name": self.name, "counters": {c: {"value": _value(c, n)} for c, n in self.counters}}

    def whole_consumption(self) -> list[dict[str, object]]:
        """The whole chip consumes every counter."""
        return [{"counterSet": self.name, "counters": {c: {"value": _value(c, n)} for c, n in self.counters}}]

    def consumption(self, needs: tuple[tuple[str, int], ...]) -> list[dict[str, object]]:
        used = {c: {"value": _value(c, n)} for c, n in needs if n > 0}
        return [{"counterSet": self.name, "counters": used}] if used else []

    def template(self, name: str) -> Template | None:
        return next((t for t, _, _ in self.templates if t.name == name), None)


def template_needs(template: Template) -> dict[str, int]:
    """What one vNPU of ``template`` takes, by counter name."""
    needs = {"ai-cores": template.aicore}
    if template.memory_gb is not None:
        needs["memory"] = template.memory_gb
    if template.aicpu is not None:
        needs["ai-cpus"] = template.aicpu
    for label, amount in template.media:
        counter = _counter(label)
        if counter is not None:
            needs[counter] = amount
    return needs


def shortfall(offer: ChipOffer, present: Sequence[str], template: str) -> str:
    """Why one more vNPU of ``template`` does not fit beside the vNPUs ``present`` (their templates) on the
    chip of ``offer``, counter by counter; "" when it fits. The scheduler counts only what it allocated: a
    vNPU made by hand, or an allocation written without it, would overcommit the chip (vir04 + 2 x vir02 take
    8 of a 310P3's 7 AI CPUs).

    >>> vir02, vir04 = Template("vir02", 2, 6, 2), Template("vir04", 4, 12, 4)
    >>> offer = chip_offer(Carvable(1, (vir02, vir04), (("aicore", 8), ("memory", 21), ("aicpu", 7))))
    >>> shortfall(offer, ["vir04"], "vir02"), shortfall(offer, ["vir04", "vir02"], "vir02")
    ('', 'it would take 8 ai-cpus of the 7 the chip has (vNPUs there now: vir04, vir02)')
    """
    counters = dict(offer.counters)
    used: dict[str, int] = {}
    for name in (*present, template):
        for counter, amount in _needs_of(offer, name).items():
            used[counter] = used.get(counter, 0) + amount
    for counter, amount in used.items():
        if counter in counters and amount > counters[counter]:
            there = ", ".join(present) or "none"
            return (
                f"it would take {amount} {counter} of the {counters[counter]} the chip has (vNPUs there now: "
                f"{there})"
            )
    return ""


def _needs_of(offer: ChipOffer, name: str) -> dict[str, int]:
    """What a vNPU of template ``name`` takes: the offer's figures, else what its name says (AI cores, AI
    CPUs, memory)."""
    known = offer.template(name)
    if known is not None:
        return template_needs(known)
    found = _TEMPLATE_NAME.fullmatch(name)
    if found is None:
        return {}
    cores, cpus, memory = (int(part) if part else None for part in found.groups())
    needs = {"ai-cores": cores or 0}
    if cpus is not None:
        needs["ai-cpus"] = cpus
    if memory is not None:
        needs["memory"] = memory
    return needs


def chip_offer(chip: Carvable) -> ChipOffer:
    """The counters and template devices of a dynamic chip. A counter is what ``info-vnpu`` says the chip
    has in all, but memory: npu-smi gives the usable memory, less than the templates' own figures add up to
    on a full chip (21 GB on a 310P3 against 4 x vir02_1c's 24), so the memory counter is at least what the
    chip carved into any one template takes. A template that takes more of a counter than the chip has, or
    a counter npu-smi does not give, is left out with a line saying so.

    >>> vir04 = Template("vir04", 4, 12, 4, (("vpc", 6),))
    >>> offer = chip_offer(Carvable(1, (vir04,), (("aicore", 8), ("memory", 21), ("aicpu", 7), ("vpc", 12))))
    >>> offer.counters
    (('ai-cores', 8), ('memory', 24), ('ai-cpus', 7), ('vpc', 12))
    >>> [(t.name, count) for t, _, count in offer.templates]
    [('vir04', 1)]
    """
    totals = {counter: amount for label, amount in chip.totals if (counter := _counter(label)) is not None}
    cores = totals.get("ai-cores")
    if not cores:
        return ChipOffer(chip.phys_id, (), (), (f"npu-{chip.phys_id}: npu-smi gives no AI core total",))
    memory = totals.get("memory")
    if memory is not None:
        carved = [
            cores // t.aicore * t.memory_gb for t in chip.templates if t.memory_gb is not None and t.aicore
        ]
        totals["memory"] = max([memory, *carved])
    offered = []
    left_out = []
    for template in chip.templates:
        needs = template_needs(template)
        over = next(
            (
                f"{n} {c} (the chip has {totals[c]})"
                for c, n in needs.items()
                if c in totals and n > totals[c]
            ),
            None,
        )
        if over is not None:
            left_out.append(f"npu-{chip.phys_id}: template {template.name} needs {over}; not offered")
            continue
        counted = tuple((c, n) for c, n in needs.items() if c in totals)
        count = min(totals[c] // n for c, n in counted if n > 0)
        offered.append((template, counted, count))
    return ChipOffer(chip.phys_id, tuple(totals.items()), tuple(offered), tuple(left_out))
