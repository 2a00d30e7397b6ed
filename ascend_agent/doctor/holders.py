"""The doctor's check of the pods on failing devices, in either mode: the kubelet's PodResources view (read
through what the agent's Allocates handed over for the kubelet's IDs, with ``--volcano`` the pods' marks for
the rest) of who holds each Unhealthy device::

    check = await holders_check(settings, [("huawei.com/Ascend910", "Ascend910-3")])

As a device plugin a device is (resource, device ID); as a DRA driver (driver, device name), held through
the claims the kubelet names for each container.
"""

from __future__ import annotations

from ascend_agent.config import DRA_API, Settings
from ascend_agent.doctor.check import API_TIMEOUT, Check


async def holders_check(settings: Settings, failing: list[tuple[str, str]]) -> Check:
    """The pods whose containers hold the ``failing`` devices: the ones to move off this node."""
    from ascend_agent.kubelet.podresources import PodResourcesError, list_holders

    name = "pods on Unhealthy chips"
    try:
        holders = await list_holders(settings.pod_resources_socket)
    except PodResourcesError as exc:
        return Check(name, None, f"skipped: {exc}")
    if settings.kubelet_api != DRA_API:
        from ascend_agent.kubelet.holders import by_chip_once

        holders, problem = await by_chip_once(settings, holders, API_TIMEOUT)
        if problem:
            return Check(name, None, f"skipped: {problem}")
    # As a DRA driver, (driver, device name) of the claims' devices, parts carved from a chip with it; else
    # (resource, device ID).
    dra = settings.kubelet_api == DRA_API
    found = {
        (resource, device): holders.claimed_on(resource, device)
        if dra
        else holders.by_device.get((resource, device), ())
        for resource, device in failing
    }
    held = [
        f"{device} held by {', '.join(map(str, found[(resource, device)]))}"
        for resource, device in failing
        if found[(resource, device)]
    ]
    if not held:
        return Check(name, True, f"none: no pod holds {', '.join(device for _, device in failing)}")
    return Check(
        name,
        False,
        "; ".join(held),
        "these pods run on failing chips: delete them (their controllers place them again on Healthy chips)",
    )
