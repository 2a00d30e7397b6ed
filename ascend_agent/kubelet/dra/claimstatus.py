"""Each prepared claim's devices as the claim's ``status.devices`` (KEP-4817): per device a ``Ready``
condition, a ``Healthy`` condition with the reason its device taint carries, and ``data`` naming the
hardware (model, physical id, vNPU id and template). Written by server-side apply on the claim's status
subresource, with the driver's name as field manager, so that only this driver's entries are touched;
after a prepare, and again when a prepared device's health changes. The API server drops the entries
itself when the claim is deallocated::

    statuses = ClaimStatuses("npu.huawei.com", lambda: side.api)
    statuses.set(prepared_claim, {"npu-1": chip})    # never blocks; written by run()
    statuses.forget(uid)                             # unprepared: nothing more to write
    await statuses.run()    # RBAC: resourceclaims/status patch, resourceclaims/driver associated-node:patch

A write the API server cannot take now (unreachable, 403, 5xx) is retried with back-off; a claim gone or
made again under its name (404, or 409 for another UID) is dropped; a status the API server refuses as
invalid (422) is logged once and not written again until it changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio

from ascend_agent.backoff import Backoff
from ascend_agent.kubelet.dra.claims import PreparedClaim
from ascend_agent.model import Chip

if TYPE_CHECKING:
    from ascend_agent.cluster.client import KubeApi

log = logging.getLogger(__name__)

READY = "Ready"
HEALTHY = "Healthy"
_MAX_MESSAGE = 1024
_RETRY_FIRST = 0.5
_RETRY_CAP = 30.0


def device_data(chip: Chip, admin_access: bool) -> dict[str, Any]:
    """What hardware a device is, as its ``data``.

    >>> from ascend_agent.model import VNpu
    >>> device_data(Chip.make(3, "310P3").slice(VNpu(130, "vir02")), False)
    {'model': '310P3', 'physicId': 3, 'vnpuId': 130, 'template': 'vir02'}
    >>> device_data(Chip.make(1, "910B3"), True)
    {'model': '910B3', 'physicId': 1, 'adminAccess': True}
    """
    data: dict[str, Any] = {"model": chip.model, "physicId": chip.phys_id}
    if chip.vnpu is not None:
        data["vnpuId"] = chip.vnpu.vnpu_id
        data["template"] = chip.vnpu.template
    if admin_access:
        data["adminAccess"] = True
    return data


def health_condition(chip: Chip | None) -> tuple[str, str, str]:
    """(status, reason, message) of a device's ``Healthy`` condition: what its device taint says.

    >>> health_condition(Chip.make(0, "910B3"))
    ('True', 'Healthy', '')
    >>> health_condition(None)
    ('Unknown', 'DeviceGone', 'the device is no longer on this node')
    """
    if chip is None:
        return "Unknown", "DeviceGone", "the device is no longer on this node"
    if chip.held:
        return "False", "Held", (chip.reason or "held after flapping")[:_MAX_MESSAGE]
    if chip.healthy:
        return "True", HEALTHY, ""
    if chip.health_unknown:
        return "Unknown", "NpuSmiDown", (chip.reason or "npu-smi does not answer")[:_MAX_MESSAGE]
    return "False", "Unhealthy", (chip.reason or "unhealthy")[:_MAX_MESSAGE]


@dataclass(frozen=True, slots=True)
class _Claim:
    namespace: str
    name: str
    uid: str


class ClaimStatuses:
    """The ``status.devices`` each prepared claim should have, and the task that writes them."""

    def __init__(
        self,
        driver: str,
        api_of: Callable[[], KubeApi | None],
        backoff: Backoff | None = None,
        now: Callable[[], str] = lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    ) -> None:
        self.driver = driver
        self._api_of = api_of
        self._backoff = backoff or Backoff(_RETRY_FIRST, _RETRY_CAP, jitter=True)
        self._now = now
        self._desired: dict[str, tuple[_Claim, list[dict[str, Any]]]] = {}
        self._written: dict[str, list[dict[str, Any]]] = {}
        self._refused: dict[str, list[dict[str, Any]]] = {}  # 422: not written again until it changes
        # (uid, device, condition type) -> (status, since when)
        self._since: dict[tuple[str, str, str], tuple[str, str]] = {}
        self._changed = anyio.Event()
        self.writes = 0

    def set(self, claim: PreparedClaim, chips: Mapping[str, Chip | None]) -> None:
        """``claim`` is prepared with ``chips`` by device name (None: a device no longer here)."""
        entries = [
            self._entry(claim.uid, device.device_name, device.pool_name, device.admin_access, chips)
            for device in claim.devices
        ]
        self._desired[claim.uid] = (_Claim(claim.namespace, claim.name, claim.uid), entries)
        if self._written.get(claim.uid) != entries:
            self._changed.set()

    def forget(self, uid: str) -> None:
        """``uid`` was unprepared: its status is the API server's to drop."""
        self._desired.pop(uid, None)
        self._written.pop(uid, None)
        self._refused.pop(uid, None)
        self._since = {key: value for key, value in self._since.items() if key[0] != uid}

    @property
    def pending(self) -> list[str]:
        """The UIDs whose status is not written yet."""
        return [
            uid
            for uid, (_, entries) in self._desired.items()
            if self._written.get(uid) != entries and self._refused.get(uid) != entries
        ]

    def _entry(
        self, uid: str, device: str, pool: str, admin_access: bool, chips: Mapping[str, Chip | None]
    ) -> dict[str, Any]:
        chip = chips.get(device)
        status, reason, message = health_condition(chip)
        conditions = [
            self._condition(uid, device, READY, "True", "Prepared", "the claim's CDI spec is written"),
            self._condition(uid, device, HEALTHY, status, reason, message),
        ]
        entry: dict[str, Any] = {
            "driver": self.driver,
            "pool": pool,
            "device": device,
            "conditions": conditions,
        }
        if chip is not None:
            entry["data"] = device_data(chip, admin_access)
        return entry

    def _condition(
        self, uid: str, device: str, kind: str, status: str, reason: str, message: str
    ) -> dict[str, str]:
        """A condition whose ``lastTransitionTime`` is when its status last changed (as this process saw)."""
        key = (uid, device, kind)
        seen = self._since.get(key)
        if seen is None or seen[0] != status:
            seen = self._since[key] = (status, self._now())
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": seen[1],
        }

    async def run(self) -> None:
        """Write the statuses not written yet, until cancelled."""
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            api = self._api_of()
            if api is None:
                await self._retry_later()
                continue
            asked: float | None = None  # a write failed: retried, not before this (its Retry-After)
            for uid in self.pending:
                if uid in self._desired:
                    retry = await self._write(api, *self._desired[uid])
                    if retry is not None:
                        asked = max(asked or 0.0, retry)
            if asked is not None:
                await self._retry_later(asked)
            else:
                self._backoff.reset()

    async def _retry_later(self, at_least: float = 0.0) -> None:
        await anyio.sleep(self._backoff.next(at_least))
        self._changed.set()

    async def _write(self, api: KubeApi, claim: _Claim, entries: list[dict[str, Any]]) -> float | None:
        """Apply ``entries`` as this driver's part of ``status.devices``; None when that is done, else the
        seconds the API server asked to wait before it is retried (0: it asked nothing)."""
        from lightkube.core.exceptions import ApiError
        from lightkube.types import PatchType

        from ascend_agent.cluster.client import ApiUnavailable
        from ascend_agent.kubelet.dra.claimread import resource_claim

        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
            "status": {"devices": entries},
        }
        where = f"ResourceClaim {claim.namespace}/{claim.name}"
        try:
            await api.call(
                "patch",
                "resourceclaims/status",
                api.client.patch(
                    resource_claim().Status,
                    claim.name,
                    body,
                    namespace=claim.namespace,
                    patch_type=PatchType.APPLY,
                    field_manager=self.driver,
                    force=True,
                ),
            )
        except ApiUnavailable as exc:
            return exc.retry_after  # recorded by the client: /healthz and the log say what fails
        except ApiError as exc:
            code = exc.status.code
            if code in (404, 409):
                log.info("Status of %s not written: the claim is gone (%s)", where, exc.status.message)
                self._desired.pop(claim.uid, None)
                return None
            if self._refused.get(claim.uid) is None:
                log.warning(
                    "Status of %s refused: %s %s; written again when the devices' health changes",
                    where,
                    code,
                    (exc.status.message or "")[:_MAX_MESSAGE],
                )
            self._refused[claim.uid] = entries
            return None
        self._written[claim.uid] = entries
        self._refused.pop(claim.uid, None)
        self.writes += 1
        return None
