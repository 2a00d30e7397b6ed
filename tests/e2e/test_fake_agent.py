"""The agent on the fake backend, end to end, against the grpcio kubelet stand-in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.kubelet_standin import KubeletStandin

RESOURCE = "huawei.com/Ascend910"


@pytest.fixture
def agent(kubelet: KubeletStandin, short_dir: Path) -> Iterator[AgentProcess]:
    state = short_dir / "state.json"
    state.write_text(json.dumps({"unhealthy": [3], "absent": [7]}))
    process = fake_agent(kubelet.directory, "--fake-state", str(state))
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda u: len(u.devices) == 8, what="the first device list")
    yield process
    process.close()


@pytest.fixture
def stub(kubelet: KubeletStandin, agent: AgentProcess) -> Iterator[object]:
    channel, stub = kubelet.plugin_stub()
    yield stub
    channel.close()


def test_registration_fields_and_dial_back(kubelet: KubeletStandin, agent: AgentProcess) -> None:
    (registration,) = kubelet.registrations
    assert registration.version == "v1beta1"
    assert registration.endpoint == "Ascend910.sock"
    assert registration.resource_name == RESOURCE
    assert registration.options.pre_start_required is False
    # The kubelet dialled the plugin back inside Register and got the same options.
    assert registration.dialed_options is not None
    assert registration.dialed_options.pre_start_required == registration.options.pre_start_required
    assert (kubelet.plugin_socket().stat().st_mode & 0o777) == 0o600


def test_first_list_has_every_chip_with_its_health(kubelet: KubeletStandin, agent: AgentProcess) -> None:
    update = kubelet.latest()
    assert update is not None
    health = update.health()
    assert sorted(health) == sorted(f"Ascend910-{i}" for i in range(8))
    assert health["Ascend910-3"] == "Unhealthy"
    assert health["Ascend910-7"] == "Unhealthy", "an absent chip stays listed, as Unhealthy"
    assert [h for i, h in health.items() if i not in ("Ascend910-3", "Ascend910-7")] == ["Healthy"] * 6
    assert {d[0]: d[2] for d in update.devices}["Ascend910-0"] == [0]
    assert {d[0]: d[2] for d in update.devices}["Ascend910-7"] == [1]


def test_log_lines_operators_grep_for(agent: AgentProcess) -> None:
    for i in range(8):
        agent.wait_log(rf"Found device /dev/davinci{i}$")
    agent.wait_log(r"Registered resource huawei\.com/Ascend910$")


def test_second_concurrent_stream_gets_the_full_list(kubelet: KubeletStandin, stub: object) -> None:
    stream = stub.ListAndWatch(kubelet.pb.Empty())  # type: ignore[attr-defined]
    first = next(stream)
    assert len(first.devices) == 8
    stream.cancel()
    # The kubelet's own stream is still served: a further Allocate works.
    response = stub.Allocate(  # type: ignore[attr-defined]
        kubelet.pb.AllocateRequest(
            container_requests=[kubelet.pb.ContainerAllocateRequest(devices_ids=["Ascend910-0"])]
        )
    )
    assert response.container_responses[0].envs["ASCEND_VISIBLE_DEVICES"] == "0"


def _allocate(kubelet: KubeletStandin, stub: object, *containers: list[str]) -> object:
    request = kubelet.pb.AllocateRequest(
        container_requests=[kubelet.pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
    )
    return stub.Allocate(request, timeout=5)  # type: ignore[attr-defined]


def test_allocate_plain_mode(kubelet: KubeletStandin, stub: object) -> None:
    response = _allocate(kubelet, stub, ["Ascend910-5", "Ascend910-1"])
    (container,) = response.container_responses  # type: ignore[attr-defined]
    assert dict(container.envs) == {"ASCEND_VISIBLE_DEVICES": "1,5", "ASCEND_RUNTIME_OPTIONS": ""}
    assert [(d.host_path, d.container_path, d.permissions) for d in container.devices] == [
        ("/dev/davinci1", "/dev/davinci1", "rw"),
        ("/dev/davinci5", "/dev/davinci5", "rw"),
        ("/dev/davinci_manager", "/dev/davinci_manager", "rw"),
        ("/dev/devmm_svm", "/dev/devmm_svm", "rw"),
        ("/dev/hisi_hdc", "/dev/hisi_hdc", "rw"),
    ]


def test_allocate_several_containers_in_order(kubelet: KubeletStandin, stub: object) -> None:
    response = _allocate(kubelet, stub, ["Ascend910-2"], ["Ascend910-0", "Ascend910-1"], ["Ascend910-6"])
    visible = [c.envs["ASCEND_VISIBLE_DEVICES"] for c in response.container_responses]  # type: ignore[attr-defined]
    assert visible == ["2", "0,1", "6"]


@pytest.mark.parametrize(
    ("containers", "code", "named"),
    [
        ([["Ascend910-42"]], grpc.StatusCode.INVALID_ARGUMENT, "Ascend910-42"),
        ([["Ascend910-" + "9" * 60]], grpc.StatusCode.INVALID_ARGUMENT, "Ascend910-999"),
        ([["Ascend910-1", "Ascend910-1"]], grpc.StatusCode.INVALID_ARGUMENT, "Ascend910-1"),
        ([["Ascend910-0"], []], grpc.StatusCode.INVALID_ARGUMENT, "container request 2"),
        ([["Ascend910-0", "Ascend910-3"]], grpc.StatusCode.FAILED_PRECONDITION, "Ascend910-3"),
        ([["Ascend910-7"]], grpc.StatusCode.FAILED_PRECONDITION, "Ascend910-7"),
    ],
    ids=["unknown", "too-long", "duplicate", "empty-container", "unhealthy", "absent"],
)
def test_allocate_refuses_bad_input_and_keeps_serving(
    kubelet: KubeletStandin,
    stub: object,
    agent: AgentProcess,
    containers: list[list[str]],
    code: object,
    named: str,
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _allocate(kubelet, stub, *containers)
    assert caught.value.code() == code
    assert named in caught.value.details()
    agent.wait_log("Allocate refused")
    assert agent.proc.poll() is None
    assert _allocate(kubelet, stub, ["Ascend910-0"]).container_responses  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "request_bytes", [b"\x0a\x02\x0a\xff", b"\x0a\x03\x0a\x01\xff", b"\x0b"], ids=["cut", "utf8", "group"]
)
def test_allocate_refuses_bytes_that_do_not_decode(
    kubelet: KubeletStandin, agent: AgentProcess, request_bytes: bytes
) -> None:
    channel, _ = kubelet.plugin_stub()
    allocate = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")
    with pytest.raises(grpc.RpcError) as caught:
        allocate(request_bytes, timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert agent.proc.poll() is None
    channel.close()


def test_options_preferred_allocation_and_prestart(kubelet: KubeletStandin, stub: object) -> None:
    pb = kubelet.pb
    options = stub.GetDevicePluginOptions(pb.Empty())  # type: ignore[attr-defined]
    assert options.pre_start_required is False
    request = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=["Ascend910-4", "Ascend910-5", "Ascend910-6"],
                must_include_deviceIDs=["Ascend910-6"],
                allocation_size=2,
            )
        ]
    )
    answer = stub.GetPreferredAllocation(request)  # type: ignore[attr-defined]
    (container,) = answer.container_responses
    assert len(container.deviceIDs) == 2
    assert "Ascend910-6" in container.deviceIDs
    assert set(container.deviceIDs) <= {"Ascend910-4", "Ascend910-5", "Ascend910-6"}
    assert stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["Ascend910-0"])) == (  # type: ignore[attr-defined]
        pb.PreStartContainerResponse()
    )


@pytest.mark.parametrize(
    ("model", "resource", "prefix"),
    [
        ("910A", "huawei.com/Ascend910", "Ascend910"),
        ("910B1", "huawei.com/Ascend910", "Ascend910"),
        ("310P3", "huawei.com/Ascend310P", "Ascend310P"),
        ("310", "huawei.com/Ascend310", "Ascend310"),
    ],
)
def test_fake_models_map_to_resources(
    kubelet: KubeletStandin, model: str, resource: str, prefix: str
) -> None:
    process = fake_agent(kubelet.directory, "--fake-model", model, "--fake-chips", "2")
    try:
        (registration,) = kubelet.wait_registrations(1)
        assert registration.resource_name == resource
        assert registration.endpoint == f"{prefix}.sock"
        update = kubelet.wait_update(lambda u: u.resource == resource)
        assert sorted(update.health()) == [f"{prefix}-0", f"{prefix}-1"]
    finally:
        process.close()


def test_sigterm_exits_zero_quickly_and_removes_the_socket(
    kubelet: KubeletStandin, agent: AgentProcess
) -> None:
    assert kubelet.plugin_socket().exists()
    # With the kubelet's ListAndWatch stream open; how long it takes is measured by bench/footprint.py.
    code, _ = agent.terminate()
    assert code == 0
    assert not kubelet.plugin_socket().exists()


def test_registers_after_the_kubelet_appears_late_and_refuses(
    kubelet_api: tuple[object, object], short_dir: Path
) -> None:
    directory = short_dir / "late"
    directory.mkdir()  # the kubelet's directories are there, from an earlier kubelet run; it is not listening
    (short_dir / "plugins").mkdir()
    process = fake_agent(directory)
    try:
        process.wait_log("Cannot register huawei.com/Ascend910: the kubelet is not listening")
        standin = KubeletStandin(directory, *kubelet_api, refuse=2)  # type: ignore[arg-type]
        standin.start(wipe=False)
        try:
            (registration,) = standin.wait_registrations(1, timeout=15)
            assert standin.refused == 2
            assert registration.resource_name == RESOURCE
            process.wait_log("the kubelet refused the registration")
            process.wait_log("Registered resource huawei.com/Ascend910")
        finally:
            standin.stop()
    finally:
        process.close()
