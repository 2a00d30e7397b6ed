"""The node's chips as one ResourceSlice pool: a cluster feature (see :mod:`ascend_agent.cluster`).

The pool is named after the node (``spec.nodeName``, ``spec.driver``); it is one slice unless the chips are
more than one slice may hold. Every change of a device (a chip found or gone, a health taint set or lifted)
writes the slices again with the pool's generation one higher, so that the scheduler never mixes slices of
two generations. After a restart the agent takes the generation from the slices it finds and updates them in
place: the scheduler never sees the pool empty. Slices are deleted only with ``--dra-cleanup``, when the agent
stops::

    slices = SlicePublisher("npu.huawei.com", taint_effect="NoSchedule", cleanup=False)
    slices.observe(inventory)        # desired slices; written by its own task
    await slices.run(api)            # RBAC: resourceslices list, create, patch, delete

Requests go through :meth:`KubeApi.call <ascend_agent.cluster.client.KubeApi.call>` and a
:class:`~ascend_agent.cluster.writer.LatestWriter`: the newest state wins, failures back off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.types import PatchType

from ascend_agent.cluster.client import ApiUnavailable, KubeApi
from ascend_agent.cluster.writer import LatestWriter
from ascend_agent.kubelet.dra.devices import DeviceTaints, pool_slices
from ascend_agent.model import Inventory
from ascend_agent.naming import object_name

log = logging.getLogger("ascend_agent.cluster")

ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")
API_VERSION = "resource.k8s.io/v1"
# How often the slices are compared with what they should be (one list request when nothing differs), so that
# a slice deleted or edited by hand is right again within this.
REFRESH = 300.0

Specs = list[dict[str, Any]]


def _generation(found: dict[str, Any]) -> int:
    return int(((found.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _published(found: dict[str, Any]) -> dict[str, Any]:
    """What a published slice holds past driver, node and pool: its devices or its counter sets."""
    spec = found.get("spec") or {}
    return {key: spec[key] for key in ("devices", "sharedCounters") if key in spec}


def slice_name(node: str, driver: str, index: int) -> str:
    """``<node>-<driver>-<index>``: a DNS subdomain as long as the node's name is one; shortened with a hash
    where a long node name would make it longer than an object name may be."""
    return object_name(f"{node}-{driver}-{index}")


class SlicePublisher:
    """Keeps the node's ResourceSlices equal to the chips: devices, attributes, capacity, health taints."""

    def __init__(
        self,
        driver: str,
        taint_effect: str,
        cleanup: bool = False,
        refresh: float = REFRESH,
        others_serving: Callable[[], Sequence[Path]] = list,
        fault_effects: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.driver = driver
        self.cleanup = cleanup
        self._others_serving = others_serving  # blocks: asked in a worker thread
        self._refresh = refresh
        self._taints = DeviceTaints(driver, taint_effect, fault_effects)
        self._writer: LatestWriter[Specs] | None = None
        self._pending: Specs | None = None
        self._generation = 0
        self._taint_times: dict[tuple[Any, ...], str] = {}

    def observe(self, inventory: Inventory) -> None:
        specs = pool_slices(inventory, self._taints)
        if self._writer is None:
            self._pending = specs
        else:
            self._writer.set(specs)

    async def run(self, api: KubeApi) -> None:
        async def apply(specs: Specs) -> None:
            await self._apply(api, specs)

        writer = self._writer = LatestWriter("ResourceSlices", apply)
        if self._pending is not None:
            writer.set(self._pending)
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(writer.run)
                while True:
                    await anyio.sleep(self._refresh)
                    writer.refresh()
        finally:
            if self.cleanup:
                with anyio.CancelScope(shield=True):
                    others = await anyio.to_thread.run_sync(self._others_serving)
                    if others:
                        log.info(
                            "ResourceSlices of %s kept (--dra-cleanup): another instance of %s serves on %s",
                            api.node,
                            self.driver,
                            others[0],
                        )
                    else:
                        await self._delete_all(api)

    async def _existing(self, api: KubeApi) -> dict[str, dict[str, Any]]:
        async def listed() -> list[Any]:
            return [
                item
                async for item in api.client.list(
                    ResourceSlice, fields={"spec.nodeName": api.node, "spec.driver": self.driver}
                )
            ]

        found = await api.call("list", "resourceslices", listed())
        return {
            item["metadata"]["name"]: dict(item)
            for item in found
            if (item.get("spec") or {}).get("driver") == self.driver
            and (item.get("spec") or {}).get("nodeName") == api.node
        }

    async def _apply(self, api: KubeApi, specs: Specs) -> None:
        existing = await self._existing(api)
        specs = self._with_taint_times(specs, existing)
        names = [slice_name(api.node, self.driver, i) for i in range(len(specs))]
        generation = max([self._generation] + [_generation(s) for s in existing.values()])
        unchanged = set(existing) == set(names) and all(
            _published(existing[name]) == spec for name, spec in zip(names, specs, strict=True)
        )
        if not unchanged or generation == 0:
            generation += 1
        for name, spec in zip(names, specs, strict=True):
            body: dict[str, Any] = {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {
                    "driver": self.driver,
                    "nodeName": api.node,
                    "pool": {"name": api.node, "generation": generation, "resourceSliceCount": len(specs)},
                    **spec,
                },
            }
            old = existing.get(name)
            if old is None:
                await api.call("create", "resourceslices", api.client.create(ResourceSlice(**body)))
            elif old.get("spec") != body["spec"]:
                # A merge patch replaces lists whole: the devices are exactly these afterwards; a slice
                # that held devices and now holds counter sets (or the reverse) loses the other (null).
                patch = {"devices": None, "sharedCounters": None, **body["spec"]}
                await api.call(
                    "patch",
                    "resourceslices",
                    api.client.patch(ResourceSlice, name, {"spec": patch}, patch_type=PatchType.MERGE),
                )
        for name in sorted(set(existing) - set(names)):
            await self._delete(api, name)
        if generation != self._generation:
            log.info(
                "ResourceSlices of pool %s: %d devices in %d slices, generation %d",
                api.node,
                sum(len(s.get("devices", ())) for s in specs),
                len(specs),
                generation,
            )
        self._generation = generation

    def _with_taint_times(self, specs: Specs, existing: dict[str, dict[str, Any]]) -> Specs:
        """``specs`` (not changed) with each taint's ``timeAdded``: the one the published slices give it, else
        the one this process gave it, else now. The API server sets it on every write of a taint without one;
        keeping it makes an unchanged pool compare equal and says since when a chip is tainted."""
        published = {
            (device.get("name"), taint.get("key"), taint.get("value"), taint.get("effect")): taint[
                "timeAdded"
            ]
            for found in existing.values()
            for device in (found.get("spec") or {}).get("devices") or ()
            for taint in device.get("taints") or ()
            if taint.get("timeAdded")
        }
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        times: dict[tuple[Any, ...], str] = {}
        stamped: Specs = []
        for spec in specs:
            if "devices" not in spec:
                stamped.append(spec)
                continue
            devices = []
            for device in spec["devices"]:
                if device.get("taints"):
                    taints = []
                    for taint in device["taints"]:
                        key = (device["name"], taint["key"], taint["value"], taint["effect"])
                        times[key] = published.get(key) or self._taint_times.get(key) or now
                        taints.append({**taint, "timeAdded": times[key]})
                    device = {**device, "taints": taints}
                devices.append(device)
            stamped.append({**spec, "devices": devices})
        self._taint_times = times
        return stamped

    async def _delete(self, api: KubeApi, name: str) -> None:
        try:
            await api.call("delete", "resourceslices", api.client.delete(ResourceSlice, name))
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def _delete_all(self, api: KubeApi) -> None:
        """--dra-cleanup: the node's chips are going; remove the pool (bounded by the client's timeout)."""
        try:
            for name in sorted(await self._existing(api)):
                await self._delete(api, name)
        except (ApiUnavailable, ApiError) as exc:
            log.warning("ResourceSlices of %s not removed: %s", api.node, exc)
            return
        log.info("Removed the ResourceSlices of %s (--dra-cleanup)", api.node)
