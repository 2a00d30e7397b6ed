"""vNPUs on the fake backend (``--fake-vnpus`` and the state file), against the grpcio kubelet stand-in: one
vNPU per container, replicas never multiply a vNPU, and the state file splits chips live."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from tests.support.agent_process import fake_agent
from tests.support.http_probe import free_port, get, wait_answer
from tests.support.kubelet_standin import KubeletStandin

CHIPS = "huawei.com/Ascend310P"
TWO = "huawei.com/Ascend310P-2c"


def test_one_vnpu_per_container_and_live_splits(kubelet: KubeletStandin, short_dir: Path) -> None:
    state = short_dir / "state.json"
    state.write_text("{}")
    port = free_port()
    agent = fake_agent(
        kubelet.directory, "--fake-model", "310P3", "--fake-chips", "4", "--fake-vnpus", "0:vir02,0:vir02",
        "--replicas", "2", "--fake-state", str(state), "--metrics-address", f"127.0.0.1:{port}",
    )  # fmt: skip
    try:
        kubelet.wait_for(
            lambda: (
                (two := kubelet.latest(TWO)) is not None
                and set(two.health()) == {"Ascend310P-2c-100-0", "Ascend310P-2c-101-0"}
                and (chips := kubelet.latest(CHIPS)) is not None
                and len(chips.devices) == 6
            ),
            what="chip 0 as two vNPUs, chips 1-3 twice each",
        )
        assert not any(device.startswith("Ascend310P-0") for device in kubelet.latest(CHIPS).health())  # type: ignore[union-attr]
        channel, stub = kubelet.plugin_stub(TWO)
        pb = kubelet.pb
        with pytest.raises(grpc.RpcError) as refused:
            stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[
                        pb.ContainerAllocateRequest(
                            devices_ids=["Ascend310P-2c-100-0", "Ascend310P-2c-101-0"]
                        )
                    ]
                ),
                timeout=5,
            )
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "a container gets one vNPU" in (refused.value.details() or "")
        one = stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=["Ascend310P-2c-101-0"])]
            ),
            timeout=5,
        ).container_responses[0]
        assert dict(one.envs) == {"ASCEND_VISIBLE_DEVICES": "101", "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"}
        assert (one.devices[0].host_path, one.devices[0].container_path) == (
            "/dev/vdavinci101",
            "/dev/davinci101",
        )
        channel.close()

        answer = get(port, "/metrics")
        assert answer is not None
        series = {
            line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1]
            for line in answer[1].splitlines()
            if line[:1] != "#"
        }
        aicores = [
            value
            for name, value in series.items()
            if name.startswith("ascend_agent_vnpu_aicores{")
            and 'chip="Ascend310P-0"' in name
            and 'device="Ascend310P-2c-101-0"' in name
            and 'template="vir02"' in name
        ]
        assert aicores == ["2.0"]
        health = [
            value
            for name, value in series.items()
            if name.startswith("ascend_agent_device_health{") and 'device="Ascend310P-2c-101-0"' in name
        ]
        assert health == ["1.0"]

        state.write_text(json.dumps({"unhealthy": [0]}))
        kubelet.wait_for(
            lambda: (two := kubelet.latest(TWO)) is not None and set(two.health().values()) == {"Unhealthy"},
            what="the vNPUs of chip 0 Unhealthy with it",
        )

        state.write_text(json.dumps({"vnpus": {"1": ["vir04", "vir04"]}}))
        kubelet.wait_for(
            lambda: (
                (four := kubelet.latest("huawei.com/Ascend310P-4c")) is not None
                and set(four.health()) == {"Ascend310P-4c-116-1", "Ascend310P-4c-117-1"}
                and (chips := kubelet.latest(CHIPS)) is not None
                and {d[0].rsplit("-", 1)[0] for d in chips.devices}
                == {"Ascend310P-0", "Ascend310P-2", "Ascend310P-3"}
            ),
            what="the state file's vNPUs replace --fake-vnpus",
        )
    finally:
        agent.close()


def test_the_vnpus_of_a_held_chip_are_held_with_it(kubelet: KubeletStandin, short_dir: Path) -> None:
    state = short_dir / "state.json"
    state.write_text("{}")
    port = free_port()
    agent = fake_agent(
        kubelet.directory, "--fake-model", "310P3", "--fake-chips", "2", "--fake-vnpus", "0:vir02",
        "--fake-state", str(state), "--flap-threshold", "1", "--metrics-address", f"127.0.0.1:{port}",
    )  # fmt: skip
    try:
        kubelet.wait_for(lambda: (two := kubelet.latest(TWO)) is not None and len(two.devices) == 1)
        state.write_text(json.dumps({"unhealthy": [0]}))
        agent.wait_log("Ascend310P-0 is held Unhealthy")
        state.write_text("{}")  # chip 0 is Healthy again, but held for --flap-quiet

        def healthy_underneath(status: int | None, body: str) -> bool:
            # The hold's quiet period (held_until) starts once the agent has seen the chip Healthy.
            chips = json.loads(body)["chips"] if status == 200 else []
            return any(c["id"] == "Ascend310P-0" and c["held"] and c["held_until"] for c in chips)

        wait_answer(port, "/chips", healthy_underneath, what="chip 0 Healthy underneath its hold")
        assert agent.matching("Ascend310P-2c-100-0 is Healthy again") == []
        update = kubelet.latest(TWO)
        assert update is not None and update.health() == {"Ascend310P-2c-100-0": "Unhealthy"}
    finally:
        agent.close()


def test_a_vnpu_layout_the_fake_backend_ignores_is_said(kubelet: KubeletStandin, short_dir: Path) -> None:
    config = short_dir / "config.yaml"
    config.write_text('vnpu: {"0": [vir02]}\n')
    agent = fake_agent(kubelet.directory, "--fake-model", "310P3", "--config", str(config))
    try:
        agent.wait_log("vnpu: the fake backend does not create vNPUs, so the vnpu: layout is ignored")
        kubelet.wait_for(lambda: kubelet.latest(CHIPS) is not None, what="the chips advertised")
        config.write_text('vnpu: {"0": [vir04]}\n')
        agent.wait_log("the vnpu: layout is ignored", count=2)
    finally:
        agent.close()
