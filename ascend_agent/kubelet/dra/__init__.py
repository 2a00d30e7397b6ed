"""The agent as a DRA (Dynamic Resource Allocation) driver, ``--kubelet-api dra``: instead of a device plugin
per resource, one kubelet plugin for the driver (``npu.huawei.com`` by default) and one ResourceSlice pool
for the node's chips.

- :mod:`.devices`: the chips as DRA devices (names, attributes, capacity, health taints); pure.
- :mod:`.slices`: the ResourceSlice publisher, a cluster feature.
- :mod:`.claimread`: a claim's allocation, read from its ResourceClaim once and kept.
- :mod:`.claims`: one CDI spec per prepared claim, and the checkpoint of prepared claims.
- :mod:`.claimstatus`: each prepared claim's ``status.devices``: conditions and what hardware it is.
- :mod:`.partitions`: a dynamic chip's counter sets and template devices; pure.
- :mod:`.npuconfig`: a claim's opaque parameters (``NpuConfig``).
- :mod:`.carving`: the vNPUs carved for claims at prepare and destroyed at unprepare, and their record.
- :mod:`.service`: what NodePrepareResources / NodeUnprepareResources do, and the health NodeWatchResources
  sends; :mod:`.handlers`: the gRPC handlers of each API version (v1, v1beta1; v1, v1alpha1) over it.
- :mod:`.plugin`: serving ``dra.sock`` and the registration socket for the kubelet's plugin watcher.

The agent holds a :class:`DraDriver` in place of its device plugins::

    driver = DraDriver.open(settings, cluster_side)   # ConfigError for a checkpoint it cannot read or move
    task_group.start_soon(driver.run)
    driver.publish(inventory, backend)                # after each reconcile (the backend carves)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from ascend_agent.backends import VnpuCarver
from ascend_agent.config import ConfigError, Settings
from ascend_agent.container import container_spec
from ascend_agent.kubelet.dra.carving import MADE_VNPUS, Carving, MadeVnpus
from ascend_agent.kubelet.dra.claimread import ClaimReader
from ascend_agent.kubelet.dra.claims import CheckpointError, Prepared, read_boot_id
from ascend_agent.kubelet.dra.claimstatus import ClaimStatuses
from ascend_agent.kubelet.dra.partitions import chip_offer
from ascend_agent.kubelet.dra.paths import DraPaths
from ascend_agent.kubelet.dra.plugin import DraPlugin
from ascend_agent.kubelet.dra.serialize import CallLock
from ascend_agent.kubelet.dra.service import DraService
from ascend_agent.model import Inventory

if TYPE_CHECKING:
    from ascend_agent.cluster.side import ClusterSide, Feature

__all__ = ["DraDriver", "slice_publisher"]

log = logging.getLogger(__name__)

# The reason of the Event on the Node for a checkpoint kept aside.
CHECKPOINT_UNUSABLE = "DRACheckpointUnusable"
_EVENT_MESSAGE = 1024


def slice_publisher(settings: Settings) -> Feature:
    """The node's ResourceSlice pool for ``settings``' driver: a cluster feature, made when the cluster side
    loads (``cluster.open_side(..., more=[partial(slice_publisher, settings)])``)."""
    from ascend_agent.kubelet.dra.paths import others_serving
    from ascend_agent.kubelet.dra.slices import SlicePublisher

    paths, driver = DraPaths.of(settings), settings.dra_driver_name
    return SlicePublisher(
        driver,
        settings.dra_taint_effect,
        cleanup=settings.dra_cleanup,
        others_serving=lambda: others_serving(paths, driver),
        fault_effects=settings.dra_fault_taints,
    )


class DraDriver:
    """The kubelet side of the DRA driver: its service and the sockets it is served on."""

    def __init__(self, service: DraService, plugin: DraPlugin) -> None:
        self.service = service
        self.plugin = plugin
        self._carver_set = anyio.Event()
        self._left_out: tuple[str, ...] = ()

    @classmethod
    def open(cls, settings: Settings, side: ClusterSide | None, paths: DraPaths | None = None) -> DraDriver:
        """The driver for ``settings`` (at ``paths``, by default where ``settings`` say); claims are read
        through ``side``'s client once it has loaded. A checkpoint that is not one is kept aside, with one
        log line and an Event on the Node: the driver starts with no prepared claims."""
        paths = paths or DraPaths.of(settings)
        driver = settings.dra_driver_name
        try:
            prepared, aside = Prepared.open(
                paths.checkpoint, paths.cdi_dir, driver, read_boot_id(paths.boot_id)
            )
        except CheckpointError as exc:
            raise ConfigError(str(exc)) from None
        if aside is not None:
            message = (
                f"{aside.reason}; kept as {aside.kept_as.name}, starting with no prepared claims "
                "(the kubelet's claims are prepared again when it asks)"
            )
            log.error("DRA driver %s: %s", driver, message)
            if side is not None:
                side.event("Warning", CHECKPOINT_UNUSABLE, str(paths.checkpoint), message[:_EVENT_MESSAGE])
        try:
            made, made_aside = MadeVnpus.open(paths.checkpoint.with_name(MADE_VNPUS))
        except CheckpointError as exc:
            raise ConfigError(str(exc)) from None
        if made_aside is not None:
            log.error(
                "DRA driver %s: %s; kept as %s: the vNPUs it named are not destroyed by the driver "
                "(check npu-smi info -t info-vnpu)",
                driver,
                made_aside.reason,
                made_aside.kept_as.name,
            )
        pool = side.node if side is not None else ""
        reader = None
        if side is not None:
            reader = ClaimReader(
                lambda: side.api,
                settings.dra_driver_name,
                pool,
                lambda: _no_client(side),
                wait_client=side.wait_loaded,
            )
        service = DraService(
            settings.dra_driver_name,
            pool,
            prepared,
            reader,
            health_refresh=max(settings.health_interval, 5.0),
            calls=CallLock(paths.lock),
            statuses=ClaimStatuses(driver, lambda: side.api) if side is not None else None,
            carving=Carving(made),
        )
        service.sweep_allowed = aside is None
        plugin = (
            DraPlugin(paths, service) if side is None else DraPlugin(paths, service, side.kubelet_registered)
        )
        return cls(service, plugin)

    @property
    def socket_dirs(self) -> Sequence[Path]:
        """The directories whose socket files the plugin serves: changes there poke it."""
        return (self.plugin.paths.socket.parent, self.plugin.paths.registration.parent)

    def publish(self, inventory: Inventory, carver: object = None) -> None:
        """The devices now (every vNPU, every chip not split into vNPUs, the dynamic chips' offers); a claim's
        CDI spec holds what Allocate gives for its devices (no CDI names). ``carver``: the backend, which
        carves dynamic vNPUs when it is a :class:`~ascend_agent.backends.VnpuCarver`."""
        base = replace(inventory.container, cdi=False)
        offers = {c.phys_id: chip_offer(c) for c in inventory.carvable}
        left_out = tuple(line for offer in offers.values() for line in offer.left_out)
        if left_out != self._left_out:
            for line in left_out:
                log.warning("Dynamic vNPUs: %s", line)
            self._left_out = left_out
        self.service.publish(
            inventory.advertised,
            lambda chips: container_spec(chips, base),
            offers=offers,
            container=base,
            wholes=inventory.chips,
        )
        self.service.carving.carver = carver if isinstance(carver, VnpuCarver) else None
        if self.service.carving.carver is not None:
            self._carver_set.set()

    @property
    def side_by_side(self) -> bool:
        """Whether another instance of the driver may serve beside this one (a rolling update): with the
        pod's UID, each serves sockets of its own and the calls share a lock."""
        return self.plugin.paths.lock is not None

    def poke(self) -> None:
        self.plugin.poke()

    def status(self) -> tuple[bool, str]:
        return self.plugin.status()

    async def run(self) -> None:
        async with anyio.create_task_group() as tasks:
            if self.service.statuses is not None:
                tasks.start_soon(self.service.statuses.run, name="claim statuses")
            tasks.start_soon(self._sweep_once)
            await self.plugin.run()
            tasks.cancel_scope.cancel()

    async def _sweep_once(self) -> None:
        """Once the backend can carve: destroy the vNPUs made for claims that are not prepared."""
        await self._carver_set.wait()
        await self.service.sweep()


def _no_client(side: ClusterSide) -> str:
    """Why claims cannot be read yet: the client still loading, or the cluster side off for good."""
    state = side.state().detail
    return "the Kubernetes client is still loading" if state == "starting" else f"the cluster side is {state}"
