"""GetPreferredAllocation and replicas through the RPC, as the kubelet calls them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.support.agent_process import fake_agent
from tests.support.kubelet_standin import KubeletStandin


@contextmanager
def _stub(kubelet: KubeletStandin, *args: str, resource: str = "huawei.com/Ascend910") -> Iterator[Any]:
    process = fake_agent(kubelet.directory, *args)
    try:
        (registration,) = kubelet.wait_registrations(1)
        assert registration.dialed_options.get_preferred_allocation_available is True
        assert registration.options.get_preferred_allocation_available is True
        kubelet.wait_update(lambda u: u.resource == resource)
        channel, stub = kubelet.plugin_stub(resource)
        try:
            yield stub
        finally:
            channel.close()
    finally:
        process.close()


def _prefer(
    kubelet: KubeletStandin, stub: Any, available: list[str], size: int, must: list[str] = ()
) -> list[str]:
    pb = kubelet.pb
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=list(must), allocation_size=size
            )
        ]
    )
    return sorted(stub.GetPreferredAllocation(request).container_responses[0].deviceIDs)


def _ids(*phys: int, prefix: str = "Ascend910") -> list[str]:
    return [f"{prefix}-{p}" for p in phys]


@pytest.mark.parametrize(
    ("available", "size", "expected"),
    [
        (range(8), 4, [0, 1, 2, 3]),
        (range(8), 8, list(range(8))),
        ([0, 1, 2, 3, 5, 6, 7], 4, [0, 1, 2, 3]),
        # 1 chip: a ring with 1 free first, then 3, then 2, then 4.
        ([0, 1, 2, 3, 7], 1, [7]),
        ([0, 1, 2, 3, 5, 6, 7], 1, [5]),
        ([0, 1, 2, 3, 6, 7], 1, [6]),
        # 2 chips: a ring with 2 free first, then 4, then 3.
        ([0, 1, 2, 3, 6, 7], 2, [6, 7]),
        ([0, 1, 2, 3, 5, 6, 7], 2, [0, 1]),
        ([1, 2, 3, 4, 5, 6, 7], 2, [4, 5]),
    ],
)
def test_910a_rings(kubelet: KubeletStandin, available: list[int], size: int, expected: list[int]) -> None:
    with _stub(kubelet, "--fake-model", "910A") as stub:
        assert _prefer(kubelet, stub, _ids(*available), size) == _ids(*expected)


def test_910b_keeps_one_numa_node(kubelet: KubeletStandin) -> None:
    with _stub(kubelet, "--fake-model", "910B4") as stub:
        # NUMA 0 holds chips 0-3, NUMA 1 chips 4-7 on the fake node.
        assert _prefer(kubelet, stub, _ids(0, 1, 4, 5, 6, 7), 4) == _ids(4, 5, 6, 7)
        assert _prefer(kubelet, stub, _ids(0, 1, 2, 5, 6, 7), 3, must=_ids(6)) == _ids(5, 6, 7)


def test_replicas_are_named_allocated_and_spread(kubelet: KubeletStandin) -> None:
    resource = "huawei.com/Ascend310P"
    with _stub(
        kubelet, "--fake-model", "310P3", "--fake-chips", "2", "--replicas", "3", resource=resource
    ) as stub:
        update = kubelet.latest(resource)
        assert update is not None
        assert sorted(update.health()) == [f"Ascend310P-{c}-{r}" for c in range(2) for r in range(3)]
        pb = kubelet.pb
        response = stub.Allocate(
            pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=["Ascend310P-0-0", "Ascend310P-0-2"])
                ]
            )
        )
        (container,) = response.container_responses
        assert container.envs["ASCEND_VISIBLE_DEVICES"] == "0", "two replicas of one chip hand it over once"
        assert [d.host_path for d in container.devices].count("/dev/davinci0") == 1
        available = sorted(update.health())
        chosen = _prefer(kubelet, stub, available, 2)
        assert {device.rsplit("-", 1)[0] for device in chosen} == {"Ascend310P-0", "Ascend310P-1"}
