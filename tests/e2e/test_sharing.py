"""Sharing the way NVIDIA's time-slicing does it: with ``renameShared`` shared chips are advertised as
``<resource>.shared``; with ``failRequestsGreaterThanOne`` a container asking for two replicas is refused."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.support.agent_process import fake_agent
from tests.support.kubelet_standin import KubeletStandin

SHARED = "huawei.com/Ascend310P.shared"


def _config(directory: Path, **settings: object) -> Path:
    path = directory / "sharing.yaml"
    path.write_text("".join(f"{key}: {str(value).lower()}\n" for key, value in settings.items()))
    return path


def test_shared_chips_are_renamed_and_one_replica_per_container(
    kubelet: KubeletStandin, short_dir: Path
) -> None:
    config = _config(short_dir, renameShared=True, failRequestsGreaterThanOne=True)
    agent = fake_agent(kubelet.directory, "--fake-model", "310P3", "--fake-chips", "2", "--replicas", "3",
                       "--config", str(config))  # fmt: skip
    channel = None
    try:
        (registration,) = kubelet.wait_registrations(1)
        assert registration.resource_name == SHARED
        update = kubelet.wait_update(lambda u: u.resource == SHARED, what="the shared device list")
        assert sorted(update.health()) == [f"Ascend310P-{c}-{r}" for c in range(2) for r in range(3)]
        pb = kubelet.pb
        channel, stub = kubelet.plugin_stub(SHARED)
        one = pb.ContainerAllocateRequest(devices_ids=["Ascend310P-1-2"])
        (container,) = stub.Allocate(pb.AllocateRequest(container_requests=[one])).container_responses
        assert container.envs["ASCEND_VISIBLE_DEVICES"] == "1"
        two = pb.ContainerAllocateRequest(devices_ids=["Ascend310P-0-0", "Ascend310P-1-0"])
        with pytest.raises(grpc.RpcError) as refused:
            stub.Allocate(pb.AllocateRequest(container_requests=[two]))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "failRequestsGreaterThanOne allows 1 per container" in refused.value.details()
        assert SHARED in refused.value.details()
    finally:
        if channel is not None:
            channel.close()
        agent.close()


def test_without_sharing_nothing_is_renamed(kubelet: KubeletStandin, short_dir: Path) -> None:
    config = _config(short_dir, renameShared=True, failRequestsGreaterThanOne=True)
    agent = fake_agent(
        kubelet.directory, "--fake-model", "310P3", "--fake-chips", "2", "--config", str(config)
    )
    try:
        (registration,) = kubelet.wait_registrations(1)
        assert registration.resource_name == "huawei.com/Ascend310P"
    finally:
        agent.close()
