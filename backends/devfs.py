"""Real probing: ``npu-smi`` for the chips and their health, ``/dev`` for the device nodes, sysfs for the NUMA
node and PCIe root (the gauges the answers feed are kept by :mod:`~ascend_agent.backends.telemetry`).

The chips are what npu-smi reports, matched to ``<dev-root>/davinci<phys id>``; a device node npu-smi does not
know is never invented. npu-smi runs once per health interval, beside the agent's loop (``query``); device
node changes arrive as inotify events and only re-read the directory (``discover``)::

    backend = DevfsBackend(Settings(host_root=Path("/host")))
    await backend.query()
    inventory = await backend.discover()
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import aiofiles
import aiofiles.os

from ascend_agent import naming
from ascend_agent.backends._container import container_base
from ascend_agent.backends.boards import CardBoards
from ascend_agent.backends.chipset import ChipSet, known_model
from ascend_agent.backends.devnodes import (
    CHIP_NODE,
    MANAGER,
    MANAGER_310B,
    SHORT_OF_RESOURCES,
    DeviceListing,
    is_device_name,
    management_devices,
)
from ascend_agent.backends.network import NetworkProbe, NetworkTarget
from ascend_agent.backends.npusmi import (
    InfoTable,
    NpuSmiError,
    NpuSmiParseError,
    Shape,
    a3_dies,
    parse_health,
    physical_ids,
)
from ascend_agent.backends.npusmi_reset import reset_chip
from ascend_agent.backends.pci import UNKNOWN, PciAddressError, PciFacts, read_pci_facts
from ascend_agent.backends.telemetry import ChipTelemetry
from ascend_agent.backends.tool import query_info, run_npu_smi
from ascend_agent.backends.training import TrainingProbe, TrainingTarget
from ascend_agent.backends.vnpu import VnpuProbe
from ascend_agent.config import HOT_RESET_IDLE, ConfigError, Settings
from ascend_agent.health.faults import describe
from ascend_agent.health.hotreset.command import ResetOutcome
from ascend_agent.model import (
    CarveFailed,
    Chip,
    Fault,
    Generation,
    Health,
    Inventory,
    VNpu,
    classify,
    normalise_model,
)
from ascend_agent.observability import (
    NPU_SMI_DOWN,
    NPU_SMI_FAILURES,
    NPU_SMI_SECONDS,
    ProblemLog,
    log_fields,
)
from ascend_agent.vnpu_layout import ChipPlan, HeldDevices, Layout

log = logging.getLogger(__name__)

# `npu-smi info -t health` runs per chip whose Health changed to something not OK, at most this many per
# query; the others are asked in the next queries.
HEALTH_QUERIES_PER_INTERVAL = 4
# A chip whose Health stays not OK is asked again after this many queries (its codes can change under an
# unchanged Alarm), one such chip per query: at most one more npu-smi per health interval, and per chip one
# every 15 s at the default interval.
FAULT_REFRESH_QUERIES = 3


@dataclass(frozen=True, slots=True)
class _Probed:
    """One chip as the last successful npu-smi query described it."""

    phys_id: int
    npu_id: int
    chip: int
    model: str
    generation: Generation
    health: str
    bus_id: str | None
    pci: PciFacts
    faults: tuple[Fault, ...] = ()
    hbm_mb: int | None = None
    processes: int | None = None


class DevfsBackend:
    """The Backend protocol over a real (or a test's temporary) host tree."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._dev_root = settings.effective_dev_root
        self._healthy_states = frozenset(state.lower() for state in settings.healthy_states)
        self._probed: dict[int, _Probed] = {}
        self._reported: frozenset[int] = frozenset()
        # Each chip's NUMA node and PCIe root by the bus id npu-smi gives, unknown ones too; and the chips
        # said to have no bus id.
        self._pci: dict[str, PciFacts] = {}
        self._without_bus_id: set[int] = set()
        # What npu-smi's slower commands said about the chip set last seen (their names, ids and SoC).
        self._chip_set = ChipSet(settings)
        self._boards = CardBoards(settings)
        self._failures = 0
        self._outage_cause = ""
        self._failure_log = ProblemLog()
        self._query_problem = ""
        self._driver_version: str | None = None
        self._listing = DeviceListing(self._dev_root)
        # Per chip: the Health `info -t health` was last run for, the faults it gave, and in which query.
        self._asked_health: dict[int, tuple[str, tuple[Fault, ...], int]] = {}
        self._queries = 0
        self._telemetry = ChipTelemetry()
        self._vnpus = VnpuProbe(settings)
        self._training = TrainingProbe(settings)
        self._network = NetworkProbe(settings)
        self._chip_list: tuple[Chip, ...] = ()
        # What the chips looked like when query() last returned: a change made between two queries (the A3
        # pairing read in its own task) is one too.
        self._last_view = self._view()

    @property
    def health_interval(self) -> float | None:
        return self._settings.health_interval

    def watch_paths(self) -> Sequence[tuple[Path, Callable[[str], bool]]]:
        return [(self._dev_root, is_device_name)]

    async def start(self) -> None:
        """An npu-smi or hccn_tool the operator named must be there and executable; only the default lookup
        may miss."""
        if self._settings.healthy_without_npu_smi:
            log.warning(
                "healthyWithoutNpuSmi is on: while npu-smi has not answered once, every chip is Healthy from "
                "its device file alone and no fault of a chip reaches the kubelet"
            )
        given = self._settings.npu_smi
        problem = _not_executable(given) if given is not None else ""
        if problem:
            raise ConfigError(
                f"--npu-smi {given}: {problem}; give the path of an executable npu-smi, or leave it unset "
                "to use npu-smi on PATH or <host-root>/usr/local/bin/npu-smi"
            )
        given = self._settings.hccn_tool
        problem = _not_executable(given) if given is not None else ""
        if problem:
            raise ConfigError(
                f"--hccn-tool {given}: {problem}; give the path of an executable hccn_tool, or leave it "
                "unset to use hccn_tool on PATH or <host-root>/usr/local/Ascend/driver/tools/hccn_tool"
            )
        if self._settings.hot_reset == HOT_RESET_IDLE:
            await self._refuse_guessed_pairs()

    async def _refuse_guessed_pairs(self) -> None:
        """``--hot-reset idle`` on A3 only where the driver said which card is reset with which: a reset
        takes the paired card down too, and a guessed one would have had its pods left unchecked. npu-smi not
        answering now tells nothing: the hot reset then resets no A3 chip until the pairing is read."""
        executable = self._settings.effective_npu_smi
        try:
            table = await query_info(executable, self._settings.npu_smi_timeout)
        except NpuSmiError:
            return
        await self._chip_set.learn(executable, table)
        if self._chip_set.pairing_problem:
            raise ConfigError(
                "--hot-reset idle: on Atlas A3 a chip's reset also resets the card the driver pairs with its "
                f"card, and the driver did not say which card that is ({self._chip_set.pairing_problem}); "
                "use --hot-reset dry-run to see what would be reset, and give the agent the host's "
                "/usr/local/dcmi and driver libraries, privileged, for idle"
            )

    async def query(self) -> bool:
        """One ``npu-smi info`` for every chip. A failure keeps the last known health; after
        ``health_failure_threshold`` failures in a row npu-smi is down (``Inventory.outage``): every chip is
        Unhealthy with its health unknown, not faulty, until a query succeeds.
        True when what the chips look like changed since the last query returned."""
        if await self._query():
            self._chip_set.retry_pairing()
            npu_ids = {chip.npu_id for chip in self._probed.values()}
            await self._boards.read_next(self._settings.effective_npu_smi, npu_ids)
            await self._check_device_listing()
            targets = self._training_targets()
            await self._training.refresh(targets, self._settings.health_interval)
            if self._settings.network_health:
                await self._network.refresh(self._network_targets(targets), self._settings.health_interval)
        view = self._view()
        changed, self._last_view = view != self._last_view, view
        return changed

    def _view(self) -> tuple[object, ...]:
        return (
            tuple(sorted(self._probed.items())),
            self._reported,
            self._outage(),
            self._query_problem,
            self._training.view(),
            self._network.view(),
            self._chip_set.pairing(),
            tuple(self._boards.of(npu_id) for npu_id in sorted({c.npu_id for c in self._probed.values()})),
        )

    def _outage(self) -> str:
        """Why npu-smi counts as down: ``health_failure_threshold`` failed queries in a row, or, before it
        ever answered, its first failure (nothing has confirmed any chip's health; unless
        ``healthy_without_npu_smi``); empty while it is not. Stable for the whole outage: the chips' reason
        and ``/readyz`` do not change per query."""
        if not self._probed:
            if not self._failures or self._settings.healthy_without_npu_smi:
                return ""
            return f"npu-smi has not answered yet: {self._outage_cause}"
        threshold = self._settings.health_failure_threshold
        if self._failures < threshold:
            return ""
        return f"npu-smi failed {threshold} times in a row: {self._outage_cause}"

    def _training_targets(self) -> list[TrainingTarget]:
        """The chips npu-smi reported in this query, each answering while it is healthy."""
        return [
            TrainingTarget(
                phys_id,
                chip.npu_id,
                chip.chip,
                chip.generation,
                answering=phys_id in self._reported and self._chip_healthy(chip),
            )
            for phys_id, chip in sorted(self._probed.items())
        ]

    def _network_targets(self, targets: Sequence[TrainingTarget]) -> list[NetworkTarget]:
        """The answering chips that have a device IP: the ones whose network a training job would use."""
        return [
            NetworkTarget(t.phys_id, self._device_id(self._probed[t.phys_id]))
            for t in targets
            if t.answering and self._training.facts(t.phys_id).device_ip is not None
        ]

    async def _query(self) -> bool:
        """Run and read npu-smi; False (and counted) when it failed."""
        executable = self._settings.effective_npu_smi
        started = time.perf_counter()
        try:
            table = await query_info(executable, self._settings.npu_smi_timeout)
            await self._chip_set.learn(executable, table)
            probed = {chip.phys_id: chip for chip in await self._probe(table)}
            probed = await self._with_faults(executable, table.shape, probed)
        except OSError as exc:
            NPU_SMI_SECONDS.observe(time.perf_counter() - started)
            NPU_SMI_FAILURES.labels(reason="resources").inc()
            self._failed(NpuSmiError("resources", f"health query: {exc.strerror or exc}", SHORT_OF_RESOURCES))
            return False
        except NpuSmiError as exc:
            NPU_SMI_SECONDS.observe(time.perf_counter() - started)
            NPU_SMI_FAILURES.labels(reason=exc.reason).inc()
            self._failed(exc)
            return False
        NPU_SMI_SECONDS.observe(time.perf_counter() - started)
        if self._failures:
            log.info(
                "npu-smi answers again after %d failed queries",
                self._failures,
                extra=log_fields(count=self._failures),
            )
        NPU_SMI_DOWN.set(0)
        self._failures, self._query_problem = 0, ""
        self._failure_log.clear()
        gone = self._reported - set(probed)
        if gone:
            log.warning(
                "npu-smi no longer reports chips %s; they stay listed as Unhealthy",
                sorted(gone),
                extra=log_fields(ids=gone, reason="npu-smi no longer reports them"),
            )
        self._report_faults(probed)
        self._probed.update(probed)
        self._reported = frozenset(probed)
        self._record_telemetry(table, probed)
        self._driver_version = table.version
        return True

    async def _check_device_listing(self) -> None:
        """Read /dev as part of a health query whose npu-smi answered: a listing that fails for want of
        descriptors or memory counts as a failed query (the last known device nodes stay)."""
        await self._listing.names()
        if self._listing.error is not None:
            NPU_SMI_FAILURES.labels(reason="resources").inc()
            self._failed(
                NpuSmiError(
                    "resources",
                    f"cannot list {self._dev_root}: {self._listing.error.strerror or self._listing.error}",
                    SHORT_OF_RESOURCES,
                )
            )

    async def _with_faults(
        self, executable: str, shape: Shape, probed: Mapping[int, _Probed]
    ) -> dict[int, _Probed]:
        """The chips with the error codes of those whose Health is not OK: ``npu-smi info -t health`` runs
        once per change of a chip's Health, and again every ``FAULT_REFRESH_QUERIES`` queries while it stays
        not OK (one such chip per query, the one asked longest ago); never for a chip that is OK."""
        self._queries += 1
        for phys_id in [p for p, chip in probed.items() if chip.health.upper() == "OK"]:
            self._asked_health.pop(phys_id, None)
        sick = [phys_id for phys_id, chip in probed.items() if chip.health.upper() != "OK"]
        changed = [
            p for p in sick if p not in self._asked_health or self._asked_health[p][0] != probed[p].health
        ]
        stale = sorted(
            (
                p
                for p in sick
                if p not in changed and self._queries - self._asked_health[p][2] >= FAULT_REFRESH_QUERIES
            ),
            key=lambda p: self._asked_health[p][2],
        )
        for phys_id in (changed + stale[:1])[:HEALTH_QUERIES_PER_INTERVAL]:
            chip = probed[phys_id]
            self._asked_health[phys_id] = (
                chip.health,
                await self._faults(executable, shape, chip),
                self._queries,
            )
        result = {}
        for phys_id, chip in probed.items():
            known = self._asked_health.get(phys_id)
            result[phys_id] = replace(chip, faults=known[1]) if known is not None else chip
        return result

    async def _faults(self, executable: str, shape: Shape, chip: _Probed) -> tuple[Fault, ...]:
        # Ascend 950's npu-smi rejects -c; its NPU id names the chip.
        args = ["info", "-t", "health", "-i", str(chip.npu_id)]
        if shape is not Shape.NPU_ID:
            args += ["-c", str(chip.chip)]
        try:
            return parse_health(await run_npu_smi(executable, args, self._settings.npu_smi_timeout)).faults
        except (NpuSmiError, NpuSmiParseError) as exc:
            log.info("npu-smi %s gave no error codes: %s", " ".join(args), exc)
            return ()

    def _device_id(self, chip: _Probed) -> str:
        family = naming.family_for(chip.generation.family, chip.model, self._settings.resource_naming)
        return naming.device_id(family, chip.phys_id)

    def _report_faults(self, probed: Mapping[int, _Probed]) -> None:
        """Log each chip's error codes once per change (``ascend_agent_chip_fault`` is the report's, once
        they are graded)."""
        for phys_id, chip in probed.items():
            device = self._device_id(chip)
            before = self._probed.get(phys_id)
            if before is not None and before.faults == chip.faults:
                continue
            # The codes are graded, and logged, by the agent's fault table (ascend_agent.health.grading).
            if not chip.faults and before is not None and before.faults:
                log.info("%s reports no error code any more (health %s)", device, chip.health)

    def _record_telemetry(self, table: InfoTable, probed: Mapping[int, _Probed]) -> None:
        rows = {}
        for row, phys_id in zip(table.chips, physical_ids(table.chips, self._chip_set.chip_map), strict=True):
            chip = probed.get(phys_id)
            if chip is not None:
                rows[self._device_id(chip)] = row
        self._telemetry.record(rows)

    def _chip_healthy(self, chip: _Probed) -> bool:
        """A chip with fault codes is graded by its codes' classes (ascend_agent.health.grading); one without
        by the Health column (``healthyStates``)."""
        return bool(chip.faults) or chip.health.lower() in self._healthy_states

    def _failed(self, error: NpuSmiError) -> None:
        self._failures += 1
        threshold = self._settings.health_failure_threshold
        reason = str(error)
        changed = self._failure_log.changed(reason)
        if changed and self._probed:
            # One failed query changes nothing anybody sees; npu-smi down (the threshold) is the warning.
            log.info(
                "Health query failed, keeping the last known health: %s",
                reason,
                extra=log_fields(reason=reason),
            )
        if not self._probed:
            self._never_answered(error, reason, changed)
        elif self._failures == threshold:
            self._outage_cause = reason
            NPU_SMI_DOWN.set(1)
            log.warning(
                "npu-smi failed %d times in a row: npu-smi is down, not the chips; every chip is Unhealthy "
                "(health unknown, not a chip fault) until it answers: %s",
                threshold,
                reason,
                extra=log_fields(count=threshold, reason=reason),
            )

    def _never_answered(self, error: NpuSmiError, reason: str, changed: bool) -> None:
        """A failure before npu-smi ever answered: no source has confirmed any chip's health. Without
        ``model:`` the chips are not even known; with it they are Unhealthy, health unknown, unless
        ``healthy_without_npu_smi`` lets the node run on its device files alone."""
        if self._failures == 1:
            self._outage_cause = reason
        if self._settings.model is None:
            # A failure npu-smi explained already names the next step; any other leaves the model unknown.
            self._query_problem = (
                reason
                if error.next_step
                else (
                    f"{reason}; without npu-smi the chip model is unknown: install the driver's npu-smi, "
                    "pass --npu-smi, or set model: in the config file"
                )
            )
        else:
            self._query_problem = reason
        # A fact about npu-smi, whatever healthy_without_npu_smi makes of the chips: the one alert for a node
        # that runs on its device files alone.
        NPU_SMI_DOWN.set(1)
        if not changed or self._settings.model is None:
            return  # said already, or the problem says it: no chip is listed
        if self._settings.healthy_without_npu_smi:
            log.warning(
                "npu-smi has not answered yet (%s): the chips are Healthy from their device files alone "
                "(healthyWithoutNpuSmi), no fault of theirs is seen",
                reason,
                extra=log_fields(reason=reason),
            )
        else:
            log.warning(
                "npu-smi has not answered yet: every chip is Unhealthy (health unknown: nothing confirmed "
                "it) until it answers: %s; to run on the device files alone, set healthyWithoutNpuSmi: true",
                reason,
                extra=log_fields(reason=reason),
            )

    async def reset_chip(self, chip: Chip, timeout: float) -> ResetOutcome:
        """The in-band reset of ``chip`` with npu-smi (``set -t reset -i <npu id> -c <chip> -m 1``)."""
        npu_id = chip.npu_id if chip.npu_id is not None else chip.phys_id
        return await reset_chip(self._settings.effective_npu_smi, npu_id, chip.chip_on_card, timeout)

    async def _probe(self, table: InfoTable) -> list[_Probed]:
        probed = []
        rows = table.chips
        dies = a3_dies(table)
        names = {
            (row.npu_id, row.chip_id): row.name for row in self._chip_set.chip_map if row.logic_id is not None
        }
        for index, (row, phys_id) in enumerate(
            zip(rows, physical_ids(rows, self._chip_set.chip_map), strict=True)
        ):
            name = row.name if known_model(row.name) else names.get((row.npu_id, row.chip), "")
            if index in dies:
                model: str | None = self._chip_set.a3_model
            else:
                model = normalise_model(name) if known_model(name) else self._settings.model
            if model is None or not known_model(model):
                raise NpuSmiError(
                    "output",
                    f"cannot tell the model of NPU {row.npu_id} from its name {row.name!r}; "
                    "set model: in the config file",
                )
            probed.append(
                _Probed(
                    phys_id=phys_id,
                    npu_id=row.npu_id,
                    chip=row.chip,
                    model=model,
                    generation=classify(model),
                    health=row.health,
                    bus_id=row.bus_id,
                    pci=await self._pci_facts(phys_id, row.bus_id),
                    hbm_mb=row.hbm_total_mb or None,
                    processes=table.processes.count(row.npu_id, row.chip),
                )
            )
        return probed

    async def _pci_facts(self, phys_id: int, bus_id: str | None) -> PciFacts:
        """The NUMA node and PCIe root of a chip; read once per bus id, known or not, as they cannot change
        while the device is up. A chip whose PCI address cannot be read has neither, said once."""
        if not bus_id:
            if phys_id not in self._without_bus_id:
                self._without_bus_id.add(phys_id)
                self._no_pci_facts(phys_id, "npu-smi gives no bus id for it")
            return UNKNOWN
        if bus_id in self._pci:
            return self._pci[bus_id]
        try:
            facts = await read_pci_facts(self._settings.effective_sys_root, bus_id)
        except OSError:
            return UNKNOWN  # out of descriptors or memory now: ask again next query
        except PciAddressError as exc:
            self._no_pci_facts(phys_id, str(exc))
            facts = UNKNOWN
        if facts.root_problem:
            log.info(
                "Chip %d: %s; its PCIe root is unknown, so its DRA devices leave out the standard attribute "
                "resource.kubernetes.io/pcieRoot",
                phys_id,
                facts.root_problem,
                extra=log_fields(ids=[phys_id], reason=facts.root_problem),
            )
        self._pci[bus_id] = facts
        return facts

    @staticmethod
    def _no_pci_facts(phys_id: int, reason: str) -> None:
        log.info(
            "Chip %d: %s; its NUMA node and PCIe root are unknown, so its DRA devices leave out the standard "
            "attributes resource.kubernetes.io/pcieRoot and resource.kubernetes.io/numaNode",
            phys_id,
            reason,
            extra=log_fields(ids=[phys_id], reason=reason),
        )

    async def discover(self) -> Inventory:
        nodes = await self._listing.names()
        mounts = [
            path for path in self._settings.driver_mounts if await aiofiles.os.path.exists(self._host(path))
        ]
        container = container_base(self._settings.mode, management_devices(nodes, self._is_310b()), mounts)
        problems = [self._query_problem] if self._query_problem else []
        chips = self._chips(nodes)
        # npu-smi runs here only when /dev/vdavinci* nodes (or the chips) changed since it was last asked.
        if self._probed:
            await self._vnpus.refresh_if_stale(chips, nodes)
        self._chip_list = chips
        chips = self._vnpus.unread(chips)
        if not any(CHIP_NODE.match(name) for name in nodes):
            problems.append(
                f"no /dev/davinci* device files under {self._dev_root}: the Ascend driver or firmware is not "
                "installed or not loaded on this node; nothing in Kubernetes can fix that: check the driver "
                "(/usr/local/Ascend/driver/version.info) and run npu-smi info on the host"
            )
        elif MANAGER not in nodes and MANAGER_310B not in nodes:
            problems.append(
                f"{self._dev_root}/{MANAGER} is missing: every chip is Unhealthy until it returns"
            )
        return Inventory(
            chips=chips,
            problems=tuple(problems),
            container=container,
            driver_version=self._driver_version,
            vnpus=self._vnpus.slices(chips, nodes),
            outage=self._outage(),
            carvable=self._vnpus.carvable(chips),
        )

    # VnpuCarver (the DRA driver's dynamic vNPUs) ------------------------------------------------------
    def _chip(self, phys_id: int) -> Chip:
        chip = next((c for c in self._chip_list if c.phys_id == phys_id), None)
        if chip is None or chip.npu_id is None:
            raise NpuSmiError("exit", f"chip {phys_id} is not on this node or npu-smi gives no NPU id for it")
        return chip

    async def vnpus_now(self, phys_id: int) -> tuple[VNpu, ...]:
        try:
            return await self._vnpus.vnpus_now(self._chip(phys_id))
        except NpuSmiError as exc:
            raise CarveFailed(str(exc)) from None

    async def create_vnpu(self, phys_id: int, template: str, vnpu_id: int) -> None:
        try:
            await self._vnpus.create_one(self._chip(phys_id), template, vnpu_id)
        except NpuSmiError as exc:
            raise CarveFailed(str(exc)) from None

    async def destroy_vnpu(self, phys_id: int, vnpu_id: int) -> None:
        try:
            await self._vnpus.destroy_one(self._chip(phys_id), vnpu_id)
        except NpuSmiError as exc:
            raise CarveFailed(str(exc)) from None

    def forget_vnpus(self) -> None:
        """Ask npu-smi for the vNPUs again at the next discovery (SIGHUP)."""
        self._vnpus.forget()

    async def apply_vnpu_layout(
        self, layout: Layout, held: HeldDevices, *, run: bool
    ) -> tuple[ChipPlan, ...]:
        """Plan (and with ``run`` carry out) the ``vnpu:`` layout on the chips of the last discovery."""
        if not self._chip_list:
            await self.discover()
        return await self._vnpus.apply(layout, self._chip_list, held, self._listing.last, run=run)

    def _chips(self, nodes: set[str]) -> tuple[Chip, ...]:
        if not self._probed and self._settings.model is not None:
            phys_ids = sorted(int(m.group(1)) for m in map(CHIP_NODE.match, nodes) if m)
            return tuple(self._fallback_chip(phys_id, nodes) for phys_id in phys_ids)
        manager = MANAGER in nodes or MANAGER_310B in nodes
        outage = self._outage()
        chips = []
        for phys_id in sorted(self._probed):
            probed = self._probed[phys_id]
            facts = self._training.facts(phys_id)
            board = self._boards.of(probed.npu_id)
            chip = Chip(
                phys_id,
                probed.model,
                probed.generation,
                bus_id=probed.bus_id,
                firmware_version=board.firmware_version,
                serial=board.serial,
                numa_node=probed.pci.numa_node,
                pcie_root=probed.pci.pcie_root,
                npu_id=probed.npu_id,
                naming_scheme=self._settings.resource_naming,
                faults=probed.faults,
                health_status=probed.health,
                hbm_mb=probed.hbm_mb,
                chip_on_card=probed.chip,
                device_ip=facts.device_ip,
                vnic_ip=facts.vnic_ip,
                super_pod=facts.super_pod,
                network_fault=self._network.fault(phys_id),
                processes=probed.processes,
                logic_id=self._chip_set.logic_ids.get((probed.npu_id, probed.chip)),
                board_id=self._chip_set.board_id if probed.generation is Generation.ASCEND910B else None,
                paired_card=(
                    self._chip_set.paired_cards.get(probed.npu_id)
                    if probed.generation is Generation.ASCEND910A3
                    else None
                ),
            )
            reason = ""
            if f"davinci{phys_id}" not in nodes:
                reason = f"device node {chip.device_path} is missing"
            elif phys_id not in self._reported:
                reason = "npu-smi no longer reports this chip"
            elif not manager:
                reason = f"/dev/{MANAGER} is missing"
            elif outage:
                chip = replace(chip, health_unknown=True)
                reason = f"health unknown: {outage}"
            elif not self._chip_healthy(probed):
                reason = describe(probed.health, probed.faults)
            chips.append(chip.with_health(Health.UNHEALTHY, reason) if reason else chip)
        return tuple(chips)

    def _fallback_chip(self, phys_id: int, nodes: set[str]) -> Chip:
        """A chip known only from its device node and the configured model (npu-smi has not answered): its
        health unknown, so Unhealthy, unless ``healthy_without_npu_smi``."""
        assert self._settings.model is not None
        chip = Chip.make(
            phys_id,
            self._settings.model,
            naming_scheme=self._settings.resource_naming,
        )
        if MANAGER not in nodes and MANAGER_310B not in nodes:
            return chip.with_health(Health.UNHEALTHY, f"/dev/{MANAGER} is missing")
        outage = self._outage()
        if outage:
            unknown = replace(chip, health_unknown=True)
            return unknown.with_health(Health.UNHEALTHY, f"health unknown: {outage}")
        return chip

    def _is_310b(self) -> bool:
        return any(chip.generation is Generation.ASCEND310B for chip in self._probed.values())

    def _host(self, path: str) -> Path:
        """A host absolute path as the agent sees it, under ``--host-root``."""
        return self._settings.host_root / path.lstrip("/")

    def take_over(self, previous: object) -> None:
        """A reload's new backend: each link's outage goes on, so that the debounce is not started again."""
        if isinstance(previous, DevfsBackend):
            self._network.take_over(previous._network)

    async def close(self) -> None:
        await self._chip_set.close()


def _not_executable(given: str) -> str:
    """What is wrong with running ``given`` (a path, or a name looked up on PATH); empty when nothing."""
    if "/" not in given:
        return "" if shutil.which(given) else "not found on PATH"
    if not os.path.exists(given):
        return "no such file"
    if os.path.isdir(given):
        return "is a directory"
    if not os.access(given, os.X_OK):
        return "not executable"
    return ""
