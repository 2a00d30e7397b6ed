"""The vNPUs of a node's chips, read with npu-smi, and the runs that make them match the ``vnpu:`` layout.

npu-smi is asked per chip (``info -t info-vnpu``) only while ``/dev/vdavinci*`` nodes exist (a node without
any has no vNPUs, and pays nothing) or a layout is applied, and only when told to look again: at start, when
those nodes appear or disappear, on SIGHUP, after a layout ran, and when the chip set changed; the template
table once per chip model. A chip that cannot hold vNPUs (310, 310B, 950, or npu-smi says
-8255 or ``not support``) stays a plain chip, and is not asked again::

    probe = VnpuProbe(settings)
    await probe.refresh(chips, vdavinci_nodes)          # the devfs backend's discover, when the nodes changed
    parts = probe.slices(chips, nodes)                  # the vNPUs, as devices of their chips
    plans = await probe.apply(layout, chips, held, run=True)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Sequence
from dataclasses import replace

import anyio

from ascend_agent.backends.npusmi import NpuSmiError
from ascend_agent.backends.npusmi_vnpu import (
    ChipVnpus,
    create_vnpu,
    destroy_vnpu,
    query_templates,
    query_vnpus,
)
from ascend_agent.config import Settings
from ascend_agent.model import VNPU_ID_BASE, VNPU_IDS_PER_CHIP, Carvable, Chip, Health, Template, VNpu
from ascend_agent.observability import log_fields
from ascend_agent.vnpu_layout import (
    DYNAMIC,
    SPLITTABLE_GENERATIONS,
    ChipPlan,
    ChipState,
    HeldDevices,
    Layout,
    LayoutRefused,
    absent_chips,
    is_dynamic,
    plan_chip,
    template_cores,
    templates_for,
)

log = logging.getLogger(__name__)

# A vNPU's device node under /dev, its npu-smi vNPU id in the group.
VNPU_NODE = re.compile(r"^vdavinci(\d+)$")
# npu-smi's Status column: numbers (0 idle, 1 in use) say nothing of health; so does OK.
_HEALTHY_STATUS = frozenset({"", "ok", "normal"})


class VnpuProbe:
    """What npu-smi last said about each chip's vNPUs, and the layout runs."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._states: dict[int, ChipVnpus] = {}
        self._unsupported: set[int] = set()
        self._templates: dict[str, dict[str, Template]] = {}
        self._asked: tuple[frozenset[int], frozenset[str]] | None = None
        self._failures: dict[int, str] = {}
        self._warned: set[tuple[int, int]] = set()
        self._unknown_warned = False
        self._lock = anyio.Lock()

    @property
    def _npu_smi(self) -> str:
        return self._settings.effective_npu_smi

    def stale(self, chips: Sequence[Chip], nodes: Collection[str]) -> bool:
        """True when the chips or the ``/dev/vdavinci*`` nodes changed since npu-smi was last asked."""
        return bool(chips) and self._asked != _asked_key(chips, nodes)

    def forget(self) -> None:
        """Ask npu-smi again at the next :meth:`refresh_if_stale` (SIGHUP)."""
        self._asked = None

    async def refresh_if_stale(self, chips: Sequence[Chip], nodes: Collection[str]) -> None:
        """Ask again where something changed: every chip after the chips changed (or :meth:`forget`); else
        only the chips whose ``/dev/vdavinci<id>`` nodes came or went (npu-smi numbers a chip's vNPUs from
        ``phys*16+100``), so a node of many chips sees one chip's change after one npu-smi run."""
        if not self.stale(chips, nodes):
            if self._failures:  # a table that failed to read (or read wrong) is asked again
                await self.refresh(chips, nodes, only=frozenset(self._failures))
            return
        key = _asked_key(chips, nodes)
        if self._asked is None or self._asked[0] != key[0]:
            await self.refresh(chips, nodes)
            return
        changed = {_chip_of(name) for name in key[1] ^ self._asked[1]}
        await self.refresh(chips, nodes, only=frozenset(changed))

    async def refresh(
        self,
        chips: Sequence[Chip],
        nodes: Collection[str],
        *,
        always: bool = False,
        only: frozenset[int] | None = None,
    ) -> None:
        """Ask npu-smi for the vNPUs of every chip (``only`` those physical ids) that may hold some: while
        any ``/dev/vdavinci*`` node exists, or ``always``."""
        async with self._lock:
            self._asked = _asked_key(chips, nodes)
            present = {chip.phys_id for chip in chips}
            self._states = {phys: state for phys, state in self._states.items() if phys in present}
            self._unsupported &= present
            always = always or any(self._dynamic(chip) for chip in chips)
            if not always and not self._asked[1]:
                self._states.clear()
                self._failures.clear()
                return
            for chip in chips:
                if only is not None and chip.phys_id not in only:
                    continue
                if chip.generation.value in SPLITTABLE_GENERATIONS and chip.phys_id not in self._unsupported:
                    await self._ask(chip)

    async def _ask(self, chip: Chip) -> None:
        """Ask npu-smi for one chip's vNPUs. A table that fails to read, or lists a vNPU id another chip's
        table holds, is refused with one warning, and what was known of the chip is kept."""
        assert chip.npu_id is not None
        try:
            state = await query_vnpus(
                self._npu_smi, chip.npu_id, chip.chip_on_card, self._settings.npu_smi_timeout
            )
            if state is not None:
                self._check_unique(chip, state)
        except NpuSmiError as exc:
            if self._failures.get(chip.phys_id) != str(exc):
                log.warning(
                    "Cannot read the vNPUs of chip %d, keeping what was known: %s",
                    chip.phys_id,
                    exc,
                    extra=log_fields(device=chip.device_id, reason=str(exc)),
                )
            self._failures[chip.phys_id] = str(exc)
            return
        self._failures.pop(chip.phys_id, None)
        if state is None:
            log.debug("Chip %d (%s) cannot hold vNPUs", chip.phys_id, chip.model)
            self._unsupported.add(chip.phys_id)
            self._states.pop(chip.phys_id, None)
            return
        if state.vnpus or self._dynamic(chip):
            await self._templates_of(chip)
        self._states[chip.phys_id] = state

    def _check_unique(self, chip: Chip, state: ChipVnpus) -> None:
        """NpuSmiError when ``state`` lists a vNPU id that another chip's table holds: two devices would
        mount one ``/dev/vdavinci<id>``, and a destroy by id could hit the other chip's vNPU."""
        ids = {vnpu.vnpu_id for vnpu in state.vnpus}
        for phys, other in self._states.items():
            shared = sorted(ids & {vnpu.vnpu_id for vnpu in other.vnpus})
            if phys != chip.phys_id and shared:
                raise NpuSmiError(
                    "output",
                    f"npu-smi info -t info-vnpu -i {chip.npu_id} -c {chip.chip_on_card} lists vNPU id "
                    f"{shared[0]}, which chip {phys} holds (vNPU ids are unique per node)",
                )

    async def _templates_of(self, chip: Chip) -> dict[str, Template]:
        """The chip model's templates (``info -t template-info -i <npu id>``), asked once per model."""
        known = self._templates.get(chip.model)
        if known is not None:
            return known
        assert chip.npu_id is not None
        try:
            templates = await query_templates(self._npu_smi, chip.npu_id, self._settings.npu_smi_timeout)
        except NpuSmiError as exc:
            log.info("No vNPU template table for %s chips: %s", chip.model, exc)
            return {}
        self._templates[chip.model] = {template.name: template for template in templates}
        return self._templates[chip.model]

    def unread(self, chips: Sequence[Chip]) -> tuple[Chip, ...]:
        """``chips``, each whose vNPU table npu-smi did not give right, and of which nothing was known before,
        Unhealthy with why: its vNPUs are unknown, and handed out whole it would hand them out too (a table
        listing a vNPU id another chip's holds gave the second chip out whole)."""
        return tuple(
            chip.with_health(Health.UNHEALTHY, f"its vNPUs are unknown: {why}")
            if chip.healthy
            and chip.phys_id not in self._states
            and (why := self._failures.get(chip.phys_id)) is not None
            else chip
            for chip in chips
        )

    def slices(self, chips: Sequence[Chip], nodes: Collection[str]) -> tuple[Chip, ...]:
        """Every vNPU as a device of its chip: the chip's health, unless its device node is missing or
        npu-smi shows a status other than a number or OK."""
        parts = []
        for chip in chips:
            state = self._states.get(chip.phys_id)
            if state is None or self._dynamic(chip):
                continue
            templates = self._templates.get(chip.model, {})
            for vnpu in state.vnpus:
                part = chip.slice(_with_resources(vnpu, templates.get(vnpu.template)))
                if part.healthy and f"vdavinci{vnpu.vnpu_id}" not in nodes:
                    part = part.with_health(Health.UNHEALTHY, f"device node {part.device_path} is missing")
                elif part.healthy and not (vnpu.status.isdigit() or vnpu.status.lower() in _HEALTHY_STATUS):
                    part = part.with_health(Health.UNHEALTHY, f"npu-smi shows vNPU status {vnpu.status}")
                parts.append(part)
        return tuple(parts)

    def _dynamic(self, chip: Chip) -> bool:
        return is_dynamic(self._settings.vnpu, chip)

    def carvable(self, chips: Sequence[Chip]) -> tuple[Carvable, ...]:
        """The dynamic chips whose templates and totals npu-smi gave."""
        found = []
        for chip in chips:
            state = self._states.get(chip.phys_id)
            templates = self._templates.get(chip.model)
            if state is None or not templates or not self._dynamic(chip):
                continue
            totals = tuple(
                (label, total) for label, (_, total) in state.resources.items() if total is not None
            )
            found.append(Carvable(chip.phys_id, tuple(templates.values()), totals))
        return tuple(found)

    async def vnpus_now(self, chip: Chip) -> tuple[VNpu, ...]:
        """The chip's vNPUs as npu-smi says them now; NpuSmiError when it cannot say."""
        assert chip.npu_id is not None
        state = await query_vnpus(
            self._npu_smi, chip.npu_id, chip.chip_on_card, self._settings.npu_smi_timeout
        )
        return state.vnpus if state is not None else ()

    async def create_one(self, chip: Chip, template: str, vnpu_id: int) -> None:
        """Create vNPU ``vnpu_id`` of ``template`` on ``chip``; NpuSmiError with npu-smi's words. The caller
        logs it (the DRA driver, with the claim)."""
        assert chip.npu_id is not None
        await create_vnpu(
            self._npu_smi, chip.npu_id, chip.chip_on_card, template, self._settings.npu_smi_timeout, vnpu_id
        )

    async def destroy_one(self, chip: Chip, vnpu_id: int) -> None:
        """Destroy vNPU ``vnpu_id`` of ``chip``; NpuSmiError with npu-smi's words."""
        assert chip.npu_id is not None
        await destroy_vnpu(
            self._npu_smi, chip.npu_id, chip.chip_on_card, vnpu_id, self._settings.npu_smi_timeout
        )

    async def apply(
        self, layout: Layout, chips: Sequence[Chip], held: HeldDevices, nodes: Collection[str], *, run: bool
    ) -> tuple[ChipPlan, ...]:
        """Plan every chip the layout names against what npu-smi says now (asked again unless nothing
        changed since it was last asked: :meth:`forget` makes it ask), and with ``run`` carry the plans
        out; when any chip refuses its entry, nothing runs anywhere. A chip whose last read failed is read
        again first. :class:`LayoutRefused` when the layout names a chip id the node does not have."""
        absent = absent_chips(layout, chips)
        if absent:
            raise LayoutRefused(absent)
        if self.stale(chips, nodes) or not self._states:
            await self.refresh(chips, nodes, always=True)
        elif self._failures:
            # A table that failed to read is not planned on, and nothing else would read it again.
            await self.refresh(chips, nodes, always=True, only=frozenset(self._failures))
        held_now = held()
        held_ids = None if held_now is None else frozenset(held_now)
        async with self._lock:
            plans = [
                await self._plan(chip, wanted, held_ids, named=str(chip.phys_id) in dict(layout))
                for chip, wanted in _managed(layout, chips)
                if not self._dynamic(chip)  # dynamic when this backend started: the claims carve it
            ]
            if not run or any(plan.refused for plan in plans):
                return tuple(plans)
            self._warn_unknown(held_ids is None and any(plan.in_use or plan.waiting for plan in plans))
            for plan in plans:
                if held_ids is not None:
                    self._warn_in_use(plan)
                if not plan.empty:
                    await self._carry_out(plan)
        if any(not plan.empty for plan in plans):
            await self.refresh(chips, nodes, always=True)
        return tuple(plans)

    async def _plan(
        self, chip: Chip, wanted: tuple[str, ...], held_ids: frozenset[str] | None, *, named: bool
    ) -> ChipPlan:
        """The chip's plan; a chip without vNPU support is refused only when the layout names its id (a
        chip name's entry passes over it). ``held_ids`` None (unknown): every vNPU counts as held, and a
        chip without vNPUs as held whole."""
        name = f"chip {chip.phys_id} ({chip.model})"
        if chip.generation.value not in SPLITTABLE_GENERATIONS or chip.phys_id in self._unsupported:
            if not wanted or not named:
                return ChipPlan(chip)
            return ChipPlan(chip, refused=f"vnpu: {name} cannot be split into vNPUs; nothing created")
        state = self._states.get(chip.phys_id)
        if state is None or chip.phys_id in self._failures:
            # A table npu-smi could not give, or gave wrong, is not planned on: what was known may be stale.
            why = self._failures.get(chip.phys_id, "npu-smi did not say")
            return ChipPlan(
                chip, refused=f"vnpu: the vNPUs of {name} are unknown ({why}); nothing created", unread=True
            )
        templates = await self._templates_of(chip)
        if not templates and wanted:
            return ChipPlan(
                chip, refused=f"vnpu: npu-smi lists no vNPU templates for {name}; nothing created"
            )

        def holds(vnpu: VNpu) -> bool:
            return vnpu.in_container or held_ids is None or chip.slice(vnpu).device_id in held_ids

        current = ChipState(state.vnpus, aicore=state.total("aicore"), aicpu=state.total("aicpu"))
        plan = plan_chip(chip, wanted, current, templates, holds)
        whole = chip.chip_device_id
        held_whole = (
            not state.vnpus
            if held_ids is None
            else any(held == whole or held.startswith(f"{whole}-") for held in held_ids)
        )
        if plan.create and held_whole:
            # A container holds the whole chip (or a replica of it): splitting it now would pull it away.
            return replace(plan, create=(), waiting=(*plan.create, *plan.waiting))
        return plan

    def _warn_unknown(self, waits: bool) -> None:
        """One warning while the layout waits because nothing says which containers hold what."""
        if waits and not self._unknown_warned:
            log.warning(
                "vnpu: which containers hold NPUs is unknown (the kubelet's PodResources socket does not "
                "answer): no vNPU is destroyed and no whole chip split until it answers"
            )
        self._unknown_warned = waits

    def _warn_in_use(self, plan: ChipPlan) -> None:
        for vnpu in plan.in_use:
            key = (plan.chip.phys_id, vnpu.vnpu_id)
            if key not in self._warned:
                self._warned.add(key)
                part = plan.chip.slice(vnpu)
                log.warning(
                    "vnpu: %s (%s) is not in the layout but a container holds it; kept until it is free",
                    part.device_id,
                    vnpu.template,
                    extra=log_fields(device=part.device_id),
                )
        if plan.waiting:
            log.info(
                "vnpu: chip %d waits for what a container holds on it to be freed before creating %s",
                plan.chip.phys_id,
                ", ".join(plan.waiting),
            )

    async def _carry_out(self, plan: ChipPlan) -> None:
        """Destroys and creates on one chip. Creates go first when they fit beside what is there, so that a
        failed create leaves the chip as it was: the vNPUs this run created are destroyed again."""
        chip = plan.chip
        assert chip.npu_id is not None
        timeout = self._settings.npu_smi_timeout
        state = self._states[chip.phys_id]
        templates = self._templates.get(chip.model, {})
        free = state.resources.get("aicore", (None, None))[0]
        need = sum(templates[t].aicore for t in plan.create)
        destroy_first = free is not None and need > free
        before = {vnpu.vnpu_id for vnpu in state.vnpus}
        if destroy_first and not await self._destroy(chip, plan.destroy):
            return
        for template in plan.create:
            try:
                await create_vnpu(self._npu_smi, chip.npu_id, chip.chip_on_card, template, timeout)
            except NpuSmiError as exc:
                await self._undo_creates(chip, before, exc)
                return
            log.info("vnpu: created a %s vNPU on chip %d", template, chip.phys_id)
        if not destroy_first:
            await self._destroy(chip, plan.destroy)

    async def _destroy(self, chip: Chip, vnpus: Sequence[VNpu]) -> bool:
        assert chip.npu_id is not None
        for vnpu in vnpus:
            try:
                await destroy_vnpu(
                    self._npu_smi,
                    chip.npu_id,
                    chip.chip_on_card,
                    vnpu.vnpu_id,
                    self._settings.npu_smi_timeout,
                )
            except NpuSmiError as exc:
                log.error("vnpu: chip %d: %s; its other steps are skipped", chip.phys_id, exc)
                return False
            log.info("vnpu: destroyed vNPU %d (%s) on chip %d", vnpu.vnpu_id, vnpu.template, chip.phys_id)
        return True

    async def _undo_creates(self, chip: Chip, before: set[int], error: NpuSmiError) -> None:
        assert chip.npu_id is not None
        timeout = self._settings.npu_smi_timeout
        made: list[int] = []
        try:
            state = await query_vnpus(self._npu_smi, chip.npu_id, chip.chip_on_card, timeout)
            made = [v.vnpu_id for v in state.vnpus if v.vnpu_id not in before] if state else []
            for vnpu_id in made:
                await destroy_vnpu(self._npu_smi, chip.npu_id, chip.chip_on_card, vnpu_id, timeout)
        except NpuSmiError as exc:
            log.error(
                "vnpu: chip %d: %s; undoing this run's vNPUs %s failed too (%s): check npu-smi info -t "
                "info-vnpu -i %d -c %d",
                chip.phys_id, error, made, exc, chip.npu_id, chip.chip_on_card,
            )  # fmt: skip
            return
        log.error("vnpu: chip %d: %s; the chip is left as it was", chip.phys_id, error)


def _asked_key(chips: Sequence[Chip], nodes: Collection[str]) -> tuple[frozenset[int], frozenset[str]]:
    vnpu_nodes = frozenset(n for n in nodes if VNPU_NODE.match(n))
    return frozenset(chip.phys_id for chip in chips), vnpu_nodes


def _chip_of(node: str) -> int:
    """The physical id of the chip a ``vdavinci<id>`` node belongs to, by npu-smi's numbering."""
    return (int(node.removeprefix("vdavinci")) - VNPU_ID_BASE) // VNPU_IDS_PER_CHIP


def _managed(layout: Layout, chips: Sequence[Chip]) -> list[tuple[Chip, tuple[str, ...]]]:
    managed = []
    for chip in sorted(chips, key=lambda c: c.phys_id):
        wanted = templates_for(layout, chip)
        if wanted is not None and wanted != DYNAMIC:
            managed.append((chip, wanted))
    return managed


def _with_resources(vnpu: VNpu, template: Template | None) -> VNpu:
    if template is None:
        try:
            return replace(vnpu, aicore=template_cores(vnpu.template))
        except ValueError:
            return vnpu
    return replace(vnpu, aicore=template.aicore, memory_gb=template.memory_gb, aicpu=template.aicpu)
