"""The cluster feature that follows Huawei's fault-config ConfigMap ``kube-system/mindx-dl-fault-config``: its
``faultCode.json`` and ``faultCustomization.json`` (Huawei's keys and formats) replace the built-in files
of the fault table, read when the map changes; a map deleted brings the built-in table back::

    follow = FaultConfigFollow(grading)
    await follow.run(api)       # reads the map, then watches it; a bad map is refused in one line

A map that cannot be used (not JSON, an unknown key, a code that is not hex, a number out of Huawei's range)
is refused with one line naming the key, and the running table is kept. ``SwitchFaultCode.json`` and
``PollInterval`` are Huawei's keys the agent does not use: accepted and ignored.
RBAC: configmaps in kube-system get, watch (the one name).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import httpx2
from lightkube import ApiError
from lightkube.resources.core_v1 import ConfigMap

from ascend_agent.backoff import wait_before_retry
from ascend_agent.cluster.client import ApiUnavailable, KubeApi, WatchCursor
from ascend_agent.cluster.writer import api_backoff
from ascend_agent.echo import cut
from ascend_agent.health.faulttable import (
    CUSTOMIZATION_KEY,
    FAULT_CODE_KEY,
    IGNORED_KEYS,
    FaultConfigError,
    FaultTable,
)
from ascend_agent.health.grading import FaultGrading
from ascend_agent.model import Inventory

log = logging.getLogger("ascend_agent.cluster")

NAMESPACE = "kube-system"
NAME = "mindx-dl-fault-config"
WHERE = f"ConfigMap {NAMESPACE}/{NAME}"
# A watch is ended by the API server after this long and opened again from where it was (one that silently
# stopped delivering is found sooner, by its missing bookmarks: KubeApi.watch_idle).
REREAD_INTERVAL = 1800.0
_KEYS = frozenset({FAULT_CODE_KEY, CUSTOMIZATION_KEY}) | IGNORED_KEYS


def table_from(data: Mapping[str, str] | None, builtin: FaultTable) -> FaultTable:
    """The fault table a map's ``data`` makes over ``builtin`` (None: no map, the built-in table); raises
    :class:`FaultConfigError` naming the key that cannot be used.

    >>> data = {"faultCode.json": '{"RestartNPUCodes": ["80E18005"]}'}
    >>> table_from(data, FaultTable({})).class_of(0x80E18005)
    <FaultClass.RESTART_NPU: 5>
    """
    if data is None:
        return builtin
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise FaultConfigError(f"unknown key {cut(unknown[0])!r}; the keys are {', '.join(sorted(_KEYS))}")
    return builtin.replaced(data.get(FAULT_CODE_KEY), data.get(CUSTOMIZATION_KEY), source=WHERE)


class FaultConfigFollow:
    """Hands the fault table of ``mindx-dl-fault-config`` (or the built-in one) to ``grading``."""

    def __init__(self, grading: FaultGrading, builtin: FaultTable | None = None) -> None:
        self._grading = grading
        self._builtin = builtin if builtin is not None else FaultTable.builtin()
        self._seen: Mapping[str, str] | None = None
        self._present = False

    def observe(self, inventory: Inventory) -> None:
        """Nothing to write: the map is only read."""

    async def run(self, api: KubeApi) -> None:
        """Read the map, then watch it; a watch that ends or fails is opened again from the newest version
        it saw (a map deleted meanwhile arrives as DELETED), and the map is read again only on 410 Gone."""
        backoff = api_backoff()
        cursor = WatchCursor()
        while True:
            try:
                if cursor.version is None:
                    cursor.version = await self._read(api)
                async for kind, found in api.watch(
                    "configmaps",
                    ConfigMap,
                    cursor,
                    namespace=NAMESPACE,
                    fields={"metadata.name": NAME},
                    server_timeout=int(REREAD_INTERVAL),
                ):
                    if found.metadata is None or found.metadata.name != NAME:
                        continue
                    self._take(None if kind == "DELETED" else dict(found.data or {}))
                    backoff.reset()
            except ApiUnavailable as exc:
                await wait_before_retry(backoff, exc)
            except (ApiError, httpx2.HTTPError) as exc:
                log.debug("Watch of %s ended: %s", WHERE, exc)
                await wait_before_retry(backoff)

    async def _read(self, api: KubeApi) -> str | None:
        """Read the map once and take it; the resourceVersion to watch from."""
        found, version = await api.read_named("configmaps", ConfigMap, NAME, NAMESPACE)
        self._take(None if found is None else dict(found.data or {}))
        return version

    def _take(self, data: Mapping[str, str] | None) -> None:
        if data is not None and data == self._seen and self._present:
            return
        present, self._present, self._seen = data is not None, data is not None, data
        try:
            table = table_from(data, self._builtin)
        except FaultConfigError as exc:
            log.error("%s not applied, keeping the running fault table (%s): %s", WHERE,
                      self._grading.table.source, exc)  # fmt: skip
            return
        if self._grading.update(table):
            if present:
                log.info(
                    "Fault table from %s: %d codes, %d FaultFrequency and %d FaultDuration codes",
                    WHERE,
                    len(table.classes),
                    len(table.frequency),
                    len(table.duration),
                )
            else:
                log.info("%s is gone: the built-in fault table applies again", WHERE)
