"""Synthetic chips with scriptable faults, for development and CI.

``--fake-chips 8 --fake-model 910B4`` gives eight healthy chips split over two NUMA nodes, each node's chips
under a PCIe root complex of its own (``pci0000:00``, ``pci0000:80``); a state file (``--fake-state``) scripts
faults, re-read on every discovery::

    {"unhealthy": [3], "absent": [7]}

A chip's fault codes are scripted as npu-smi's ``info -t health`` would report them, and graded by the
agent's fault table like a real chip's (fault classes, Events, the hot reset and its dry run)::

    {"faults": {"5": ["0x8C03A000"]}}

``--fake-vnpus 0:vir02,0:vir02`` splits chips into vNPUs (IDs from ``phys*16+100``, as npu-smi numbers
them); a state file's ``"vnpus": {"0": ["vir02"]}`` replaces that list while it is there.

With ``vnpu: {dynamic: true}`` (or a chip's own ``{dynamic: true}`` entry) a 310P chip is dynamic: the DRA
driver carves vNPUs on it for the claims it prepares (:class:`~ascend_agent.backends.VnpuCarver`), kept in
memory as npu-smi would keep them (gone when the agent restarts, as after a reboot), with the templates and
totals npu-smi gives a 310P3 (8 AI cores, 21 GB, 7 AI CPUs; vir01 to vir04_4c_dvpp).

``--fake-training`` gives each chip of a model that trains (910, 910B, A3) a synthetic device IP from the
benchmarking range 198.18.0.0/15 (chip N: ``198.18.0.0 + N + 1``) and, on A3, a vNIC IP
(``198.19.0.0 + N + 1``) and a place in super pod 0 (server index 0, SDID N); off, chips have none, as on a
node without hccn_tool.

An absent chip stays listed as Unhealthy, as a chip that fell off the bus does on a real node. The file
must exist when the backend starts; one removed later, or turned invalid, leaves the previous state in place.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import aiofiles

from ascend_agent.backends._container import container_base
from ascend_agent.config import ConfigError, Settings, decode_utf8, fake_vnpus
from ascend_agent.health.faulttable import code_text, parse_code
from ascend_agent.model import (
    NO_PAIRED_CARD,
    VNPU_ID_BASE,
    VNPU_IDS_PER_CHIP,
    Carvable,
    CarveFailed,
    Chip,
    DeviceNode,
    Fault,
    Generation,
    Health,
    Inventory,
    SuperPod,
    UnknownModelError,
    VNpu,
    classify,
    is_chip_id,
)
from ascend_agent.observability import ProblemLog, log_fields
from ascend_agent.vnpu_layout import (
    TEMPLATES_310P3,
    Layout,
    dynamic_entries,
    is_dynamic,
    parse_layout,
    template_cores,
)

log = logging.getLogger(__name__)

_MANAGEMENT_DEVICES = tuple(
    DeviceNode(host_path=path, container_path=path)
    for path in ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
)
_NUMA_NODES = 2
# The PCIe root complex of each NUMA node's chips, as a two-socket server's sysfs names them.
_PCIE_ROOTS = ("pci0000:00", "pci0000:80")
# HBM per chip (die on A3) in MiB, as npu-smi's table prints it; 310 chips have none.
_HBM_MB = {
    Generation.ASCEND910A: 32768,
    Generation.ASCEND910B: 65536,
    Generation.ASCEND910A3: 65536,
    Generation.ASCEND950: 131072,
}
_HBM_MB_BY_MODEL = {"910B4": 32768}
# DCMI pairs A3 cards four apart within each board of 8 (0 with 4, 1 with 5, ...; 8 with 12) where cards
# share network ports: card n's brother is n XOR 4, a pairing that is its own inverse.
A3_PAIR_BIT = 4
# --fake-training: addresses from the benchmarking range (RFC 2544), never a real network's.
_DEVICE_IPS = ipaddress.IPv4Address("198.18.0.0")
_VNIC_IPS = ipaddress.IPv4Address("198.19.0.0")


# A 310P3's totals (info-vnpu; pngd is NA there): what a dynamic fake 310P carves its templates from.
_310P_TOTALS = (
    ("aicore", 8),
    ("memory", 21),
    ("aicpu", 7),
    ("vpc", 12),
    ("venc", 3),
    ("vdec", 12),
    ("jpegd", 16),
    ("jpege", 4),
)

# The Health column of a chip that reports fault codes (npu-smi asks `info -t health` only for such one).
_FAULT_COLUMN = "Alarm"
# Fault codes one chip of the state file may report (npu-smi's `info -t health` lists a handful).
MAX_CODES_PER_CHIP = 16


@dataclass(frozen=True, slots=True)
class FaultState:
    """The faults a state file scripts: physical ids that are unhealthy or absent, and each chip's fault
    codes (npu-smi's form: upper-case hex, at least 8 digits)."""

    unhealthy: frozenset[int] = frozenset()
    absent: frozenset[int] = frozenset()
    vnpus: Layout | None = None
    faults: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def codes(self, phys_id: int) -> tuple[str, ...]:
        return next((codes for chip, codes in self.faults if chip == phys_id), ())

    @property
    def named(self) -> frozenset[int]:
        """Every physical id the state names."""
        return self.unhealthy | self.absent | {chip for chip, _ in self.faults}


def parse_state(text: str, source: str) -> FaultState:
    """``{"unhealthy": [..], "absent": [..]}``; :class:`ValueError` says what is wrong with ``source``."""
    try:
        document = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"fake state file {source} is not valid JSON (line {exc.lineno})") from None
    except RecursionError:
        raise ValueError(f"fake state file {source} is nested too deep to be a state file") from None
    if not isinstance(document, dict):
        raise ValueError(
            f'fake state file {source} must be an object like {{"unhealthy": [1], "absent": []}}'
        )
    unknown = set(document) - {"unhealthy", "absent", "vnpus", "faults"}
    if unknown:
        raise ValueError(
            f"fake state file {source}: unknown key {sorted(unknown)[0]!r:.40} (keys: unhealthy, absent, "
            "vnpus, faults)"
        )
    lists: dict[str, frozenset[int]] = {}
    for key in ("unhealthy", "absent"):
        ids = document.get(key, [])
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"fake state file {source}: {key} must be a list of physical ids")
        lists[key] = frozenset(ids)
    vnpus = None
    if "vnpus" in document:
        try:
            vnpus = fake_vnpus(document["vnpus"])
        except ValueError as exc:
            raise ValueError(f"fake state file {source}: vnpus {exc}") from None
    return FaultState(**lists, vnpus=vnpus, faults=_faults(document.get("faults", {}), source))


def _faults(value: object, source: str) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """``{"5": ["0x8C03A000", "80E18402"]}``: each chip's fault codes, by physical id."""
    shape = (
        f"fake state file {source}: faults must map physical ids to lists of fault codes, "
        'e.g. {"5": ["8C03A000"]}'
    )
    if not isinstance(value, dict):
        raise ValueError(shape)
    faults = []
    for key, codes in value.items():
        if not is_chip_id(key):
            raise ValueError(f"{shape}; {key!r:.40} is not a physical id")
        if not isinstance(codes, list) or not all(isinstance(code, str) for code in codes):
            raise ValueError(shape)
        if len(codes) > MAX_CODES_PER_CHIP:
            raise ValueError(
                f"fake state file {source}: faults of chip {key} has {len(codes)} codes; at most "
                f"{MAX_CODES_PER_CHIP}"
            )
        try:
            numbers = [parse_code(code) for code in codes]
        except ValueError as exc:
            raise ValueError(f"fake state file {source}: faults of chip {key}: {exc!s:.80}") from None
        faults.append((int(key), tuple(dict.fromkeys(code_text(number) for number in numbers))))
    return tuple(sorted(faults))


class FakeBackend:
    """The Backend protocol over synthetic chips."""

    def __init__(self, settings: Settings) -> None:
        try:
            classify(settings.fake_model)
        except UnknownModelError:
            raise ConfigError(
                f"--fake-model {settings.fake_model!r} is not an Ascend chip "
                "(try 910B4, 910A, 910_9392, 950PR, 310P3, 310)"
            ) from None
        for _, templates in settings.fake_vnpus or ():
            try:
                parse_layout({settings.fake_model: list(templates)})
            except ValueError as exc:
                raise ConfigError(f"--fake-vnpus: {exc}") from None
        self._settings = settings
        # A3 boards have two dies per NPU id; every other model one chip per NPU id.
        self._dies_per_npu = 2 if classify(settings.fake_model) is Generation.ASCEND910A3 else 1
        self._state = FaultState()
        self._state_problem = ProblemLog()
        self._out_of_range = ProblemLog()
        self._carved: dict[int, list[VNpu]] = {}  # the dynamic vNPUs made, by physical id
        if dynamic_entries(settings.vnpu) and classify(settings.fake_model) is not Generation.ASCEND310P:
            log.warning(
                "vnpu: the fake backend carves dynamic vNPUs on 310P chips only (--fake-model 310P3); its %s "
                "chips are published whole",
                settings.fake_model,
            )

    @property
    def health_interval(self) -> float | None:
        return None

    def watch_paths(self) -> Sequence[tuple[Path, Callable[[str], bool]]]:
        state = self._settings.fake_state
        if state is None:
            return []
        return [(state.parent, lambda name: name == state.name)]

    async def query(self) -> bool:
        return False

    async def start(self) -> None:
        await self._load_state()

    async def _load_state(self) -> None:
        """Read the state file, raising :class:`ConfigError` when it is missing, unreadable or invalid."""
        path = self._settings.fake_state
        if path is None:
            return
        try:
            async with aiofiles.open(path, "rb") as handle:
                data = await handle.read()
        except FileNotFoundError:
            raise ConfigError(f"fake state file {path} does not exist (an empty one is {{}})") from None
        except OSError as exc:
            raise ConfigError(f"cannot read fake state file {path}: {exc.strerror or exc}") from None
        try:
            state = parse_state(decode_utf8(data, f"fake state file {path}"), str(path))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self._warn_out_of_range(path, state)
        self._state = state

    def _warn_out_of_range(self, path: Path, state: FaultState) -> None:
        """One warning per change of the ids that name no chip: a typo there would fault nothing."""
        chips = self._settings.fake_chips
        out_of_range = tuple(sorted(i for i in state.named if not 0 <= i < chips))
        if self._out_of_range.changed(out_of_range) and out_of_range:
            log.warning(
                "fake state file %s names chips that do not exist: %s (%d chips, ids 0-%d); ignored",
                path,
                ", ".join(map(str, out_of_range)),
                chips,
                chips - 1,
                extra=log_fields(path=path, ids=list(out_of_range)),
            )

    async def discover(self) -> Inventory:
        try:
            await self._load_state()
            self._state_problem.clear()
        except ConfigError as exc:
            if self._state_problem.changed(str(exc)):
                log.warning(
                    "%s; keeping the previous state",
                    exc,
                    extra=log_fields(path=self._settings.fake_state, reason=str(exc)),
                )
        chips = tuple(self._chip(i) for i in range(self._settings.fake_chips))
        return Inventory(
            chips=chips,
            container=container_base(self._settings.mode, _MANAGEMENT_DEVICES),
            vnpus=self._vnpus(chips),
            carvable=tuple(
                Carvable(chip.phys_id, TEMPLATES_310P3, _310P_TOTALS) for chip in chips if self._dynamic(chip)
            ),
        )

    def _dynamic(self, chip: Chip) -> bool:
        return chip.generation is Generation.ASCEND310P and is_dynamic(self._settings.vnpu, chip)

    # VnpuCarver (the DRA driver's dynamic vNPUs) ------------------------------------------------------
    def _carved_on(self, phys_id: int) -> list[VNpu]:
        if not 0 <= phys_id < self._settings.fake_chips or not self._dynamic(self._chip(phys_id)):
            raise CarveFailed(f"chip {phys_id} is not a dynamic 310P chip of the fake backend")
        return self._carved.setdefault(phys_id, [])

    async def vnpus_now(self, phys_id: int) -> tuple[VNpu, ...]:
        return tuple(self._carved_on(phys_id))

    async def create_vnpu(self, phys_id: int, template: str, vnpu_id: int) -> None:
        """As npu-smi's create-vnpu: refused for a template the chip does not offer, an id taken, or more AI
        cores or AI CPUs than the chip has left."""
        carved = self._carved_on(phys_id)
        found = next((t for t in TEMPLATES_310P3 if t.name == template), None)
        if found is None:
            raise CarveFailed(f"chip {phys_id} offers no template {template}")
        if any(vnpu.vnpu_id == vnpu_id for vnpu in carved):
            raise CarveFailed(f"vNPU {vnpu_id} exists already on chip {phys_id}")
        totals = dict(_310P_TOTALS)
        cores = sum(vnpu.aicore or 0 for vnpu in carved) + found.aicore
        cpus = sum(vnpu.aicpu or 0 for vnpu in carved) + (found.aicpu or 0)
        if cores > totals["aicore"] or cpus > totals["aicpu"]:
            raise CarveFailed(f"Not enough resources on chip {phys_id} for a {template}")
        carved.append(VNpu(vnpu_id, template, found.aicore, found.memory_gb, found.aicpu))

    async def destroy_vnpu(self, phys_id: int, vnpu_id: int) -> None:
        carved = self._carved_on(phys_id)
        found = next((vnpu for vnpu in carved if vnpu.vnpu_id == vnpu_id), None)
        if found is None:
            raise CarveFailed(f"chip {phys_id} has no vNPU {vnpu_id}")
        carved.remove(found)

    def _vnpus(self, chips: Sequence[Chip]) -> tuple[Chip, ...]:
        """The vNPUs of the state file, else of ``--fake-vnpus``; numbered as npu-smi numbers them."""
        layout = self._state.vnpus if self._state.vnpus is not None else self._settings.fake_vnpus
        parts = []
        for key, templates in layout or ():
            phys_id = int(key)
            if phys_id >= len(chips):
                continue
            for index, template in enumerate(templates):
                vnpu_id = phys_id * VNPU_IDS_PER_CHIP + VNPU_ID_BASE + index
                vnpu = VNpu(vnpu_id, template, aicore=template_cores(template))
                parts.append(chips[phys_id].slice(vnpu))
        return tuple(parts)

    def _chip(self, phys_id: int) -> Chip:
        chips = self._settings.fake_chips
        numa_node = phys_id * _NUMA_NODES // chips
        chip = Chip.make(
            phys_id,
            self._settings.fake_model,
            bus_id=f"0000:{0x10 + phys_id:02x}:00.0",
            numa_node=numa_node,
            pcie_root=_PCIE_ROOTS[numa_node],
            npu_id=phys_id // self._dies_per_npu,
            chip_on_card=phys_id % self._dies_per_npu,
            naming_scheme=self._settings.resource_naming,
            # Synthetic chips run no process: the hot reset's idle check goes by the pods alone.
            processes=0,
            paired_card=self._paired_card(phys_id),
        )
        chip = replace(chip, hbm_mb=_HBM_MB_BY_MODEL.get(chip.model, _HBM_MB.get(chip.generation)))
        if self._settings.fake_training and chip.generation.trains:
            chip = replace(chip, device_ip=str(_DEVICE_IPS + phys_id + 1))
            if chip.generation is Generation.ASCEND910A3:
                super_pod = SuperPod(sdid=phys_id, size=chips, super_pod_id=0, server_index=0)
                chip = replace(chip, vnic_ip=str(_VNIC_IPS + phys_id + 1), super_pod=super_pod)
        if phys_id in self._state.absent:
            return chip.with_health(Health.UNHEALTHY, "absent: the device node is gone")
        if phys_id in self._state.unhealthy:
            return chip.with_health(Health.UNHEALTHY, "fault scripted in the state file")
        codes = self._state.codes(phys_id)
        if codes:
            # Left to the agent's fault table, as devfs leaves a chip with codes: it decides the health.
            faults = tuple(Fault(code, "scripted in the fake state file") for code in codes)
            return replace(chip, faults=faults, health_status=_FAULT_COLUMN)
        return chip

    def _paired_card(self, phys_id: int) -> int | None:
        """An A3 die's paired card as the driver gives it (cards four apart within each board of 8, as DCMI
        pairs them: 0 with 4, 8 with 12); none where that card is not on the fake node. None on other
        models."""
        if self._dies_per_npu != 2:
            return None
        cards = -(-self._settings.fake_chips // 2)
        other = (phys_id // 2) ^ A3_PAIR_BIT
        return other if other < cards else NO_PAIRED_CARD

    async def close(self) -> None:
        return None
