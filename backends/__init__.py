"""Hardware backends: the Backend protocol and the registry of implementations.

A backend supplies chips and what every container that gets some of them needs besides them; it knows nothing
of gRPC or the kubelet.
The built-in backends are known by name; any other is found through the ``ascend_agent.backends``
entry-point group, so a third party can add one::

    backend = load_backend("fake")(settings)
    inventory = await backend.discover()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ascend_agent.config import ConfigError
from ascend_agent.model import Inventory, VNpu

if TYPE_CHECKING:
    from ascend_agent.config import Settings
    from ascend_agent.vnpu_layout import ChipPlan, HeldDevices, Layout

ENTRY_POINT_GROUP = "ascend_agent.backends"
# The backends this package ships, as (module, class): a start reads no distribution's entry points for
# them. When a backend was imported while that read's objects were alive, the agent held 0.17 to 0.19 MiB
# more after registration (bench/cluster.py).
BUILT_IN = {
    "devfs": ("ascend_agent.backends.devfs", "DevfsBackend"),
    "fake": ("ascend_agent.backends.fake", "FakeBackend"),
}


class Backend(Protocol):
    """What the agent needs from a source of chips."""

    @property
    def health_interval(self) -> float | None:
        """Seconds between hardware health queries, or None when changes arrive only as file events."""

    async def start(self) -> None:
        """Check the configuration and prepare; :class:`ConfigError` for what the operator must fix."""

    def watch_paths(self) -> Sequence[tuple[Path, Callable[[str], bool]]]:
        """Directories, each with a filter of entry names, whose changes mean the chips may have changed."""

    async def query(self) -> bool:
        """Ask the hardware again (health, the chip list); slow, bounded by a timeout, never raises.
        The agent runs it beside its reconcile loop, every ``health_interval``; True when anything that
        ``discover`` reports may have changed."""

    async def discover(self) -> Inventory:
        """The chips now, and what every container that gets some of them gets besides them: the last
        hardware query combined with the cheap sources (device nodes, state files), read again on every
        call. No subprocess, but one: devfs asks npu-smi for a chip's vNPUs when its ``/dev/vdavinci*``
        nodes came or went, bounded by the npu-smi timeout."""

    async def close(self) -> None:
        """Release what the backend holds."""


@runtime_checkable
class VnpuLayoutBackend(Protocol):
    """A backend that can create and destroy vNPUs (devfs, through npu-smi)."""

    def forget_vnpus(self) -> None:
        """Ask the hardware for the vNPUs again at the next discovery."""

    async def apply_vnpu_layout(
        self, layout: Layout, held: HeldDevices, *, run: bool
    ) -> tuple[ChipPlan, ...]:
        """The plan of each chip the layout names, against the chips now; carried out with ``run`` unless
        a chip refuses its entry. Never destroys a vNPU that ``held`` names or npu-smi shows in use.
        ``vnpu_layout.LayoutRefused`` when the layout names a chip id the node does not have."""


@runtime_checkable
class VnpuCarver(Protocol):
    """A backend that carves vNPUs one at a time on the chips ``vnpu: {dynamic: true}`` makes dynamic, for the
    DRA driver's claims (devfs through npu-smi; fake in memory, on 310P chips). Each method raises
    :class:`~ascend_agent.model.CarveFailed` with the tool's words in one line."""

    async def vnpus_now(self, phys_id: int) -> tuple[VNpu, ...]: ...

    async def create_vnpu(self, phys_id: int, template: str, vnpu_id: int) -> None: ...

    async def destroy_vnpu(self, phys_id: int, vnpu_id: int) -> None: ...


@runtime_checkable
class Successor(Protocol):
    """A backend that goes on from what the one it replaces at a config reload learnt over time."""

    def take_over(self, previous: Backend) -> None:
        """Keep what ``previous`` saw that a first query cannot see again (devfs: a link's outage so far)."""


class BackendFactory(Protocol):
    def __call__(self, settings: Settings) -> Backend: ...


def backend_names() -> list[str]:
    """The built-in backends' names and those other distributions register."""
    from importlib.metadata import entry_points

    return sorted(set(BUILT_IN) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def load_backend(name: str) -> BackendFactory:
    """The built-in backend or the class registered under ``name`` (a built-in name cannot be taken);
    :class:`LookupError` names the known ones."""
    if name in BUILT_IN:
        module, attribute = BUILT_IN[name]
        built_in: BackendFactory = getattr(import_module(module), attribute)
        return built_in
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        factory: BackendFactory = ep.load()
        return factory
    raise LookupError(f"unknown backend {name!r} (known: {', '.join(backend_names())})")


def backend_for(settings: Settings) -> Backend:
    """The configured backend, not started; :class:`ConfigError` when no backend has that name."""
    try:
        return load_backend(settings.backend)(settings)
    except LookupError as exc:
        raise ConfigError(f"--backend: {exc.args[0]}") from None


async def discover_once(settings: Settings) -> Inventory:
    """One discovery with the configured backend, its fault codes graded by the built-in fault table and
    ``faultPolicy``, for ``ascend-agent list`` and the doctor. It reads no chip's network: one read cannot see
    a link down past the debounce (the running agent's ``/chips`` says which chips are network-unhealthy)."""
    from ascend_agent.config import HOT_RESET_DRY_RUN, HOT_RESET_IDLE
    from ascend_agent.health.grading import FaultGrading

    # They only look: a hot reset they refuse to start (idle on A3 without the driver's pairing) is the
    # agent's to refuse, not theirs.
    looking = HOT_RESET_DRY_RUN if settings.hot_reset == HOT_RESET_IDLE else settings.hot_reset
    backend = backend_for(replace(settings, network_health=False, hot_reset=looking))
    try:
        await backend.start()
        await backend.query()
        return FaultGrading.builtin(settings.fault_policy).apply(await backend.discover())
    finally:
        await backend.close()
