"""Real probing: ``npu-smi`` for the chips and their health, ``/dev`` for the device nodes, sysfs for NUMA.

The chips are what npu-smi reports, matched to ``<dev-root>/davinci<phys id>``; a device node npu-smi does not
know is never invented. npu-smi runs once per health interval, beside the agent's loop (``query``); device
node changes arrive as inotify events and only re-read the directory (``discover``)::

    backend = DevfsBackend(Settings(host_root=Path("/host")))
    await backend.query()
    inventory = await backend.discover()
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiofiles
import aiofiles.os

from ascend_agent.backends._container import container_spec
from ascend_agent.backends.npusmi import (
    ChipRow,
    NpuSmiError,
    NpuSmiParseError,
    parse_info_map,
    physical_ids,
    query_info,
    run_npu_smi,
)
from ascend_agent.config import Settings
from ascend_agent.model import (
    Chip,
    ContainerSpec,
    DeviceNode,
    Generation,
    Health,
    Inventory,
    UnknownModelError,
    classify,
    normalise_model,
    resource_family,
)
from ascend_agent.observability import NPU_SMI_FAILURES, NPU_SMI_SECONDS, log_fields

log = logging.getLogger(__name__)

_CHIP_NODE = re.compile(r"^davinci(\d+)$")
MANAGER = "davinci_manager"
# Shared management devices, handed to every container that gets a chip, each only if present.
_MANAGEMENT = (MANAGER, "devmm_svm", "hisi_hdc", "dvpp_cmdlist")
# 310B exposes its manager for containers under another name; it is mounted where the runtime expects it.
_MANAGER_310B = "davinci_manager_docker"


def is_device_name(name: str) -> bool:
    """The ``/dev`` entries whose appearance or loss changes what the node can offer."""
    return bool(_CHIP_NODE.match(name)) or name in _MANAGEMENT or name == _MANAGER_310B


@dataclass(frozen=True, slots=True)
class _Probed:
    """One chip as the last successful npu-smi query described it."""

    phys_id: int
    npu_id: int
    model: str
    generation: Generation
    health: str
    bus_id: str | None
    numa_node: int | None


class DevfsBackend:
    """The Backend protocol over a real (or a test's temporary) host tree."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._dev_root = settings.effective_dev_root
        self._healthy_states = frozenset(state.lower() for state in settings.healthy_states)
        self._probed: dict[int, _Probed] = {}
        self._reported: frozenset[int] = frozenset()
        self._numa: dict[str, int | None] = {}
        self._names: dict[tuple[int, int], str] = {}
        self._failures = 0
        self._last_failure = ""
        self._query_problem = ""
        self._management: tuple[DeviceNode, ...] = ()
        self._mounts: tuple[str, ...] = ()

    @property
    def health_interval(self) -> float | None:
        return self._settings.health_interval

    def watch_paths(self) -> Sequence[tuple[Path, Callable[[str], bool]]]:
        return [(self._dev_root, is_device_name)]

    async def start(self) -> None:
        return None

    async def query(self) -> bool:
        """One ``npu-smi info`` for every chip. A failure keeps the last known health; after
        ``health_failure_threshold`` failures in a row every chip is Unhealthy until a query succeeds.
        True when what the chips look like changed."""
        before = self._view()
        await self._query()
        return self._view() != before

    def _view(self) -> tuple[object, ...]:
        failing = self._failures >= self._settings.health_failure_threshold
        return tuple(sorted(self._probed.items())), self._reported, failing, self._query_problem

    async def _query(self) -> None:
        executable = self._settings.effective_npu_smi
        started = time.perf_counter()
        try:
            table = await query_info(executable, self._settings.npu_smi_timeout)
            if any(not _known_model(row.name) for row in table.chips) and not self._names:
                self._names = await self._chip_names(executable)
            probed = {chip.phys_id: chip for chip in await self._probe(table.chips)}
        except NpuSmiError as exc:
            NPU_SMI_SECONDS.observe(time.perf_counter() - started)
            NPU_SMI_FAILURES.labels(reason=exc.reason).inc()
            self._failed(str(exc))
            return
        NPU_SMI_SECONDS.observe(time.perf_counter() - started)
        if self._failures:
            log.info(
                "npu-smi answers again after %d failed queries",
                self._failures,
                extra=log_fields(count=self._failures),
            )
        self._failures, self._last_failure, self._query_problem = 0, "", ""
        gone = self._reported - set(probed)
        if gone:
            log.warning(
                "npu-smi no longer reports chips %s; they stay listed as Unhealthy",
                sorted(gone),
                extra=log_fields(ids=gone, reason="npu-smi no longer reports them"),
            )
        self._probed.update(probed)
        self._reported = frozenset(probed)

    def _failed(self, reason: str) -> None:
        self._failures += 1
        threshold = self._settings.health_failure_threshold
        if reason != self._last_failure:
            if self._probed:
                log.warning(
                    "Health query failed, keeping the last known health: %s",
                    reason,
                    extra=log_fields(reason=reason),
                )
            self._last_failure = reason
        if not self._probed:
            self._query_problem = (
                f"{reason}; without npu-smi the chip model is unknown: install the driver's npu-smi, "
                "pass --npu-smi, or set model: in the config file"
            )
        elif self._failures == threshold:
            log.warning(
                "npu-smi failed %d times in a row: every chip is Unhealthy until it answers",
                threshold,
                extra=log_fields(count=threshold, reason=reason),
            )

    async def _chip_names(self, executable: str) -> dict[tuple[int, int], str]:
        """Chip names from ``npu-smi info -m``, for tables whose Name column is redacted."""
        try:
            rows = parse_info_map(
                await run_npu_smi(executable, ["info", "-m"], self._settings.npu_smi_timeout)
            )
        except (NpuSmiError, NpuSmiParseError) as exc:
            log.debug("npu-smi info -m gave no chip names: %s", exc, extra=log_fields(reason=str(exc)))
            return {}
        return {(row.npu_id, row.chip_id): row.name for row in rows if row.logic_id is not None}

    async def _probe(self, rows: Sequence[ChipRow]) -> list[_Probed]:
        probed = []
        for row, phys_id in zip(rows, physical_ids(rows), strict=True):
            name = row.name if _known_model(row.name) else self._names.get((row.npu_id, row.chip), "")
            model = normalise_model(name) if _known_model(name) else self._settings.model
            if model is None or not _known_model(model):
                raise NpuSmiError(
                    "output",
                    f"cannot tell the model of NPU {row.npu_id} from its name {row.name!r}; "
                    "set model: in the config file",
                )
            probed.append(
                _Probed(
                    phys_id=phys_id,
                    npu_id=row.npu_id,
                    model=model,
                    generation=classify(model),
                    health=row.health,
                    bus_id=row.bus_id,
                    numa_node=await self._numa_node(row.bus_id),
                )
            )
        return probed

    async def _numa_node(self, bus_id: str | None) -> int | None:
        """The NUMA node of a PCI device; read once per bus id, present or not, as it cannot change while
        the device is up."""
        if not bus_id:
            return None
        if bus_id in self._numa:
            return self._numa[bus_id]
        path = self._settings.effective_sys_root / "bus/pci/devices" / bus_id.lower() / "numa_node"
        try:
            async with aiofiles.open(path) as handle:
                node = int((await handle.read()).strip())
        except (OSError, ValueError):
            node = -1  # what sysfs says for no NUMA node; asking again every health query would not change it
        self._numa[bus_id] = node if node >= 0 else None
        return self._numa[bus_id]

    async def discover(self) -> Inventory:
        nodes = await self._device_nodes()
        self._management = self._management_devices(nodes, self._is_310b())
        self._mounts = tuple(
            [path for path in self._settings.driver_mounts if await aiofiles.os.path.exists(self._host(path))]
        )
        problems = [self._query_problem] if self._query_problem else []
        chips = self._chips(nodes)
        if not any(_CHIP_NODE.match(name) for name in nodes):
            problems.append(
                f"no /dev/davinci* device files under {self._dev_root}: the Ascend driver or firmware is not "
                "installed or not loaded on this node; nothing in Kubernetes can fix that: check the driver "
                "(/usr/local/Ascend/driver/version.info) and run npu-smi info on the host"
            )
        elif MANAGER not in nodes and _MANAGER_310B not in nodes:
            problems.append(
                f"{self._dev_root}/{MANAGER} is missing: every chip is Unhealthy until it returns"
            )
        return Inventory(chips=chips, management_devices=self._management, problems=tuple(problems))

    def _chips(self, nodes: set[str]) -> tuple[Chip, ...]:
        if not self._probed and self._settings.model is not None:
            phys_ids = sorted(int(m.group(1)) for m in map(_CHIP_NODE.match, nodes) if m)
            return tuple(self._fallback_chip(phys_id, nodes) for phys_id in phys_ids)
        manager = MANAGER in nodes or _MANAGER_310B in nodes
        failing = self._failures >= self._settings.health_failure_threshold
        chips = []
        for phys_id in sorted(self._probed):
            probed = self._probed[phys_id]
            chip = Chip(
                phys_id,
                probed.model,
                probed.generation,
                bus_id=probed.bus_id,
                numa_node=probed.numa_node,
                npu_id=probed.npu_id,
                resource_family=resource_family(probed.model, self._settings.resource_naming),
            )
            reason = ""
            if f"davinci{phys_id}" not in nodes:
                reason = f"device node {chip.device_path} is missing"
            elif phys_id not in self._reported:
                reason = "npu-smi no longer reports this chip"
            elif not manager:
                reason = f"/dev/{MANAGER} is missing"
            elif failing:
                reason = f"npu-smi failed {self._failures} times in a row: {self._last_failure}"
            elif probed.health.lower() not in self._healthy_states:
                reason = f"npu-smi reports health {probed.health}"
            chips.append(chip.with_health(Health.UNHEALTHY, reason) if reason else chip)
        return tuple(chips)

    def _fallback_chip(self, phys_id: int, nodes: set[str]) -> Chip:
        """A chip known only from its device node and the configured model (npu-smi is not usable)."""
        assert self._settings.model is not None
        chip = Chip.make(
            phys_id,
            self._settings.model,
            resource_family=resource_family(self._settings.model, self._settings.resource_naming),
        )
        if MANAGER not in nodes and _MANAGER_310B not in nodes:
            return chip.with_health(Health.UNHEALTHY, f"/dev/{MANAGER} is missing")
        return chip

    async def _device_nodes(self) -> set[str]:
        try:
            names = await aiofiles.os.listdir(self._dev_root)
        except OSError:
            return set()
        return {name for name in names if is_device_name(name)}

    def _is_310b(self) -> bool:
        return any(chip.generation is Generation.ASCEND310B for chip in self._probed.values())

    @staticmethod
    def _management_devices(nodes: set[str], is_310b: bool) -> tuple[DeviceNode, ...]:
        devices = [
            DeviceNode(host_path=f"/dev/{name}", container_path=f"/dev/{name}") for name in _MANAGEMENT
        ]
        if _MANAGER_310B in nodes and (is_310b or MANAGER not in nodes):
            devices[0] = DeviceNode(host_path=f"/dev/{_MANAGER_310B}", container_path=f"/dev/{MANAGER}")
        return tuple(device for device in devices if device.host_path.removeprefix("/dev/") in nodes)

    def _host(self, path: str) -> Path:
        """A host absolute path as the agent sees it, under ``--host-root``."""
        return self._settings.host_root / path.lstrip("/")

    def container_spec(self, chips: Sequence[Chip]) -> ContainerSpec:
        return container_spec(
            chips, mode=self._settings.mode, management_devices=self._management, driver_mounts=self._mounts
        )

    async def close(self) -> None:
        return None


def _known_model(name: str) -> bool:
    try:
        classify(name)
    except UnknownModelError:
        return False
    return True
