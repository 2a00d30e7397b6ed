"""What the scheduler allocated to a claim on this node, read from its ResourceClaim and kept.

An allocation never changes once made, so a claim read once is answered from memory for as long as its UID
is the one asked for; the kubelet's NodePrepareResources for a claim seen before makes no request::

    reader = ClaimReader(lambda: side.api, "npu.huawei.com", "node-1", wait_client=side.wait_loaded)
    results = await reader.allocated(Claim(namespace="default", uid="...", name="train"))
    # ClaimError("...") with one line when the claim is not ours to prepare

The driver registers with the kubelet before the cluster side has loaded its client (a second or so after the
start): a claim asked for meanwhile waits for it, up to :data:`CLIENT_WAIT`, instead of failing and leaving
the kubelet to back off.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import anyio

from ascend_agent.echo import cut
from ascend_agent.kube_names import is_dns_label

if TYPE_CHECKING:
    from ascend_agent.cluster.client import KubeApi

_CACHED = 1024
# How long a claim waits for the cluster side to load its client: well within the kubelet's 45 s for a call.
CLIENT_WAIT = 20.0


@cache
def resource_claim() -> Any:
    """lightkube's class for ResourceClaims. Made on first use: the client library is loaded in a worker
    thread by the cluster side, and importing it here would make the agent's start (the kubelet's
    registration) wait for it."""
    from lightkube.generic_resource import create_namespaced_resource

    return create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")


class ClaimError(Exception):
    """This claim cannot be prepared; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class Allocated:
    """One result of ``status.allocation.devices`` for this driver and pool."""

    request: str
    device: str
    admin_access: bool = False  # the request asked for admin access: monitoring, not exclusive use
    # This driver's opaque parameters that apply to the result's request, in order (the class's first).
    parameters: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class ClaimReader:
    """Reads ResourceClaims through the cluster side's client (``api_of()``: None until it has loaded, and
    ``no_client()`` says why; ``wait_client()`` returns once it has loaded or never will) and keeps the
    allocations it found."""

    def __init__(
        self,
        api_of: Callable[[], KubeApi | None],
        driver: str,
        pool: str,
        no_client: Callable[[], str] = lambda: "the Kubernetes client is still loading",
        wait_client: Callable[[], Awaitable[None]] | None = None,
        client_wait: float = CLIENT_WAIT,
    ) -> None:
        self._api_of = api_of
        self._no_client = no_client
        self._wait_client = wait_client
        self._client_wait = client_wait
        self.driver = driver
        self.pool = pool
        self._known: OrderedDict[str, tuple[Allocated, ...]] = OrderedDict()

    async def allocated(self, claim: ClaimRef) -> tuple[Allocated, ...]:
        """This driver's devices in ``claim``'s allocation on this node; ClaimError when there is none."""
        known = self._known.get(claim.uid)
        if known is not None:
            self._known.move_to_end(claim.uid)
            return known
        api = self._api_of()
        if api is None and self._wait_client is not None:
            with anyio.move_on_after(self._client_wait):
                await self._wait_client()
            api = self._api_of()
        if api is None:
            raise ClaimError(f"cannot read ResourceClaim {claim}: {self._no_client()}")
        from lightkube.core.exceptions import ApiError

        from ascend_agent.cluster.client import ApiUnavailable

        try:
            found = await api.call(
                "get",
                "resourceclaims",
                api.client.get(resource_claim(), claim.name, namespace=claim.namespace),
                limited=False,  # NodePrepareResources waits on it: never behind the rate limit
            )
        except ApiUnavailable as exc:
            raise ClaimError(f"cannot read ResourceClaim {claim}: {exc.failure}") from None
        except ApiError as exc:
            raise ClaimError(f"cannot read ResourceClaim {claim}: {exc.status.message or exc}") from None
        results = self._results(claim, dict(found))
        self._known[claim.uid] = results
        if len(self._known) > _CACHED:
            self._known.popitem(last=False)
        return results

    def _results(self, claim: ClaimRef, found: dict[str, Any]) -> tuple[Allocated, ...]:
        uid = (found.get("metadata") or {}).get("uid")
        if uid != claim.uid:
            raise ClaimError(
                f"ResourceClaim {claim} has UID {cut(str(uid))}, not {claim.uid}: it was deleted and made "
                "again"
            )
        allocation = (found.get("status") or {}).get("allocation")
        if not allocation:
            raise ClaimError(f"ResourceClaim {claim} is not allocated")
        devices = allocation.get("devices") or {}
        configs = [
            (tuple(c.get("requests") or ()), (c.get("opaque") or {}).get("parameters"))
            for c in sorted(devices.get("config") or (), key=lambda c: c.get("source") != "FromClass")
            if (c.get("opaque") or {}).get("driver") == self.driver
        ]
        results = tuple(
            Allocated(
                r.get("request", ""),
                r["device"],
                r.get("adminAccess") is True,
                tuple(
                    parameters
                    for requests, parameters in configs
                    if not requests or _names(r.get("request", "")) & set(requests)
                ),
            )
            for r in devices.get("results") or ()
            if r.get("driver") == self.driver and r.get("pool") == self.pool and "device" in r
        )
        if not results:
            raise ClaimError(
                f"ResourceClaim {claim} has no device of driver {self.driver} in pool {self.pool}"
            )
        for result in results:
            if not isinstance(result.device, str) or not is_dns_label(result.device):
                raise ClaimError(
                    f"ResourceClaim {claim} is allocated device {cut(str(result.device))!r}, which is no "
                    "device name (a DNS label): check what wrote its allocation"
                )
        return results


def _names(request: str) -> set[str]:
    """The names a config's ``requests`` may give a result's request: ``train/large`` (a prioritized list's
    subrequest) is ``train/large`` or ``train``."""
    return {request, request.split("/", 1)[0]}
