"""A kubelet stand-in on grpcio: an HTTP/2 stack and protobuf runtime independent of the agent's.

It behaves as the kubelet's device manager does: on start it removes every socket in its directory, then
serves Registration on ``kubelet.sock``; inside Register it dials the plugin back, asks for its options and
starts ListAndWatch, ending the resource's previous stream. Tests wait on what it saw, never on time.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

from tests.support import PATIENCE, ROOT


def compile_api(out: Path) -> tuple[ModuleType, ModuleType]:
    """(api_pb2, api_pb2_grpc) of the device plugin API: protobuf and grpcio classes compiled now."""
    return compile_proto(out, "deviceplugin/v1beta1/api.proto")


def compile_proto(out: Path, proto: str) -> tuple[ModuleType, ModuleType]:
    """(api_pb2, api_pb2_grpc) of ``protos/<proto>``, compiled now into ``out`` for grpcio, independent of the
    agent's own generated code."""
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    arguments = [
        "protoc",
        f"-I{ROOT / 'protos'}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
    ]
    if protoc.main([*arguments, proto]) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on protos/{proto}")
    sys.path.insert(0, str(out))
    module = proto.removesuffix(".proto").replace("/", ".")
    return importlib.import_module(f"{module}_pb2"), importlib.import_module(f"{module}_pb2_grpc")


@dataclass
class Registration:
    version: str
    endpoint: str
    resource_name: str
    options: Any
    dialed_options: Any = None
    at: float = field(default_factory=time.monotonic)


@dataclass
class Update:
    resource: str
    devices: list[tuple[str, str, list[int]]]
    at: float = field(default_factory=time.monotonic)

    def health(self) -> dict[str, str]:
        return {device_id: health for device_id, health, _ in self.devices}


class KubeletStandin:
    def __init__(
        self,
        directory: Path,
        pb: ModuleType,
        pb_grpc: ModuleType,
        refuse: int = 0,
        *,
        asks_options: bool = True,
    ) -> None:
        """``asks_options=False`` behaves as kubelets up to 1.24: Register answers at once, the options are
        taken from the request, and the dial-back only opens ListAndWatch."""
        self.directory = directory
        self.pb = pb
        self.pb_grpc = pb_grpc
        self.refuse = refuse
        self.asks_options = asks_options
        self.registrations: list[Registration] = []
        self.refused = 0
        self.updates: list[Update] = []
        self.restarts = 0
        self._cond = threading.Condition()
        self._server: grpc.Server | None = None
        self._streams: dict[str, tuple[grpc.Channel, Any]] = {}

    @property
    def socket(self) -> Path:
        return self.directory / "kubelet.sock"

    def plugin_socket(self, resource: str = "huawei.com/Ascend910") -> Path:
        return self.directory / (resource.rpartition("/")[2] + ".sock")

    # lifecycle ------------------------------------------------------------------------------------------
    def start(self, *, wipe: bool = True) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        # A kubelet makes its plugins directory beside device-plugins; the agent's own one goes in it.
        (self.directory.parent / "plugins").mkdir(exist_ok=True)
        if wipe:
            for sock in self.directory.glob("*.sock"):
                sock.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None
        with self._cond:
            streams, self._streams = self._streams, {}
        for channel, call in streams.values():
            call.cancel()
            channel.close()
        self.socket.unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop, then start as a new kubelet does: every socket in the directory is removed."""
        self.stop()
        self.restarts += 1
        self.start()

    def end_stream(self, resource: str = "huawei.com/Ascend910") -> None:
        """End the resource's ListAndWatch stream, as a kubelet that dropped it does (it never re-dials)."""
        with self._cond:
            entry = self._streams.pop(resource, None)
        assert entry is not None, f"no stream open for {resource}"
        entry[1].cancel()
        entry[0].close()

    # what it saw ----------------------------------------------------------------------------------------
    def wait_for(
        self, predicate: Callable[[], bool], timeout: float = PATIENCE, what: str = "condition"
    ) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise AssertionError(
                    f"kubelet stand-in: timed out after {timeout} s waiting for {what}; "
                    f"registrations={[r.resource_name for r in self.registrations]} "
                    f"updates={len(self.updates)}"
                )

    def wait_registrations(self, count: int, timeout: float = PATIENCE) -> list[Registration]:
        self.wait_for(lambda: len(self.registrations) >= count, timeout, f"{count} registration(s)")
        return list(self.registrations)

    def no_registration_beyond(self, count: int, within: float) -> None:
        """A negative check: no registration beyond ``count`` arrives within ``within`` seconds (a bounded
        wait for something that must not happen, not a sleep to let something happen)."""
        try:
            self.wait_registrations(count + 1, timeout=within)
        except AssertionError:
            return
        raise AssertionError(
            f"registration {count + 1} arrived: {[r.resource_name for r in self.registrations]}"
        )

    def wait_update(
        self,
        predicate: Callable[[Update], bool],
        after: int = 0,
        timeout: float = PATIENCE,
        what: str = "update",
    ) -> Update:
        found: list[Update] = []

        def check() -> bool:
            found[:] = [u for u in self.updates[after:] if predicate(u)]
            return bool(found)

        self.wait_for(check, timeout, what)
        return found[0]

    def latest(self, resource: str = "huawei.com/Ascend910") -> Update | None:
        with self._cond:
            for update in reversed(self.updates):
                if update.resource == resource:
                    return update
        return None

    def plugin_stub(self, resource: str = "huawei.com/Ascend910") -> tuple[grpc.Channel, Any]:
        channel = grpc.insecure_channel(f"unix://{self.plugin_socket(resource)}")
        return channel, self.pb_grpc.DevicePluginStub(channel)

    # internals ------------------------------------------------------------------------------------------
    def _on_register(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._cond:
            if self.refused < self.refuse:
                self.refused += 1
                self._cond.notify_all()
                context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet stand-in refuses for now")
        if request.version != "v1beta1":
            context.abort(
                grpc.StatusCode.UNKNOWN,
                f'requested API version "{request.version}" is not supported by kubelet',
            )
        name = request.resource_name
        if "/" not in name or name.startswith("requests.") or name.split("/")[0].endswith("kubernetes.io"):
            context.abort(grpc.StatusCode.UNKNOWN, f'the ResourceName "{name}" is invalid')
        registration = Registration(request.version, request.endpoint, name, request.options)
        # A connection of its own, as the kubelet's fresh grpc-go ClientConn per registration has: grpcio
        # otherwise shares connections process-wide, and one that failed to connect while the socket was
        # being replaced would fail this dial for its ~1 s reconnect back-off.
        channel = grpc.insecure_channel(
            f"unix://{self.directory / request.endpoint}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        stub = self.pb_grpc.DevicePluginStub(channel)
        if self.asks_options:
            try:
                registration.dialed_options = stub.GetDevicePluginOptions(self.pb.Empty(), timeout=10)
            except grpc.RpcError as exc:
                channel.close()
                context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {exc.details()}")
        call = stub.ListAndWatch(self.pb.Empty())
        with self._cond:
            old = self._streams.pop(name, None)
            self._streams[name] = (channel, call)
            self.registrations.append(registration)
            self._cond.notify_all()
        if old is not None:
            old[1].cancel()
            old[0].close()
        threading.Thread(target=self._follow, args=(name, call), daemon=True).start()
        return self.pb.Empty()

    def _follow(self, resource: str, call: Any) -> None:
        try:
            for response in call:
                devices = [
                    (d.ID, d.health, [n.ID for n in d.topology.nodes] if d.HasField("topology") else [])
                    for d in response.devices
                ]
                with self._cond:
                    self.updates.append(Update(resource, devices))
                    self._cond.notify_all()
        except grpc.RpcError:
            pass


class _Registration:
    def __init__(self, standin: KubeletStandin) -> None:
        self._standin = standin

    def Register(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._standin._on_register(request, context)
