"""``--registration plugin-watcher`` from the kubelet's side, with grpcio as its plugin watcher: GetInfo names
the endpoint, NotifyRegistrationStatus's verdict reaches the log and /readyz, SIGTERM removes both sockets."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from tests.support.agent_process import AgentProcess
from tests.support.http_probe import free_port, wait_answer

RESOURCE = "huawei.com/Ascend910"


@dataclass
class _Node:
    agent: AgentProcess
    registry: Path
    endpoints: Path
    port: int


@pytest.fixture
def node(short_dir: Path) -> Iterator[_Node]:
    registry, endpoints, port = short_dir / "registry", short_dir / "plugin", free_port()
    for kubelets_own in (registry, short_dir / "dp"):  # the kubelet makes them; the agent waits for them
        kubelets_own.mkdir()
    agent = AgentProcess(
        ["run", "--backend", "fake", "--registration", "plugin-watcher",
         "--kubelet-dir", str(short_dir / "dp"),
         "--plugins-registry-dir", str(registry), "--plugin-dir", str(endpoints),
         "--metrics-address", f"127.0.0.1:{port}"]
    )  # fmt: skip
    agent.wait_log("Found device /dev/davinci7")
    yield _Node(agent, registry, endpoints, port)
    agent.close()


def _registration(node: _Node, api: tuple[ModuleType, ModuleType]) -> tuple[grpc.Channel, Any]:
    socket = node.registry / "huawei.com_Ascend910.sock"
    wait_answer(node.port, "/readyz", lambda status, body: socket.is_socket())
    channel = grpc.insecure_channel(f"unix://{socket}")
    return channel, api[1].RegistrationStub(channel)


def test_get_info_names_the_endpoint_and_the_verdict_is_logged(
    node: _Node,
    registration_api: tuple[ModuleType, ModuleType],
    kubelet_api: tuple[ModuleType, ModuleType],
) -> None:
    pb, _ = registration_api
    channel, registration = _registration(node, registration_api)
    try:
        info = registration.GetInfo(pb.InfoRequest(), timeout=5)
        assert (info.type, info.name, list(info.supported_versions)) == (
            "DevicePlugin",
            RESOURCE,
            ["v1beta1"],
        )
        assert info.endpoint == str(node.endpoints / "Ascend910.sock")
        assert not (node.endpoints.parent / "dp" / "Ascend910.sock").exists(), "nothing in device-plugins"

        registration.NotifyRegistrationStatus(
            pb.RegistrationStatus(plugin_registered=False, error="no plugin for you"), timeout=5
        )
        node.agent.wait_log(
            "Cannot register huawei.com/Ascend910: the kubelet refused the registration: no plugin"
        )
        status, _ = wait_answer(node.port, "/readyz", lambda status, body: "no plugin for you" in body)
        assert status == 503

        # As the kubelet does: dial the endpoint, ask for the options, open ListAndWatch, then say registered.
        device_pb, device_grpc = kubelet_api
        plugin_channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        plugin = device_grpc.DevicePluginStub(plugin_channel)
        plugin.GetDevicePluginOptions(device_pb.Empty(), timeout=5)
        stream = plugin.ListAndWatch(device_pb.Empty())
        assert len(next(stream).devices) == 8
        registration.NotifyRegistrationStatus(pb.RegistrationStatus(plugin_registered=True), timeout=5)
        node.agent.wait_log(r"Registered resource huawei\.com/Ascend910$")
        assert wait_answer(node.port, "/readyz", lambda status, body: status == 200)[0] == 200
        stream.cancel()
        plugin_channel.close()
    finally:
        channel.close()


def test_sigterm_removes_the_registry_socket_and_the_endpoint(
    node: _Node, registration_api: tuple[ModuleType, ModuleType]
) -> None:
    channel, _ = _registration(node, registration_api)
    channel.close()
    assert (node.endpoints / "Ascend910.sock").is_socket()
    code, _ = node.agent.terminate(signal.SIGTERM)
    assert code == 0
    assert not (node.registry / "huawei.com_Ascend910.sock").exists()
    assert not (node.endpoints / "Ascend910.sock").exists()
    assert (node.endpoints / "agent.lock").exists(), (
        "the lock file stays; the lock itself went with the process"
    )
