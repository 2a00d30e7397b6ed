"""The stand-in's plugin watcher itself, against a small grpcio plugin that serves pluginregistration and
DevicePlugin: what the agent's plugin-watcher tests rely on, checked without the agent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from tests.support.gokubelet import GoKubelet

pytestmark = pytest.mark.interop

RESOURCE = "example.com/widget"


class WatchedPlugin:
    """A device plugin on grpcio that registers through the plugin watcher: ``registry`` serves GetInfo and
    records NotifyRegistrationStatus; ``endpoint`` serves DevicePlugin with two healthy devices."""

    def __init__(
        self,
        registry: Path,
        endpoint: Path,
        api: tuple[ModuleType, ModuleType],
        registration_api: tuple[ModuleType, ModuleType],
        plugin_type: str = "DevicePlugin",
    ) -> None:
        self.registry, self.endpoint, self.plugin_type = registry, endpoint, plugin_type
        self.pb = api[0]
        self.reg = registration_api[0]
        self.statuses: list[tuple[bool, str]] = []
        self._cond = threading.Condition()
        endpoint.parent.mkdir(parents=True, exist_ok=True)
        registry.parent.mkdir(parents=True, exist_ok=True)
        self._plugin = self._serve(endpoint, "v1beta1.DevicePlugin", _DevicePlugin(self).handlers())
        self._registration = self._serve(
            registry, "pluginregistration.Registration", _Registration(self).handlers()
        )

    @staticmethod
    def _serve(path: Path, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> grpc.Server:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, handlers)])
        server.add_insecure_port(f"unix:{path}")
        server.start()
        return server

    def wait_statuses(self, count: int, timeout: float = 10.0) -> list[tuple[bool, str]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.statuses) >= count, timeout), (
                f"{count} NotifyRegistrationStatus call(s) expected, got {self.statuses}"
            )
            return list(self.statuses)

    def stop(self) -> None:
        self._registration.stop(0).wait(5)
        self._plugin.stop(0).wait(5)

    def notified(self, registered: bool, error: str) -> None:
        with self._cond:
            self.statuses.append((registered, error))
            self._cond.notify_all()


class _Registration:
    def __init__(self, plugin: WatchedPlugin) -> None:
        self._plugin = plugin

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        reg = self._plugin.reg
        return {
            "GetInfo": grpc.unary_unary_rpc_method_handler(
                self.GetInfo, reg.InfoRequest.FromString, reg.PluginInfo.SerializeToString
            ),
            "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                self.NotifyRegistrationStatus,
                reg.RegistrationStatus.FromString,
                reg.RegistrationStatusResponse.SerializeToString,
            ),
        }

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        plugin = self._plugin
        return plugin.reg.PluginInfo(
            type=plugin.plugin_type,
            name=RESOURCE,
            endpoint=str(plugin.endpoint),
            supported_versions=["v1beta1"],
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._plugin.notified(request.plugin_registered, request.error)
        return self._plugin.reg.RegistrationStatusResponse()


class _DevicePlugin:
    def __init__(self, plugin: WatchedPlugin) -> None:
        self._plugin = plugin

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        pb = self._plugin.pb
        return {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
                self.GetDevicePluginOptions, pb.Empty.FromString, pb.DevicePluginOptions.SerializeToString
            ),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self.ListAndWatch, pb.Empty.FromString, pb.ListAndWatchResponse.SerializeToString
            ),
        }

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._plugin.pb.DevicePluginOptions(pre_start_required=True)

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        pb = self._plugin.pb
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=f"w-{i}", health="Healthy") for i in range(2)])
        # Held open until the stand-in or the server's stop cancels it.
        ended = threading.Event()
        context.add_callback(ended.set)
        ended.wait(60)


@pytest.fixture
def plugin_factory(
    short_dir: Path,
    kubelet_api: tuple[ModuleType, ModuleType],
    registration_api: tuple[ModuleType, ModuleType],
) -> Iterator[Any]:
    started: list[WatchedPlugin] = []

    def start(plugin_type: str = "DevicePlugin") -> WatchedPlugin:
        plugin = WatchedPlugin(
            short_dir / "registry" / "example.com_widget.sock",
            short_dir / "plugins" / "widget.sock",
            kubelet_api,
            registration_api,
            plugin_type,
        )
        started.append(plugin)
        return plugin

    yield start
    for plugin in started:
        plugin.stop()


def test_a_new_registry_socket_is_registered_and_told(
    watching_kubelet: GoKubelet, plugin_factory: Any
) -> None:
    plugin = plugin_factory()
    (registration,) = watching_kubelet.wait_registrations(1)
    assert (registration.resource, registration.socket) == (RESOURCE, str(plugin.endpoint))
    assert registration.options == {"pre_start_required": True, "get_preferred_allocation_available": False}
    assert registration.registry == str(plugin.registry)
    update = watching_kubelet.wait_update(lambda u: u.resource == RESOURCE)
    assert update.health() == {"w-0": "Healthy", "w-1": "Healthy"}
    assert plugin.wait_statuses(1) == [(True, "")]


def test_a_socket_there_before_the_kubelet_is_found_by_its_scan(
    standin_binary: Path, short_dir: Path, plugin_factory: Any
) -> None:
    plugin = plugin_factory()
    with GoKubelet(short_dir / "kubelet", plugin.registry.parent, binary=standin_binary) as kubelet:
        kubelet.wait_registrations(1)
        assert plugin.wait_statuses(1) == [(True, "")]


def test_an_invalid_plugin_is_told_why_and_tried_again(
    watching_kubelet: GoKubelet, plugin_factory: Any
) -> None:
    plugin = plugin_factory(plugin_type="CSIPlugin")
    statuses = plugin.wait_statuses(2)
    assert statuses[:2] == [(False, 'plugin type "CSIPlugin" is not handled: only "DevicePlugin"')] * 2
    assert watching_kubelet.registrations == []


def test_a_restart_rescans_and_removing_the_socket_deregisters(
    watching_kubelet: GoKubelet, plugin_factory: Any
) -> None:
    plugin = plugin_factory()
    plugin.wait_statuses(1)
    watching_kubelet.restart()
    watching_kubelet.wait_registrations(2)
    assert plugin.wait_statuses(2) == [(True, "")] * 2
    assert plugin.endpoint.is_socket(), "the restart's wipe touches only the device-plugins directory"
    ended = watching_kubelet.count("stream-ended")
    plugin.registry.unlink()
    assert watching_kubelet.wait_event("deregistered")["resource"] == RESOURCE
    watching_kubelet.wait_event("stream-ended", after=ended)
