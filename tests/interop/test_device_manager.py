"""The agent on the fake backend against the grpc-go kubelet stand-in over kubelet.sock: registration and the
dial-back, the device list, Allocate, GetPreferredAllocation, a fault on the stream, the kubelet's checks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import grpc
import pytest

from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.files import write_state
from tests.support.gokubelet import RESOURCE, GoKubelet

pytestmark = pytest.mark.interop


@pytest.fixture
def agent(go_kubelet: GoKubelet, state: Path) -> Iterator[AgentProcess]:
    process = fake_agent(go_kubelet.directory, "--fake-state", str(state))
    go_kubelet.wait_registrations(1)
    go_kubelet.wait_update(lambda u: len(u.devices) == 8, what="the first device list")
    go_kubelet.wait_event("register")  # reported once Register has its answer
    yield process
    process.close()


def test_registration_fields_and_the_dial_back(go_kubelet: GoKubelet, agent: AgentProcess) -> None:
    (attempt,) = go_kubelet.of_kind("register")
    assert attempt.fields == {
        "via": "kubelet.sock",
        "resource": RESOURCE,
        "endpoint": "Ascend910.sock",
        "version": "v1beta1",
        "options": {"pre_start_required": False, "get_preferred_allocation_available": True},
        "ok": True,
        "error": "",
    }
    (registration,) = go_kubelet.registrations
    assert registration.socket == str(go_kubelet.plugin_socket())
    # The options the kubelet acts on are those GetDevicePluginOptions gave on the dial-back.
    assert registration.options == attempt["options"]
    dials = go_kubelet.of_kind("dial")
    assert [(d["socket"], d["ok"]) for d in dials] == [(str(go_kubelet.plugin_socket()), True)]
    agent.wait_log(r"Registered resource huawei\.com/Ascend910$")


def test_the_first_device_list(go_kubelet: GoKubelet, agent: AgentProcess) -> None:
    update = go_kubelet.latest()
    assert update is not None
    assert update.devices == [(f"Ascend910-{i}", "Healthy", [0 if i < 4 else 1]) for i in range(8)]


def test_allocate_two_chips(go_kubelet: GoKubelet, agent: AgentProcess) -> None:
    answer = go_kubelet.allocate(RESOURCE, ["Ascend910-5", "Ascend910-1"])
    assert answer.ok, answer.message
    (container,) = answer.response["container_responses"]
    assert container["envs"] == {"ASCEND_VISIBLE_DEVICES": "1,5", "ASCEND_RUNTIME_OPTIONS": ""}
    nodes = [(d["host_path"], d["container_path"], d["permissions"]) for d in container["devices"]]
    assert nodes == [
        ("/dev/davinci1", "/dev/davinci1", "rw"),
        ("/dev/davinci5", "/dev/davinci5", "rw"),
        ("/dev/davinci_manager", "/dev/davinci_manager", "rw"),
        ("/dev/devmm_svm", "/dev/devmm_svm", "rw"),
        ("/dev/hisi_hdc", "/dev/hisi_hdc", "rw"),
    ]


def test_an_unknown_id_is_an_invalid_argument_naming_it(go_kubelet: GoKubelet, agent: AgentProcess) -> None:
    answer = go_kubelet.allocate(RESOURCE, ["Ascend910-0", "Ascend910-42"])
    assert (answer.ok, answer.code) == (False, "InvalidArgument")
    assert "Ascend910-42" in answer.message
    assert go_kubelet.allocate(RESOURCE, ["Ascend910-0"]).ok, "the plugin serves on after a refusal"


def test_preferred_allocation(go_kubelet: GoKubelet, agent: AgentProcess) -> None:
    available = ["Ascend910-4", "Ascend910-5", "Ascend910-6"]
    answer = go_kubelet.preferred(RESOURCE, 2, available, ["Ascend910-6"])
    assert answer.ok, answer.message
    (container,) = answer.response["container_responses"]
    chosen = container["deviceIDs"]
    assert len(chosen) == 2
    assert "Ascend910-6" in chosen
    assert set(chosen) <= set(available)


def test_a_fault_in_the_state_file_reaches_the_stream_and_goes(
    go_kubelet: GoKubelet, agent: AgentProcess, state: Path
) -> None:
    after = len(go_kubelet.updates)
    write_state(state, {"unhealthy": [3]})
    update = go_kubelet.wait_update(lambda u: u.health()["Ascend910-3"] == "Unhealthy", after=after)
    assert [h for i, h in update.health().items() if i != "Ascend910-3"] == ["Healthy"] * 7
    assert go_kubelet.allocate(RESOURCE, ["Ascend910-3"]).code == "FailedPrecondition"

    after = len(go_kubelet.updates)
    write_state(state, {})
    go_kubelet.wait_update(lambda u: set(u.health().values()) == {"Healthy"}, after=after, what="recovery")
    assert go_kubelet.allocate(RESOURCE, ["Ascend910-3"]).ok


def test_a_stream_the_kubelet_ended_is_registered_again(go_kubelet: GoKubelet, agent: AgentProcess) -> None:
    go_kubelet.end_stream()
    go_kubelet.wait_registrations(2)
    go_kubelet.wait_update(lambda u: len(u.devices) == 8, after=1, what="the list on the new stream")
    assert [a["ok"] for a in go_kubelet.of_kind("register")] == [True, True]


# The stand-in's own contract, checked with a grpcio client: the kubelet's refusals and error texts.
@pytest.mark.parametrize(
    ("version", "resource", "error"),
    [
        ("v1alpha", RESOURCE, 'requested API version "v1alpha" is not supported by kubelet'),
        ("v1beta1", "Ascend910", 'the ResourceName "Ascend910" is invalid'),
        ("v1beta1", "kubernetes.io/npu", 'the ResourceName "kubernetes.io/npu" is invalid'),
        ("v1beta1", "requests.huawei.com/npu", 'the ResourceName "requests.huawei.com/npu" is invalid'),
    ],
    ids=["version", "no-domain", "kubernetes.io", "requests."],
)
def test_register_is_refused_as_the_kubelet_refuses(
    go_kubelet: GoKubelet,
    kubelet_api: tuple[ModuleType, ModuleType],
    version: str,
    resource: str,
    error: str,
) -> None:
    pb, pb_grpc = kubelet_api
    with grpc.insecure_channel(f"unix://{go_kubelet.socket}") as channel:
        request = pb.RegisterRequest(version=version, endpoint="Ascend910.sock", resource_name=resource)
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.RegistrationStub(channel).Register(request, timeout=5)
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.UNKNOWN, error)
    attempt = go_kubelet.wait_event("register")
    assert (attempt["ok"], attempt["error"]) == (False, error)
    assert go_kubelet.of_kind("dial") == [], "nothing is dialled for a refused registration"


def test_a_plugin_not_serving_gets_the_dial_failure(
    go_kubelet: GoKubelet, kubelet_api: tuple[ModuleType, ModuleType]
) -> None:
    pb, pb_grpc = kubelet_api
    with grpc.insecure_channel(f"unix://{go_kubelet.socket}") as channel:
        request = pb.RegisterRequest(version="v1beta1", endpoint="Nobody.sock", resource_name=RESOURCE)
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.RegistrationStub(channel).Register(request, timeout=15)
    assert caught.value.details() == "failed to dial device plugin: context deadline exceeded"
    dials = go_kubelet.of_kind("dial")
    assert dials, "grpc-go tried to connect"
    assert not any(d["ok"] for d in dials)
    assert go_kubelet.registrations == []
