"""Plain data shared by the backends, the agent and the plugin servers; no I/O.

>>> chip = Chip.make(3, "910B4")
>>> chip.device_id, chip.resource, chip.device_path
('Ascend910-3', 'huawei.com/Ascend910', '/dev/davinci3')

A vNPU is advertised as a slice of its chip: the chip with ``vnpu`` set, so it shares the chip's health, NUMA
node and PCIe root and has names of its own:

>>> part = Chip.make(0, "310P3").slice(VNpu(100, "vir02", aicore=2, memory_gb=6))
>>> part.device_id, part.resource, part.device_path, part.chip_device_id
('Ascend310P-2c-100-0', 'huawei.com/Ascend310P-2c', '/dev/vdavinci100', 'Ascend310P-0')
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ascend_agent import naming
from ascend_agent.faultclass import FaultClass


class Health(enum.StrEnum):
    """The two health strings the kubelet knows; only ``Healthy`` counts as healthy."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


class Generation(enum.StrEnum):
    """Chip generations: they decide the resource name, the ID prefix and the topology rules."""

    ASCEND910A = "910A"
    ASCEND910B = "910B"
    ASCEND910A3 = "910A3"
    ASCEND310P = "310P"
    ASCEND310B = "310B"
    ASCEND310 = "310"
    ASCEND950 = "950"

    @property
    def family(self) -> str:
        """The resource family (``Ascend910``), shared by every 910 generation; ``npu`` for Ascend 950, as
        Huawei advertises Atlas 350/850/950."""
        return naming.DEFAULT_FAMILIES[self.value]

    @property
    def trains(self) -> bool:
        """Whether its chips have a RoCE NIC for collective communication (a device IP, read through
        hccn_tool): every 910 generation."""
        return self in _TRAINING_GENERATIONS


# Huawei's classification order. ``910_93`` and ``910_93xx`` are the agent's own model names for A3 dies
# (npu-smi prints ``Ascend910`` there; devfs tells A3 by the table's shape), ``910C*`` is what some A3
# boards print; both come before plain 910.
_GENERATION_PATTERNS: tuple[tuple[re.Pattern[str], Generation], ...] = (
    (re.compile(r"^(310P\d?|I2\d?)"), Generation.ASCEND310P),
    (re.compile(r"310B"), Generation.ASCEND310B),
    (re.compile(r"310"), Generation.ASCEND310),
    (re.compile(r"^(910B\d|A2G\d)"), Generation.ASCEND910B),
    (re.compile(r"^(910_93|910C)"), Generation.ASCEND910A3),
    (re.compile(r"^910"), Generation.ASCEND910A),
    (re.compile(r"^950"), Generation.ASCEND950),
)


_TRAINING_GENERATIONS = frozenset({Generation.ASCEND910A, Generation.ASCEND910B, Generation.ASCEND910A3})

# The SoCs of Atlas A3 boards, as ``npu-smi info -t board`` names them (``NPU Name : 9392``).
A3_SOCS = ("9391", "9392", "9381", "9382", "9372", "9361", "9362")

# Every chip name each family really has, as Huawei prints it (npu-smi's Name column, the SoC names of the
# driver's tables), without the ``Ascend`` prefix; ``910_93`` and ``910_93xx`` are the agent's own names of
# A3 dies. A ``model:`` setting must be one of these (``chip_name``); npu-smi's own Name column is classified
# by the patterns above, so a chip Huawei ships later still gets a generation.
CHIP_NAMES: dict[Generation, tuple[str, ...]] = {
    Generation.ASCEND910A: ("910", "910A", "910B", "910ProA", "910ProB", "910PremiumA"),
    Generation.ASCEND910B: ("910B1", "910B2", "910B2C", "910B3", "910B4", "910B4-1"),
    Generation.ASCEND910A3: ("910_93", *(f"910_{soc}" for soc in A3_SOCS), "910C1"),
    Generation.ASCEND950: ("950PR", "950DT"),
    Generation.ASCEND310P: ("310P", "310P1", "310P2", "310P3", "310P4", "310P5", "310P7"),
    Generation.ASCEND310B: ("310B", "310B1", "310B2", "310B3", "310B4"),
    Generation.ASCEND310: ("310",),
}
_NAMED = {name: generation for generation, names in CHIP_NAMES.items() for name in names}
# How much of a refused name a message repeats.
_SHOWN_NAME = 40


class UnknownModelError(ValueError):
    """A chip name that matches none of the classification rules."""


def classify(name: str) -> Generation:
    """The generation of a chip name as ``npu-smi`` prints it (``Ascend`` prefix optional).

    >>> classify("910B4"), classify("Ascend 310P3"), classify("910ProB")
    (<Generation.ASCEND910B: '910B'>, <Generation.ASCEND310P: '310P'>, <Generation.ASCEND910A: '910A'>)
    >>> classify("Ascend950PR").family
    'npu'

    """
    bare = normalise_model(name)
    for pattern, generation in _GENERATION_PATTERNS:
        if pattern.search(bare):
            return generation
    raise UnknownModelError(f"unknown Ascend chip name {name!r}")


def chip_name(text: str) -> str:
    """``text`` when it is a chip name Huawei uses (:data:`CHIP_NAMES`; ``Ascend`` before it is allowed), as
    Huawei prints it: letters in its case. :class:`UnknownModelError` names the nearest real name.

    >>> chip_name("910B4"), chip_name("Ascend950PR")
    ('910B4', 'Ascend950PR')
    >>> chip_name("910b4")
    Traceback (most recent call last):
    ...
    ascend_agent.model.UnknownModelError: '910b4' is not an Ascend chip name: Huawei prints it 910B4
    >>> chip_name("910B9")
    Traceback (most recent call last):
    ...
    ascend_agent.model.UnknownModelError: '910B9' is not an Ascend chip name; the nearest is 910B1 (910B: \
910B1, 910B2, 910B2C, 910B3, 910B4, 910B4-1)
    """
    bare = text.removeprefix("Ascend").removeprefix(" ")
    if bare in _NAMED:
        return text
    shown = repr(text if len(text) <= _SHOWN_NAME else text[:_SHOWN_NAME] + "...")
    folded = normalise_model(bare).upper()
    same = next((name for name in _NAMED if name.upper() == folded), None)
    if same is not None:
        raise UnknownModelError(f"{shown} is not an Ascend chip name: Huawei prints it {same}")
    nearest = min(_NAMED, key=lambda name: _distance(folded[:_SHOWN_NAME], name.upper()))
    family = _NAMED[nearest]
    raise UnknownModelError(
        f"{shown} is not an Ascend chip name; the nearest is {nearest} ({family.value}: "
        f"{', '.join(CHIP_NAMES[family])})"
    )


def _distance(given: str, name: str) -> tuple[int, int]:
    """How far ``given`` is from ``name``: edits (insert, delete, replace one character), then the
    difference in length (``910B9`` is nearer ``910B4`` than ``910B``)."""
    row = list(range(len(name) + 1))
    for i, a in enumerate(given, 1):
        previous, row[0] = row[0], i
        for j, b in enumerate(name, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (a != b))
    return row[-1], abs(len(given) - len(name))


def normalise_model(name: str) -> str:
    """``Ascend 910B4`` and ``Ascend910B4`` become ``910B4``."""
    bare = name.strip()
    if bare.lower().startswith("ascend"):
        bare = bare[len("ascend") :].strip()
    return bare


@dataclass(frozen=True, slots=True)
class Fault:
    """An error code a chip reports (``npu-smi info -t health``), its text, and its class once graded."""

    code: str
    text: str = ""
    fault_class: FaultClass | None = None


@dataclass(frozen=True, slots=True)
class Template:
    """A vNPU template as ``npu-smi info -t template-info`` lists it: what each vNPU made from it gets."""

    name: str
    aicore: int
    memory_gb: int | None = None
    aicpu: int | None = None
    # Media units by npu-smi's label in lower case (``vpc``, ``venc``, ``jpegd``, ...), where it lists them.
    media: tuple[tuple[str, int], ...] = ()


# What npu-smi shows in the Container ID column of a vNPU no container runs on, lower-cased.
NO_CONTAINER_IDS = frozenset({"", "ffffffffffff", "000000000000", "-", "na"})


@dataclass(frozen=True, slots=True)
class VNpu:
    """One vNPU: a part of a chip made from a template (``npu-smi info -t info-vnpu``); its resources as the
    template gives them, None where unknown."""

    vnpu_id: int
    template: str
    aicore: int | None = None
    memory_gb: int | None = None
    aicpu: int | None = None
    vgroup_id: int | None = None
    container_id: str = ""
    status: str = ""

    @property
    def in_container(self) -> bool:
        """npu-smi names a container running on it (it cannot tell one that has not touched it yet)."""
        return self.container_id.lower() not in NO_CONTAINER_IDS


# npu-smi numbers the vNPUs of chip N from N*16+100 (inference chips use the first 8, training chips all 16).
VNPU_ID_BASE = 100
VNPU_IDS_PER_CHIP = 16
# What Huawei publishes as a vNPU's device IP (a vNPU has no NIC of its own).
VNPU_DEVICE_IP = "127.0.0.1"
# Huawei's value for a super-pod id or server index the driver does not give (every model but A3).
UNKNOWN_SUPER_POD = -2
# The driver's answer for an A3 card that no other card is reset with (DCMI's brother card -1).
NO_PAIRED_CARD = -1
# A chip's (or card's) id as a key of a file or a setting: ASCII digits only (str.isdigit() takes other
# scripts' digits too), at most 6.
_CHIP_ID = re.compile(r"[0-9]{1,6}")


IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def unzoned_address(text: str) -> IpAddress:
    """The IP address ``text`` gives, without an IPv6 zone (``%eth0``): a zone names an interface of this
    host, of no use to a peer, a rank table or a DRA claim (and a long one makes a DRA attribute the API
    server refuses, with the node's whole ResourceSlice). ``ValueError`` for what is no IP address.

    >>> str(unzoned_address("2001:db8::5%eth0")), str(unzoned_address("10.0.0.1"))
    ('2001:db8::5', '10.0.0.1')
    """
    address = ipaddress.ip_address(text)
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None:
        return ipaddress.IPv6Address(int(address))
    return address


def is_chip_id(text: object) -> bool:
    """Whether ``text`` is a physical chip id (or an NPU card id) as a key in a file or setting gives it.

    >>> is_chip_id("3"), is_chip_id("0012"), is_chip_id("1234567"), is_chip_id("\u0663"), is_chip_id(3)
    (True, True, False, False, False)
    """
    return isinstance(text, str) and _CHIP_ID.fullmatch(text) is not None


@dataclass(frozen=True, slots=True)
class SuperPod:
    """An A3 die's place in its super pod (``npu-smi info -t spod-info``). ``sdid`` is opaque: it is
    published as it is, never decoded."""

    sdid: int
    size: int
    super_pod_id: int
    server_index: int


@dataclass(frozen=True, slots=True)
class Chip:
    """One physical NPU chip as a backend sees it. ``device_ip`` (the RoCE address, IPv4 or else a global
    IPv6 one) and ``vnic_ip`` (A3) are None where the chip has none or it is not known: never made up."""

    phys_id: int
    model: str
    generation: Generation
    health: Health = Health.HEALTHY
    reason: str = ""
    bus_id: str | None = None
    numa_node: int | None = None
    # The PCIe root complex the chip hangs under, as sysfs names it (``pci0000:80``): a NIC of another DRA
    # driver under the same root reaches the chip without crossing the CPUs' interconnect.
    pcie_root: str | None = None
    npu_id: int | None = None
    naming_scheme: str = "huawei"
    faults: tuple[Fault, ...] = ()
    held: bool = False
    # Unhealthy only because its health cannot be read (npu-smi is down): not a fault of the chip.
    health_unknown: bool = False
    hbm_mb: int | None = None  # HBM size where the chip has HBM and the backend knows it
    # Its card's firmware version and serial number (``npu-smi info -t board -i <npu id>``) where read.
    firmware_version: str | None = None
    serial: str | None = None
    vnpu: VNpu | None = None
    # The chip's place on its card: npu-smi's ``-c`` beside ``-i <npu id>``.
    chip_on_card: int = 0
    device_ip: str | None = None
    vnic_ip: str | None = None
    super_pod: SuperPod | None = None
    # How many processes npu-smi lists on the chip; None where it does not say (the hot reset's idle check).
    processes: int | None = None
    # The driver's logic id (``npu-smi info -m``) and the board id (``info -t board``) where read.
    logic_id: int | None = None
    board_id: int | None = None
    # A3: the card (npu id) the driver resets together with this chip's card, its "brother card", as the
    # driver itself says (DCMI); NO_PAIRED_CARD where it says there is none; None where it was not read.
    paired_card: int | None = None
    # The most severe class of its fault codes now, escalations included; None while it reports no code.
    fault_class: FaultClass | None = None
    # npu-smi's Health column (OK, Warning, Alarm, Critical), where the backend reads it.
    health_status: str = ""
    # Why the chip's RoCE network is unhealthy (its link down past the debounce); empty while it is not.
    # Not a health of the kubelet's: the chip still serves single-chip pods.
    network_fault: str = ""

    @classmethod
    def make(cls, phys_id: int, model: str, **kwargs: Any) -> Chip:
        """A chip of a model name, classified; raises :class:`UnknownModelError` for unknown names."""
        return cls(phys_id, normalise_model(model), classify(model), **kwargs)

    @property
    def family(self) -> str:
        """The resource family under the chip's naming scheme (``Ascend910``, or ``Ascend910B4``)."""
        return naming.family_for(self.generation.family, self.model, self.naming_scheme)

    @property
    def resource(self) -> str:
        if self.vnpu is not None:
            return naming.resource_name(self.vnpu_type)
        return naming.resource_name(self.family)

    @property
    def device_id(self) -> str:
        if self.vnpu is not None:
            return naming.vnpu_device_id(self.vnpu_type, self.vnpu.vnpu_id, self.phys_id)
        return self.chip_device_id

    @property
    def chip_device_id(self) -> str:
        """The device ID of the whole chip, for a vNPU too."""
        return naming.device_id(self.family, self.phys_id)

    @property
    def device_path(self) -> str:
        if self.vnpu is not None:
            return naming.vnpu_device_path(self.vnpu.vnpu_id)
        return naming.device_path(self.phys_id)

    @property
    def vnpu_type(self) -> str:
        """Huawei's device type of the vNPU (``Ascend310P-2c``); every 910 is ``Ascend910``."""
        assert self.vnpu is not None
        return naming.vnpu_type(self.generation.family, self.vnpu.template)

    @property
    def rank_ip(self) -> str | None:
        """The device IP a rank table gets for this device: the chip's, ``127.0.0.1`` for a vNPU.

        >>> Chip.make(0, "910B3", device_ip="10.0.0.1").slice(VNpu(100, "vir05_1c_16g")).rank_ip
        '127.0.0.1'
        """
        return VNPU_DEVICE_IP if self.vnpu is not None else self.device_ip

    def slice(self, vnpu: VNpu) -> Chip:
        """The vNPU ``vnpu`` of this chip, as the device it is advertised as."""
        return replace(self, vnpu=vnpu)

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY

    def with_health(self, health: Health, reason: str = "") -> Chip:
        return replace(self, health=health, reason=reason)


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node handed to a container (``DeviceSpec``)."""

    host_path: str
    container_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class HostMount:
    """A host path bind-mounted into a container (``Mount``)."""

    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """What a container that gets a set of chips needs, independent of gRPC."""

    envs: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[DeviceNode, ...] = ()
    mounts: tuple[HostMount, ...] = ()
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerBase:
    """What every container that gets chips of this node gets besides them: the management device nodes and
    the driver mounts. ``chip_nodes`` is False where the Ascend container runtime adds device nodes and
    mounts itself (container mode ``ascend-runtime``); ``cdi`` also names the chips as CDI devices.
    :func:`ascend_agent.container.container_spec` makes it and a set of chips a :class:`ContainerSpec`."""

    devices: tuple[DeviceNode, ...] = ()
    mounts: tuple[HostMount, ...] = ()
    chip_nodes: bool = True
    cdi: bool = False


class CarveFailed(Exception):
    """Creating, destroying or listing a vNPU failed; the message is the tool's words in one line."""


@dataclass(frozen=True, slots=True)
class Carvable:
    """A chip whose vNPUs are carved by the claims prepared on it (``vnpu: {dynamic: true}``): the templates
    it offers (``template-info``) and what it has in all (``info-vnpu``'s totals by label in lower case:
    ``aicore``, ``memory`` in GB, ``aicpu``, ``vpc``, ...; what npu-smi says NA of is left out)."""

    phys_id: int
    templates: tuple[Template, ...]
    totals: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Inventory:
    """One discovery: the chips, their vNPUs (chips with ``vnpu`` set), what every container that gets some
    of them gets, and what is wrong if anything."""

    chips: tuple[Chip, ...] = ()
    problems: tuple[str, ...] = ()
    container: ContainerBase = ContainerBase()
    driver_version: str | None = None  # as npu-smi reports it, where it does
    vnpus: tuple[Chip, ...] = ()
    # Why the chips' health cannot be read now (npu-smi down); empty while it can.
    outage: str = ""
    # The dynamic chips (published whole and as the templates they can carve, never as their vNPUs).
    carvable: tuple[Carvable, ...] = ()

    @property
    def super_pod(self) -> SuperPod | None:
        """The node's place in its super pod (A3): the first chip's (by physical id) that has one, as Huawei's
        plugin takes the first device that answers; None on other nodes."""
        ordered = sorted(self.chips, key=lambda chip: chip.phys_id)
        return next((chip.super_pod for chip in ordered if chip.super_pod is not None), None)

    @property
    def advertised(self) -> tuple[Chip, ...]:
        """What the kubelet is offered: every vNPU, and every chip that holds none (a chip split into vNPUs
        is never handed out whole as well)."""
        split = {part.phys_id for part in self.vnpus}
        return (*(chip for chip in self.chips if chip.phys_id not in split), *self.vnpus)

    def by_resource(self) -> dict[str, tuple[Chip, ...]]:
        grouped: dict[str, list[Chip]] = {}
        for chip in self.advertised:
            grouped.setdefault(chip.resource, []).append(chip)
        return {resource: tuple(chips) for resource, chips in grouped.items()}

    def by_advertised_resource(self, replicas: int, rename_shared: bool) -> dict[str, tuple[Chip, ...]]:
        """:meth:`by_resource` under the names the kubelet sees: a chip resource shared by ``replicas``
        is ``<resource>.shared`` with ``rename_shared``; a vNPU resource is never shared nor renamed."""
        return {
            (
                resource
                if any(chip.vnpu is not None for chip in chips)
                else naming.advertised_resource(resource, replicas, rename_shared)
            ): chips
            for resource, chips in self.by_resource().items()
        }


# Which pod holds which chip: the kubelet's PodResources view, kept by the agent, moved by --volcano's marks.
@dataclass(frozen=True, slots=True, order=True)
class Holder:
    namespace: str
    pod: str
    container: str
    claim: str = ""  # DRA: the ResourceClaim (in the pod's namespace) that gave the device

    def __str__(self) -> str:
        held = f"{self.namespace}/{self.pod}/{self.container}"
        return f"{held} (claim {self.claim})" if self.claim else held


@dataclass(frozen=True, slots=True)
class Holders:
    """Who holds each advertised device, by (resource, device ID) as the kubelet names them; and each device
    a DRA driver prepared, by (driver, device name)."""

    by_device: Mapping[tuple[str, str], tuple[Holder, ...]] = field(default_factory=dict)
    by_claimed: Mapping[tuple[str, str], tuple[Holder, ...]] = field(default_factory=dict)

    def of_claimed(self, driver: str, chip: Chip) -> tuple[Holder, ...]:
        """The containers holding ``chip`` (or vNPU) through a claim of ``driver``, sorted.

        >>> holders = Holders(by_claimed={("npu.huawei.com", "npu-1"): (Holder("a", "p", "c", "train"),)})
        >>> [str(h) for h in holders.of_claimed("npu.huawei.com", Chip.make(1, "910B3"))]
        ['a/p/c (claim train)']
        """
        name = naming.dra_device_name(chip.phys_id, chip.vnpu.vnpu_id if chip.vnpu is not None else None)
        return self.claimed_on(driver, name)

    def claimed_on(self, driver: str, name: str) -> tuple[Holder, ...]:
        """The containers holding the DRA device ``name`` through a claim of ``driver``, a chip's with those
        holding a template device carved from it at prepare (``npu-1-vir04-0`` is part of ``npu-1``; a vNPU
        of a static layout, ``npu-1-vnpu-130``, is a device of its own), sorted.

        >>> holders = Holders(by_claimed={("d", "npu-1-vir04-0"): (Holder("a", "p", "c", "infer"),)})
        >>> [str(h) for h in holders.claimed_on("d", "npu-1")], holders.claimed_on("d", "npu-10")
        (['a/p/c (claim infer)'], ())
        """
        found = {
            holder
            for (claim_driver, device), held in self.by_claimed.items()
            if claim_driver == driver and (device == name or device.startswith(f"{name}-vir"))
            for holder in held
        }
        return tuple(sorted(found))

    def of(self, chip: Chip, replicas: int) -> tuple[Holder, ...]:
        """The containers holding ``chip`` (through any of its replicas), sorted."""
        found = {
            holder
            for device_id in naming.replica_ids(chip.device_id, replicas)
            for holder in self.by_device.get((chip.resource, device_id), ())
        }
        return tuple(sorted(found))
