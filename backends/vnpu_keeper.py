"""The ``vnpu:`` layout kept on the chips of whichever backend runs: applied at start, on a config reload and
at each health interval while it waits (a vNPU it would destroy is held, or a chip's vNPUs could not be
read); each refusal logged once; a backend that makes no vNPUs ignores it with one warning::

    keeper = VnpuLayoutKeeper(holdings.held_devices)
    keeper.on_ran = agent.wake                            # npu-smi commands ran: the chips changed
    await keeper.apply(backend, settings)                 # at start and after a reload (fresh=True)
    if keeper.pending:                                    # at each health interval
        await keeper.apply(backend, settings, fresh=True, quiet=True)

Before the agent runs, :func:`plans_now` says what a layout needs now without running anything (a layout the
chips cannot hold stops the start; ``--dry-run-vnpu`` prints it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ascend_agent.backends import Backend, VnpuCarver, VnpuLayoutBackend
from ascend_agent.config import ConfigError, Settings
from ascend_agent.vnpu_layout import ChipPlan, HeldDevices, Layout, LayoutRefused, dynamic_entries

log = logging.getLogger(__name__)


def nothing_held() -> frozenset[str]:
    """No device is held by a container, as far as the agent knows without the kubelet's view."""
    return frozenset()


class VnpuLayoutKeeper:
    """Runs the layout over a backend; ``held_devices`` says which device IDs containers hold now (None while
    unknown): a held vNPU is never destroyed, nor a chip held whole split."""

    def __init__(self, held_devices: HeldDevices = nothing_held) -> None:
        self.held_devices = held_devices
        self.pending = False
        self.on_ran: Callable[[], None] = lambda: None
        self._refused: tuple[str, ...] = ()
        self._ignored: Layout | None = None

    async def apply(
        self, backend: Backend, settings: Settings, *, fresh: bool = False, quiet: bool = False
    ) -> tuple[ChipPlan, ...]:
        """Make the chips hold ``settings.vnpu``; with ``fresh``, npu-smi is asked for the vNPUs again first
        even without a layout (SIGHUP). A refused layout is logged once and nothing runs (at start,
        ``process.run_agent`` refuses it before: exit status 2); ``quiet`` leaves out the line that says
        nothing needed to run. Tells :attr:`on_ran` when npu-smi commands ran."""
        layout = settings.vnpu
        if not isinstance(backend, VnpuLayoutBackend):
            # A backend that carves dynamic chips for the DRA driver (fake) follows their entries itself.
            dynamic = dynamic_entries(layout) if isinstance(backend, VnpuCarver) else ()
            ignored = tuple(entry for entry in layout or () if entry not in dynamic) or None
            if ignored is not None and ignored != self._ignored:
                log.warning(
                    "vnpu: the %s backend does not create vNPUs, so the vnpu: layout %sis ignored (the fake "
                    "backend splits chips with --fake-vnpus 0:vir02,0:vir02)",
                    settings.backend,
                    "but for its dynamic chips " if dynamic else "",
                )
            self._ignored = ignored
            return ()
        if fresh:
            backend.forget_vnpus()
        if layout is None:
            self.pending = False
            return ()
        try:
            plans = await backend.apply_vnpu_layout(layout, self.held_devices, run=True)
        except LayoutRefused as exc:
            plans = ()
            refused: tuple[str, ...] = (str(exc),)
        else:
            refused = tuple(plan.refused for plan in plans if plan.refused)
        if refused != self._refused:
            for line in refused:
                log.error("%s", line)
            self._refused = refused
        # A chip npu-smi could not read is asked again at the next health interval; a layout the chips
        # cannot hold waits for a reload.
        by_layout = any(plan.refused and not plan.unread for plan in plans)
        self.pending = not by_layout and any(plan.in_use or plan.waiting or plan.unread for plan in plans)
        commands = sum(len(plan.commands()) for plan in plans)
        if commands:
            log.info("vnpu: layout applied with %d npu-smi commands", commands)
            self.on_ran()
        elif not refused and not quiet:
            log.info("vnpu: every chip holds its layout; nothing to run")
        return plans


async def plans_now(
    backend: VnpuLayoutBackend, layout: Layout, *, unread_ok: bool = False
) -> tuple[ChipPlan, ...]:
    """The layout's plans against the chips now, nothing run; :class:`ConfigError` with the first refusal
    (with ``unread_ok``, not for a chip whose vNPUs npu-smi could not give)."""
    try:
        plans = await backend.apply_vnpu_layout(layout, nothing_held, run=False)
    except LayoutRefused as exc:
        raise ConfigError(str(exc)) from None
    refused = next((plan.refused for plan in plans if plan.refused and not (unread_ok and plan.unread)), "")
    if refused:
        raise ConfigError(refused)
    return plans
