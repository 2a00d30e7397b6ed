"""The node's chips as one ResourceSlice pool: a cluster feature (see :mod:`ascend_agent.cluster`).

The pool is named after the node (``spec.nodeName``, ``spec.driver``); it is one slice unless the chips are
more than one slice may hold. Every change of a device (a chip found or gone, a health taint set or lifted)
writes the slices again with the pool's generation one higher, so that the scheduler never mixes slices of
two generations. After a restart the agent takes the generation from the slices it finds and updates them in
place: the scheduler never sees the pool empty. Slices are deleted only with ``--dra-cleanup``, when the agent
stops.

The driver's own slices on this node are watched: one deleted or changed by someone else (the kubelet deletes
every slice of its node when it starts, an operator edits one) is written again within :data:`SETTLE`; so
they are when the kubelet registers the driver anew (:meth:`SlicePublisher.kubelet_registered`), and every
:data:`REFRESH` whatever happened::

    slices = SlicePublisher("npu.huawei.com", taint_effect="NoSchedule", cleanup=False)
    slices.observe(inventory)        # desired slices; written by its own task
    await slices.run(api)            # RBAC: resourceslices list, watch, create, patch, delete
    slices.kubelet_registered()      # the kubelet (re)started and registered the driver: write them again

Requests go through :meth:`KubeApi.call <ascend_agent.cluster.client.KubeApi.call>` and a
:class:`~ascend_agent.cluster.writer.LatestWriter`: the newest state wins, failures back off.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx2
from lightkube.core.client import FieldSelector
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.types import PatchType

from ascend_agent.backoff import Backoff, wait_before_retry
from ascend_agent.cluster.client import ApiUnavailable, KubeApi, WatchCursor, listed_with_version
from ascend_agent.cluster.writer import LatestWriter, api_backoff
from ascend_agent.kubelet.dra.devices import DeviceTaints, pool_slices
from ascend_agent.model import Inventory
from ascend_agent.naming import object_name

log = logging.getLogger("ascend_agent.cluster")

ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")
API_VERSION = "resource.k8s.io/v1"
# How often the slices are compared with what they should be (one list request when nothing differs), so that
# a slice deleted or edited by hand is right again within this.
REFRESH = 300.0
# How long after a change by someone else (or the kubelet's registration) the slices are written again: the
# kubelet deletes a node's slices one by one, and their events arrive together; one write puts all back.
SETTLE = 0.5
# Changes by someone else that keep coming (another writer that wants the slices otherwise) are undone at
# doubling intervals from SETTLE up to this; a quiet spell this long starts again from SETTLE.
MAX_REWRITE_SPACING = 30.0
# How long one watch of the slices lasts before it is opened again from where it was (one that silently
# stopped delivering is found sooner, by its missing bookmarks: KubeApi.watch_idle).
WATCH_SECONDS = 1800
# A watch's refusal the feature handles itself: 403 (its ClusterRole has no watch).
_WATCH_ANSWERS = frozenset({403})
# The resourceVersions of this process's own writes kept, to tell their watch events from others' changes.
_OWN_VERSIONS = 64

Specs = list[dict[str, Any]]


def _generation(found: dict[str, Any]) -> int:
    return int(((found.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _published(found: dict[str, Any]) -> dict[str, Any]:
    """What a published slice holds past driver, node and pool: its devices or its counter sets."""
    spec = found.get("spec") or {}
    return {key: spec[key] for key in ("devices", "sharedCounters") if key in spec}


def _taints_dropped(sent: dict[str, Any], kept: dict[str, Any]) -> bool:
    """Whether a device written with taints came back without them."""
    kept_taints = {device.get("name"): device.get("taints") for device in kept.get("devices") or ()}
    return any(
        device.get("taints") and not kept_taints.get(device.get("name"))
        for device in sent.get("devices") or ()
    )


def _counters_dropped(sent: dict[str, Any], kept: dict[str, Any]) -> bool:
    """Whether counter sets, or a device's consumption of them, were written and did not come back."""
    if sent.get("sharedCounters") and not kept.get("sharedCounters"):
        return True
    consumes = {device.get("name"): device.get("consumesCounters") for device in kept.get("devices") or ()}
    return any(
        device.get("consumesCounters") and not consumes.get(device.get("name"))
        for device in sent.get("devices") or ()
    )


def _without_tainted(specs: Specs) -> Specs:
    """The slices with every tainted device left out (counter sets as they are)."""
    return [
        {**spec, "devices": [d for d in spec["devices"] if not d.get("taints")]}
        if "devices" in spec
        else spec
        for spec in specs
    ]


def _without_counters(specs: Specs) -> Specs:
    """The slices with no counter sets: the dynamic vNPUs' template devices left out, their chips whole."""
    return [
        {
            **spec,
            "devices": [
                {key: value for key, value in device.items() if key != "consumesCounters"}
                for device in spec["devices"]
                if not (device.get("consumesCounters") and "template" in (device.get("attributes") or {}))
            ],
        }
        for spec in specs
        if "devices" in spec
    ]


# What an API server with a feature off drops from a write, how that shows, and what the agent does then.
_DROPPABLE: tuple[tuple[str, Callable[[dict[str, Any], dict[str, Any]], bool], str, str, str], ...] = (
    (
        "taints",
        _taints_dropped,
        "device taints",
        "DRADeviceTaints",
        "a tainted chip is left out of the slices instead, so that no claim is allocated it",
    ),
    (
        "counters",
        _counters_dropped,
        "counter sets",
        "DRAPartitionableDevices",
        "dynamic vNPUs need it; their chips are published whole instead",
    ),
)


def _name(found: dict[str, Any]) -> str | None:
    """A slice's name; None for an object without one (a broken API server's)."""
    name = (found.get("metadata") or {}).get("name")
    return name if isinstance(name, str) else None


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
        # What each slice of the pool holds as last written or found right, by name; and the resourceVersions
        # the writes got: a watch event of either is no change by someone else.
        self._published: dict[str, dict[str, Any]] = {}
        self._own_versions: list[str] = []
        # By name, what the last write sent and what the API server kept of it (one without a feature drops
        # its fields): a slice holding the latter is as written, not one to write again.
        self._kept: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        # Fields the API server dropped from a write (its feature off): "taints" (DRADeviceTaints) leaves the
        # tainted devices out, so that no claim is allocated an unhealthy chip; "counters"
        # (DRAPartitionableDevices) leaves the dynamic vNPUs' template devices out, their chips whole.
        self._dropped: set[str] = set()
        self._nudged = anyio.Event()

    def observe(self, inventory: Inventory) -> None:
        specs = pool_slices(inventory, self._taints)
        if self._writer is None:
            self._pending = specs
        else:
            self._writer.set(specs)

    def kubelet_registered(self) -> None:
        """The kubelet registered the driver (again): a kubelet that starts deletes every slice of its node
        first, so they are compared and written again now. Never blocks."""
        self._nudge()

    def _nudge(self) -> None:
        self._nudged.set()

    async def run(self, api: KubeApi) -> None:
        async def apply(specs: Specs) -> None:
            await self._apply(api, specs)

        writer = self._writer = LatestWriter("ResourceSlices", apply)
        if self._pending is not None:
            writer.set(self._pending)
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(writer.run)
                tasks.start_soon(self._follow, api)
                tasks.start_soon(self._write_again_when_nudged, writer)
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

    async def _write_again_when_nudged(self, writer: LatestWriter[Specs]) -> None:
        """A change by someone else, or the kubelet's registration: after :data:`SETTLE` (the rest of a burst
        of events arrives meanwhile), the slices are compared with what they should be and written again.
        Changes that keep coming (another writer that wants the slices otherwise: two versions of the driver
        side by side in a rolling update) are undone at doubling intervals, up to
        :data:`MAX_REWRITE_SPACING`."""
        spacing = Backoff(SETTLE, MAX_REWRITE_SPACING, jitter=False)
        last = -math.inf
        while True:
            await self._nudged.wait()
            if anyio.current_time() - last > MAX_REWRITE_SPACING:
                spacing.reset()
            await anyio.sleep(spacing.next())
            self._nudged = anyio.Event()
            writer.refresh()
            last = anyio.current_time()

    async def _follow(self, api: KubeApi) -> None:
        """Watch the driver's slices on this node: they are listed (anything not as published nudges a
        write), then watched, each watch opened again from the newest version the last one saw (a slice
        deleted meanwhile arrives as DELETED); listed again only on 410 Gone. A watch the agent may not make
        (a ClusterRole from before the watch) is said once and asked again at each refresh: until then the
        refresh and the kubelet's registrations put the slices back."""
        backoff = api_backoff()
        cursor = WatchCursor()
        refused = False
        while True:
            try:
                if cursor.version is None:
                    existing, cursor.version = await self._listed(api)
                    if any(self._changed_by_others("ADDED", name, s) for name, s in existing.items()) or any(
                        name not in existing for name in self._published
                    ):
                        self._nudge()
                async for kind, found in api.watch(
                    "resourceslices",
                    ResourceSlice,
                    cursor,
                    fields=self._fields(api),
                    server_timeout=WATCH_SECONDS,
                    answers=_WATCH_ANSWERS,
                ):
                    backoff.reset()
                    refused = False
                    item = dict(found)
                    name = _name(item)
                    if name is None or not self._ours(api, item):
                        continue  # an API server that ignores the field selector, or sends no object
                    if self._changed_by_others(kind, name, item):
                        log.info(
                            "ResourceSlice %s %s by someone else; writing the pool again",
                            name,
                            "deleted" if kind == "DELETED" else "changed",
                        )
                        self._nudge()
            except ApiUnavailable as exc:
                await wait_before_retry(backoff, exc)
            except (ApiError, httpx2.HTTPError) as exc:
                if not (isinstance(exc, httpx2.HTTPStatusError) and exc.response.status_code == 403):
                    log.debug("ResourceSlice watch ended: %s", exc)
                    await wait_before_retry(backoff)
                    continue
                if not refused:
                    log.warning(
                        "The agent may not watch resourceslices (403 Forbidden: its ClusterRole lacks the "
                        "verb watch; the chart's has it): a slice deleted or changed by someone else is put "
                        "back when the kubelet registers the driver or at the next check (every %g s), not "
                        "within seconds",
                        self._refresh,
                    )
                refused = True
                await anyio.sleep(self._refresh)

    def _changed_by_others(self, kind: str, name: str, item: dict[str, Any]) -> bool:
        """Whether a watch event (or a listed slice, as ``ADDED``) is a change the pool must undo: a slice
        of the pool deleted, a slice that is not as written (a write of this process is not), or one that is
        not of the pool at all."""
        if kind == "DELETED":
            return name in self._published
        if (item.get("metadata") or {}).get("resourceVersion") in self._own_versions:
            return False
        return self._published.get(name) != item.get("spec")

    def _fields(self, api: KubeApi) -> FieldSelector:
        return {"spec.nodeName": api.node, "spec.driver": self.driver}

    def _ours(self, api: KubeApi, item: dict[str, Any]) -> bool:
        spec = item.get("spec") or {}
        return spec.get("driver") == self.driver and spec.get("nodeName") == api.node

    async def _listed(self, api: KubeApi) -> tuple[dict[str, dict[str, Any]], str | None]:
        """The driver's slices on this node by name, and the list's resourceVersion (None without one)."""
        listed = listed_with_version(api.client, ResourceSlice, fields=self._fields(api))
        found, version = await api.call("list", "resourceslices", listed)
        slices = (dict(item) for item in found)
        return {
            name: item for item in slices if (name := _name(item)) is not None and self._ours(api, item)
        }, version

    async def _existing(self, api: KubeApi) -> dict[str, dict[str, Any]]:
        existing, _ = await self._listed(api)
        return existing

    def _own_version(self, answer: Any) -> None:
        """Keep the resourceVersion a write of this process got (an API server that gives none: its events
        are told by their content)."""
        version = (dict(answer).get("metadata") or {}).get("resourceVersion")
        if version:
            self._own_versions = [*self._own_versions[-_OWN_VERSIONS + 1 :], version]

    async def _apply(self, api: KubeApi, desired: Specs) -> None:
        dropped = set(self._dropped)
        existing = await self._existing(api)
        specs = self._with_taint_times(desired, existing)
        if "taints" in dropped:
            specs = _without_tainted(specs)
        if "counters" in dropped:
            specs = _without_counters(specs)
        names = [slice_name(api.node, self.driver, i) for i in range(len(specs))]
        generation = max([self._generation] + [_generation(s) for s in existing.values()])

        def holds(name: str, spec: dict[str, Any]) -> bool:
            """Whether the slice holds ``spec``, or what this API server keeps of it."""
            found = existing.get(name)
            if found is None:
                return False
            held = _published(found)
            return held == spec or self._kept.get(name) == (spec, held)

        unchanged = set(existing) == set(names) and all(
            holds(name, spec) for name, spec in zip(names, specs, strict=True)
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
            if old is not None and (
                old.get("spec") == body["spec"]
                or (holds(name, spec) and (old.get("spec") or {}).get("pool") == body["spec"]["pool"])
            ):
                self._published[name] = old["spec"]
                continue
            # Set before the write: its watch event may come before its answer.
            self._published[name] = body["spec"]
            if old is None:
                answer = await api.call("create", "resourceslices", api.client.create(ResourceSlice(**body)))
            else:
                # A merge patch replaces lists whole: the devices are exactly these afterwards; a slice
                # that held devices and now holds counter sets (or the reverse) loses the other (null).
                patch = {"devices": None, "sharedCounters": None, **body["spec"]}
                answer = await api.call(
                    "patch",
                    "resourceslices",
                    api.client.patch(ResourceSlice, name, {"spec": patch}, patch_type=PatchType.MERGE),
                )
            self._own_version(answer)
            self._kept_by_server(name, spec, answer)
        for name in sorted(set(existing) - set(names)):
            self._published.pop(name, None)
            self._kept.pop(name, None)
            await self._delete(api, name)
        for name in set(self._published) - set(names):
            del self._published[name]
            self._kept.pop(name, None)
        if generation != self._generation:
            log.info(
                "ResourceSlices of pool %s: %d devices in %d slices, generation %d",
                api.node,
                sum(len(s.get("devices", ())) for s in specs),
                len(specs),
                generation,
            )
        self._generation = generation
        if self._dropped != dropped:  # the server dropped fields just now: written again without them
            await self._apply(api, desired)

    def _kept_by_server(self, name: str, spec: dict[str, Any], answer: Any) -> None:
        """What the API server made of a write: compared with it from now on. Taints or counters it dropped
        are said once, and the slices are written again without what needs them."""
        kept = dict(dict(answer).get("spec") or {})
        if not kept:  # an answer without the object: compared with what was sent
            return
        self._published[name] = kept
        self._kept[name] = (spec, _published({"spec": kept}))
        for key, dropped, what, gate, instead in _DROPPABLE:
            if key not in self._dropped and dropped(spec, kept):
                self._dropped.add(key)
                log.warning(
                    "The API server dropped the %s of ResourceSlice %s (its %s feature is off, as in "
                    "Kubernetes before 1.36 by default): %s",
                    what,
                    name,
                    gate,
                    instead,
                )

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
