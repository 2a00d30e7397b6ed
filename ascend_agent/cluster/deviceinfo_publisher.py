"""The cluster feature that makes the node visible to Volcano's ``ascend-for-volcano``: the device-info
ConfigMap ``kube-system/mindx-dl-deviceinfo-<node>`` and the Node annotation ``baseDeviceInfos``; it reads
back the admin's ``ManuallySeparateNPU`` into :class:`~ascend_agent.health.separation.ManualSeparation`.

    publisher = DeviceInfoPublisher(separation)
    publisher.observe(inventory)         # after each reconcile: the lists to write, if they changed
    await publisher.run(api)             # writes at most once a second, rewrites every 5 min, watches it

RBAC: configmaps in kube-system get, watch, create, update; nodes patch. The ConfigMap is read, then
updated with the keys the agent owns set and every other key kept (an admin's ``ManuallySeparateNPU`` is
never overwritten; an edit between the read and the write is a 409 and the write starts again); the map is
watched, so an admin's edit is taken at once and a map deleted by hand is created again at once.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable

import anyio
import httpx2
from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node
from lightkube.types import PatchType

from ascend_agent.backoff import wait_before_retry
from ascend_agent.cluster import deviceinfo
from ascend_agent.cluster.client import ApiUnavailable, KubeApi, WatchCursor
from ascend_agent.cluster.writer import LatestWriter, api_backoff
from ascend_agent.health.separation import ManualSeparation
from ascend_agent.model import Inventory

log = logging.getLogger("ascend_agent.cluster")

# Volcano restarts its informer on an UpdateTime older than 600 s: rewritten well within that.
REFRESH_INTERVAL = 300.0
# How long one watch of the map lasts before it is opened again from where it was (a watch that silently
# stopped delivering is found by its missing bookmarks: KubeApi.watch_idle).
WATCH_SECONDS = 1800
MIN_WRITE_INTERVAL = 1.0
DESCRIPTION = (
    "Written by ascend-agent. With Volcano's self-maintain-available-card mode on, Volcano counts the free "
    "chips of huawei.com/<type> itself from the node's baseDeviceInfos annotation."
)
_CONFLICT_RETRIES = 3


class _Contended(Exception):
    """Someone else kept changing the ConfigMap between the agent's read and its write."""


class DeviceInfoPublisher:
    """Keeps the device-info ConfigMap and ``baseDeviceInfos`` in step with the chips."""

    def __init__(
        self,
        separation: ManualSeparation,
        watch_seconds: int = WATCH_SECONDS,
        refresh_interval: float = REFRESH_INTERVAL,
        min_write_interval: float = MIN_WRITE_INTERVAL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._separation = separation
        self._watch_seconds = watch_seconds
        self._refresh_interval = refresh_interval
        self._min_write_interval = min_write_interval
        self._clock = clock
        self._since: dict[str, int] = {}  # device ID -> Unix ms it was first seen out of service or faulty
        self._lists: dict[str, str] | None = None
        self._annotation: str | None = None
        self._super_pod = (deviceinfo.UNKNOWN_INDEX, deviceinfo.UNKNOWN_INDEX)
        self._map: LatestWriter[dict[str, str]] | None = None
        self._node: LatestWriter[str] | None = None
        # The map as the API server last showed it (read, watched, or answered to a write): a write updates
        # it without reading it first; a conflict (409) reads it.
        self._known: ConfigMap | None = None
        self._seen = 0  # how often the API server has shown the map: an answer must not hide a newer sight

    def observe(self, inventory: Inventory) -> None:
        now_ms = int(self._clock() * 1000)
        # Every device the lists name: a vNPU carries its chip's codes and class.
        out = {
            chip.device_id
            for chip in (*inventory.chips, *inventory.advertised)
            if not chip.healthy or chip.fault_class is not None
        }
        self._since = {device: self._since.get(device, now_ms) for device in out}
        self._lists = deviceinfo.device_lists(inventory, self._since, now_ms, self._separation.ids)
        self._annotation = deviceinfo.base_device_infos(inventory) if inventory.chips else None
        super_pod = deviceinfo.node_super_pod(inventory)
        if super_pod != self._super_pod:
            self._super_pod = super_pod
            if self._map is not None:
                self._map.refresh()
        self._hand_over()

    def _hand_over(self) -> None:
        if self._map is not None and self._lists is not None:
            self._map.set(self._lists)
        if self._node is not None and self._annotation is not None:
            self._node.set(self._annotation)

    async def run(self, api: KubeApi) -> None:
        name = deviceinfo.configmap_name(api.node)

        async def write_map(lists: dict[str, str]) -> None:
            await self._write_map(api, name, lists)
            await anyio.sleep(self._min_write_interval)

        async def write_annotation(value: str) -> None:
            patch = {"metadata": {"annotations": {deviceinfo.BASE_DEVICE_INFOS: value}}}
            await api.call(
                "patch", "nodes", api.client.patch(Node, api.node, patch, patch_type=PatchType.MERGE)
            )

        self._map = LatestWriter(f"ConfigMap {deviceinfo.NAMESPACE}/{name}", write_map)
        self._node = LatestWriter("the node annotation baseDeviceInfos", write_annotation)
        self._hand_over()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._map.run)
            tasks.start_soon(self._node.run)
            tasks.start_soon(self._refresh, self._map)
            tasks.start_soon(self._read_back, api, name, self._map)

    async def _refresh(self, writer: LatestWriter[dict[str, str]]) -> None:
        while True:
            await anyio.sleep(self._refresh_interval)
            writer.refresh()

    async def _read_back(self, api: KubeApi, name: str, writer: LatestWriter[dict[str, str]]) -> None:
        """The admin's ``ManuallySeparateNPU`` as a watch on the map delivers it; a map deleted is written
        again. The map is read, then watched for ``watch_seconds`` at a time, each watch opened again from the
        newest version the last one saw (a deletion meanwhile arrives as DELETED); read again only on 410
        Gone."""
        backoff = api_backoff()
        cursor = WatchCursor()
        while True:
            try:
                if cursor.version is None:
                    cursor.version = await self._read_map(api, name, writer)
                async for kind, found in api.watch(
                    "configmaps",
                    ConfigMap,
                    cursor,
                    namespace=deviceinfo.NAMESPACE,
                    fields={"metadata.name": name},
                    server_timeout=self._watch_seconds,
                ):
                    backoff.reset()
                    if found.metadata is None or found.metadata.name != name:
                        continue  # an API server that ignores the field selector
                    self._seen += 1
                    if kind == "DELETED":
                        self._known = None
                        self._gone(name, writer)
                    else:
                        self._known = found
                        self._take_separation(found)
            except ApiUnavailable as exc:
                await wait_before_retry(backoff, exc)
            except (ApiError, httpx2.HTTPError) as exc:
                log.debug("ConfigMap watch ended: %s", exc)
                await wait_before_retry(backoff)

    async def _read_map(self, api: KubeApi, name: str, writer: LatestWriter[dict[str, str]]) -> str | None:
        """Take the map's ``ManuallySeparateNPU`` (a map not there is written again); the resourceVersion
        to watch from."""
        found, version = await api.read_named("configmaps", ConfigMap, name, deviceinfo.NAMESPACE)
        self._known, self._seen = found, self._seen + 1
        if found is None:
            self._gone(name, writer)
        else:
            self._take_separation(found)
        return version

    @staticmethod
    def _gone(name: str, writer: LatestWriter[dict[str, str]]) -> None:
        if not writer.pending:
            log.info("ConfigMap %s/%s is gone; writing it again", deviceinfo.NAMESPACE, name)
            writer.refresh()

    def _take_separation(self, found: ConfigMap) -> None:
        text = (found.data or {}).get(deviceinfo.SEPARATED_KEY, "")
        ids = deviceinfo.separated_ids(text)
        if ids != self._separation.ids:
            log.info(
                "%s in the device-info ConfigMap: %s",
                deviceinfo.SEPARATED_KEY,
                ", ".join(sorted(ids)) or "none",
            )
            self._separation.update(ids)

    async def _write_map(self, api: KubeApi, name: str, lists: dict[str, str]) -> None:
        """Update the keys the agent owns in the map as it was last seen (read when it was not, or when the
        update meets a newer one) and keep every other (an admin's ``ManuallySeparateNPU`` above all); a map
        that is not there is created."""
        for _ in range(_CONFLICT_RETRIES):
            owned = {
                deviceinfo.DEVICE_INFO_KEY: deviceinfo.device_info_cfg(
                    lists, int(self._clock()), self._super_pod
                ),
                deviceinfo.UPGRADE_FAULT_KEY: "{}",
                deviceinfo.DESCRIPTION_KEY: DESCRIPTION,
            }
            found = copy.deepcopy(self._known)
            if found is None:
                try:
                    found = await _get_map(api, name)
                except ApiError as exc:
                    if exc.status.code != 404:
                        raise
                    if await self._create(api, name, owned):
                        return
                    continue
                self._take_separation(found)
            if await self._update(api, found, owned):
                return
            self._known = None
        raise _Contended(f"it changed between the read and the write {_CONFLICT_RETRIES} times")

    async def _update(self, api: KubeApi, found: ConfigMap, owned: dict[str, str]) -> bool:
        """False when it changed since it was read (409: its resourceVersion) or is gone (404)."""
        metadata = found.metadata or ObjectMeta()
        metadata.labels = {**(metadata.labels or {}), deviceinfo.CONSUMER_LABEL: "true"}
        data = {**(found.data or {}), **owned}
        data.setdefault(deviceinfo.SEPARATED_KEY, "")
        found.metadata, found.data = metadata, data
        seen = self._seen
        try:
            answer = await api.call("update", "configmaps", api.client.replace(found))
        except ApiError as exc:
            if exc.status.code in (404, 409):
                return False
            raise
        if self._seen == seen:  # else the watch (or a read) brought a newer map meanwhile
            self._known = answer
        return True

    async def _create(self, api: KubeApi, name: str, owned: dict[str, str]) -> bool:
        """False when someone created it meanwhile (409)."""
        configmap = ConfigMap(
            metadata=ObjectMeta(
                name=name, namespace=deviceinfo.NAMESPACE, labels={deviceinfo.CONSUMER_LABEL: "true"}
            ),
            data={**owned, deviceinfo.SEPARATED_KEY: ""},
        )
        seen = self._seen
        try:
            answer = await api.call("create", "configmaps", api.client.create(configmap))
        except ApiError as exc:
            if exc.status.code == 409:
                return False
            raise
        if self._seen == seen:
            self._known = answer
        log.info("Created ConfigMap %s/%s for Volcano", deviceinfo.NAMESPACE, name)
        return True


async def _get_map(api: KubeApi, name: str) -> ConfigMap:
    return await api.call(
        "get", "configmaps", api.client.get(ConfigMap, name, namespace=deviceinfo.NAMESPACE)
    )
