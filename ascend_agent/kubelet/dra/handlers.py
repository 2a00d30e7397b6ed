"""The DRA kubelet plugin's gRPC handlers over one :class:`~.service.DraService`: ``DRAPlugin`` v1 and
v1beta1 (the same messages), ``DRAResourceHealth`` v1 and v1alpha1; the requests read into claim references
and the service's answers written into each version's messages::

    server = BoundedServer(grpc_handlers(service))
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from types import ModuleType
from typing import Any

from ascend_agent._proto.dra import v1 as health_v1
from ascend_agent._proto.dra import v1alpha1 as health_v1alpha1
from ascend_agent._proto.dra.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from ascend_agent._proto.dra.k8s.io.kubelet.pkg.apis.dra import v1beta1 as dra_v1beta1
from ascend_agent.kubelet.dra.claimread import ClaimRef
from ascend_agent.kubelet.dra.claims import PreparedClaim
from ascend_agent.kubelet.dra.service import DraService


def grpc_handlers(service: DraService) -> list[object]:
    """The handlers of every API version the kubelet may call, for one grpclib server."""
    return [_PluginV1(service), _PluginV1beta1(service), _HealthV1(service), _HealthV1alpha1(service)]


def _refs(claims: Iterable[dra_v1.Claim | dra_v1beta1.Claim]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


def _prepare_answer(api: ModuleType, answers: Mapping[str, PreparedClaim | str]) -> Any:
    """``answers`` as the NodePrepareResourcesResponse of ``api`` (v1 and v1beta1 share the messages)."""

    def one(answer: PreparedClaim | str) -> Any:
        if isinstance(answer, str):
            return api.NodePrepareResourceResponse(error=answer)
        devices = [
            api.Device(
                request_names=list(d.request_names),
                pool_name=d.pool_name,
                device_name=d.device_name,
                cdi_device_ids=list(d.cdi_device_ids),
            )
            for d in answer.devices
        ]
        return api.NodePrepareResourceResponse(devices=devices)

    return api.NodePrepareResourcesResponse(claims={uid: one(a) for uid, a in answers.items()})


def _unprepare_answer(api: ModuleType, answers: Mapping[str, str]) -> Any:
    return api.NodeUnprepareResourcesResponse(
        claims={uid: api.NodeUnprepareResourceResponse(error=e) for uid, e in answers.items()}
    )


class _PluginV1(dra_v1.DraPluginBase):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def node_prepare_resources(
        self, message: dra_v1.NodePrepareResourcesRequest
    ) -> dra_v1.NodePrepareResourcesResponse:
        with self._service.serving_call():
            answers = await self._service.prepare(_refs(message.claims))
        answer: dra_v1.NodePrepareResourcesResponse = _prepare_answer(dra_v1, answers)
        return answer

    async def node_unprepare_resources(
        self, message: dra_v1.NodeUnprepareResourcesRequest
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        with self._service.serving_call():
            answers = await self._service.unprepare(_refs(message.claims))
        answer: dra_v1.NodeUnprepareResourcesResponse = _unprepare_answer(dra_v1, answers)
        return answer


class _PluginV1beta1(dra_v1beta1.DraPluginBase):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def node_prepare_resources(
        self, message: dra_v1beta1.NodePrepareResourcesRequest
    ) -> dra_v1beta1.NodePrepareResourcesResponse:
        with self._service.serving_call():
            answers = await self._service.prepare(_refs(message.claims))
        answer: dra_v1beta1.NodePrepareResourcesResponse = _prepare_answer(dra_v1beta1, answers)
        return answer

    async def node_unprepare_resources(
        self, message: dra_v1beta1.NodeUnprepareResourcesRequest
    ) -> dra_v1beta1.NodeUnprepareResourcesResponse:
        with self._service.serving_call():
            answers = await self._service.unprepare(_refs(message.claims))
        answer: dra_v1beta1.NodeUnprepareResourcesResponse = _unprepare_answer(dra_v1beta1, answers)
        return answer


class _HealthV1(health_v1.DraResourceHealthBase):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def node_watch_resources(
        self, message: health_v1.NodeWatchResourcesRequest
    ) -> AsyncIterator[health_v1.NodeWatchResourcesResponse]:
        async for update in self._service.health_updates(health_v1):
            yield update


class _HealthV1alpha1(health_v1alpha1.DraResourceHealthBase):
    def __init__(self, service: DraService) -> None:
        self._service = service

    async def node_watch_resources(
        self, message: health_v1alpha1.NodeWatchResourcesRequest
    ) -> AsyncIterator[health_v1alpha1.NodeWatchResourcesResponse]:
        async for update in self._service.health_updates(health_v1alpha1):
            yield update
