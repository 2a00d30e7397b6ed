"""The kubelet's PodResources socket for tests: a grpclib server, in a thread of its own, of
``v1.PodResourcesLister`` with protobuf classes compiled from protos/ at test time (not the agent's own
generated code), answering ``List`` with the holders a test sets.

    standin = PodResourcesStandin(short_dir / "pod-resources.sock", pb)
    standin.start()
    standin.hold("huawei.com/Ascend910", ["Ascend910-3"], namespace="team-a", pod="train-0", container="main")
    standin.claim("npu.huawei.com", "node-1", "npu-1", namespace="team-a", pod="train-0", container="main",
                  claim="train")   # a DRA claim's device, as dynamic_resources
    standin.refuse = True      # List answers UNAVAILABLE
    standin.answer = pb.ListPodResourcesResponse(...)   # List answers this instead, as it is
    standin.stall_next()       # the next List answers, with the holders of when it was asked, once released
    standin.release_stalled()
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import grpclib.const
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from tests.support import PATIENCE


class PodResourcesStandin:
    def __init__(self, path: Path, pb: ModuleType) -> None:
        self.path = path
        self.pb = pb
        self.refuse = False
        self.answer: Any = None
        self.calls = 0
        self._called = threading.Condition()
        self._held: dict[tuple[str, str, str], list[tuple[str, list[str]]]] = {}
        # (namespace, pod, container) -> claim name -> [(driver, pool, device)]
        self._claimed: dict[tuple[str, str, str], dict[str, list[tuple[str, str, str]]]] = {}
        self._lock = threading.Lock()
        self._stall = 0
        self._released: asyncio.Event | None = None  # made on the stand-in's own loop
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pod-resources", daemon=True)
        self._server: Server | None = None

    def hold(self, resource: str, device_ids: list[str], namespace: str, pod: str, container: str) -> None:
        with self._lock:
            self._held.setdefault((namespace, pod, container), []).append((resource, list(device_ids)))

    def claim(
        self, driver: str, pool: str, device: str, namespace: str, pod: str, container: str, claim: str
    ) -> None:
        with self._lock:
            by_claim = self._claimed.setdefault((namespace, pod, container), {})
            by_claim.setdefault(claim, []).append((driver, pool, device))

    def stall_next(self) -> None:
        """The next ``List`` answers only after :meth:`release_stalled`, with the holders as they were when it
        was asked: an answer that arrives after one asked later."""
        with self._lock:
            self._stall += 1

    def release_stalled(self) -> None:
        assert self._released is not None
        self._loop.call_soon_threadsafe(self._released.set)

    def release_all(self) -> None:
        with self._lock:
            self._held.clear()
            self._claimed.clear()

    def wait_calls(self, count: int, timeout: float = PATIENCE) -> None:
        """Wait until ``List`` has been called ``count`` times in all."""
        with self._called:
            if not self._called.wait_for(lambda: self.calls >= count, timeout):
                raise AssertionError(f"List called {self.calls} times within {timeout:g} s, not {count}")

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def stop(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self.path.unlink(missing_ok=True)

    async def _start(self) -> None:
        self._released = asyncio.Event()
        self._server = Server([self])
        await self._server.start(path=str(self.path))

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        # A handler still sending an answer its client refused unread (over the agent's limit) held this stop
        # past 10 s once, the client long gone: the stand-in stops without waiting more than 5 s for it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            "/v1.PodResourcesLister/List": grpclib.const.Handler(
                self._list,
                grpclib.const.Cardinality.UNARY_UNARY,
                self.pb.ListPodResourcesRequest,
                self.pb.ListPodResourcesResponse,
            )
        }

    async def _list(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        with self._called:
            self.calls += 1
            self._called.notify_all()
        if self.refuse:
            raise GRPCError(Status.UNAVAILABLE, "pod resources are not ready")
        if self.answer is not None:
            await stream.send_message(self.answer)
            return
        pods: dict[tuple[str, str], Any] = {}
        with self._lock:
            held = dict(self._held)
            claimed = {key: dict(claims) for key, claims in self._claimed.items()}
            stalled, self._stall = self._stall > 0, max(0, self._stall - 1)
        for key in sorted(held.keys() | claimed.keys()):
            namespace, pod, container = key
            entry = pods.setdefault((namespace, pod), self.pb.PodResources(name=pod, namespace=namespace))
            entry.containers.append(
                self.pb.ContainerResources(
                    name=container,
                    devices=[
                        self.pb.ContainerDevices(resource_name=resource, device_ids=ids)
                        for resource, ids in held.get(key, ())
                    ],
                    cpu_ids=[2, 3],
                    dynamic_resources=[
                        self.pb.DynamicResource(
                            claim_name=name,
                            claim_namespace=namespace,
                            claim_resources=[
                                self.pb.ClaimResource(
                                    cdi_devices=[self.pb.CDIDevice(name=f"{driver}/claim={name}-{device}")],
                                    driver_name=driver,
                                    pool_name=pool,
                                    device_name=device,
                                )
                                for driver, pool, device in devices
                            ],
                        )
                        for name, devices in claimed.get(key, {}).items()
                    ],
                )
            )
        answer = self.pb.ListPodResourcesResponse(pod_resources=list(pods.values()))
        if stalled:
            assert self._released is not None
            await self._released.wait()
        await stream.send_message(answer)


@pytest.fixture(scope="session")
def podresources_api(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    from tests.support.kubelet_standin import compile_proto

    pb, _ = compile_proto(tmp_path_factory.mktemp("grpcio-podresources"), "podresources/v1/api.proto")
    return pb


@pytest.fixture
def podresources(podresources_api: ModuleType, short_dir: Path) -> Any:
    standin = PodResourcesStandin(short_dir / "pod-resources.sock", podresources_api)
    standin.start()
    yield standin
    standin.stop()
