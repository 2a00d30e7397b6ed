"""The device plugins of a node: one :class:`~.lifecycle.ResourcePlugin` per resource that has chips, started
when a resource gets its first chip, stopped when it has none left or when where resources are served
changes, and each published what it must advertise::

    plugins = DevicePlugins(settings, on_allocated=holdings.allocated)
    await task_group.start(plugins.run)                  # the plugins' tasks live in its own group
    plugins.publish(desired, container)                  # after each reconcile: resource -> chips
    plugins.poke()                                       # kubelet.sock or a plugin socket changed
    ready, why = plugins.status()
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial

import anyio
from anyio.abc import TaskGroup

from ascend_agent import naming
from ascend_agent.allocation import preferred, topology_for
from ascend_agent.config import Settings
from ascend_agent.kubelet.deviceplugin.lifecycle import ResourcePlugin
from ascend_agent.model import Chip, ContainerBase

log = logging.getLogger(__name__)

# (resource, the kubelet's IDs per container) -> the chips to hand over (--volcano).
ResourceRemapper = Callable[[str, Sequence[Sequence[str]]], Awaitable[list[list[str]]]]
# (resource, the kubelet's device IDs -> chips) -> what ListAndWatch advertises instead (--volcano), or None.
Listed = Callable[[str, dict[str, Chip]], dict[str, Chip] | None]


@dataclass(slots=True)
class _Running:
    plugin: ResourcePlugin
    scope: anyio.CancelScope


class DevicePlugins:
    """``on_allocated(resource, pairs)`` hears each Allocate ((kubelet ID, device handed over) pairs);
    ``remap_ids(resource, containers)`` (``--volcano``) chooses the chips an Allocate hands over; ``listed``
    the IDs' health the kubelet sees."""

    def __init__(
        self,
        settings: Settings,
        on_allocated: Callable[[str, Sequence[tuple[str, str]]], None] = lambda resource, pairs: None,
        remap_ids: ResourceRemapper | None = None,
        listed: Listed | None = None,
    ) -> None:
        self.settings = settings
        self.on_registered: Callable[[], None] = lambda: None
        self.remap_ids = remap_ids
        self._on_allocated = on_allocated
        self._listed = listed
        self._plugins: dict[str, _Running] = {}
        self._tasks: TaskGroup | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold the plugins' tasks until cancelled: then every plugin stops serving, its sockets removed."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            task_status.started()
            await anyio.sleep_forever()

    def publish(self, desired: dict[str, tuple[Chip, ...]], container: ContainerBase) -> None:
        """Serve each resource of ``desired`` with its chips, and no other."""
        settings = self.settings
        for resource in [r for r in self._plugins if r not in desired]:
            log.info("No more chips for %s; stopping its server", resource)
            self._stop(resource)
        for resource, chips in desired.items():
            running = self._plugins.get(resource) or self._start(resource)
            # A vNPU is isolated by the driver and handed out once: replicas share whole chips only.
            replicas = 1 if any(chip.vnpu is not None for chip in chips) else settings.replicas
            # failRequestsGreaterThanOne: a container gets one replica of a shared chip at most.
            most = 1 if replicas > 1 and settings.fail_requests_greater_than_one else None
            devices = {
                device_id: chip
                for chip in chips
                for device_id in naming.replica_ids(chip.device_id, replicas)
            }
            # --volcano: each of the kubelet's IDs with the health of the chip really mounted under it (a
            # chip's replicas are not told apart: only whole chips).
            listed = self._listed(resource, devices) if self._listed and settings.replicas == 1 else None
            running.plugin.publish(
                devices,
                partial(preferred, topology_for(chips, replicas)),
                container,
                most_per_container=most,
                listed=listed,
            )

    def configure(self, settings: Settings, serve_again: bool) -> None:
        """Settings of a reload: the serve timeout applies to the running plugins; with ``serve_again``
        (where or how resources are served changed) every plugin stops and the next publish serves it."""
        self.settings = settings
        for running in self._plugins.values():
            running.plugin.set_serve_timeout(settings.serve_timeout)
        if serve_again:
            for resource in list(self._plugins):
                self._stop(resource)

    def poke(self) -> None:
        """Something in the kubelet's directories changed: each plugin looks at its socket again."""
        for running in self._plugins.values():
            running.plugin.poke()

    @property
    def serving(self) -> bool:
        """Whether any resource is served."""
        return bool(self._plugins)

    def status(self) -> list[str]:
        """Why each plugin that is not ready is not."""
        return [reason for ready, reason in (r.plugin.status() for r in self._plugins.values()) if not ready]

    def _start(self, resource: str) -> _Running:
        assert self._tasks is not None
        running = self._plugins[resource] = _Running(
            ResourcePlugin(resource, self.settings), anyio.CancelScope()
        )

        async def run() -> None:
            with running.scope:
                await running.plugin.run()

        self._tasks.start_soon(run, name=f"plugin {resource}")
        running.plugin.service.on_allocated = partial(self._on_allocated, resource)
        if self.remap_ids is not None:
            running.plugin.service.remap_ids = partial(self.remap_ids, resource)
        running.plugin.on_registered = lambda: self.on_registered()
        return running

    def _stop(self, resource: str) -> None:
        self._plugins.pop(resource).scope.cancel()
