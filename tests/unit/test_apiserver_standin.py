"""The tests' Kubernetes API server through the real client: what other tests rely on it for."""

from __future__ import annotations

import anyio
import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Pod
from lightkube.types import PatchType

from tests.support.apiserver import ApiServer


async def test_update_watch_and_faults_per_verb(apiserver: ApiServer) -> None:
    apiserver.put(
        "pods",
        {
            "metadata": {"name": "p1", "namespace": "ns"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
        },
    )
    client = AsyncClient(config=KubeConfig.from_file(apiserver.kubeconfig))
    seen: list[tuple[str, dict[str, str]]] = []
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:

                async def watch() -> None:
                    async for kind, pod in client.watch(Pod, namespace="*"):
                        assert pod.metadata is not None
                        seen.append((kind, dict(pod.metadata.annotations or {})))
                        if len(seen) == 2:
                            tasks.cancel_scope.cancel()

                tasks.start_soon(watch)
                await anyio.to_thread.run_sync(
                    lambda: apiserver.wait_for(
                        apiserver.seen, lambda seen: any(s.verb == "watch" for s in seen)
                    )
                )
                patch = {"metadata": {"annotations": {"a": "1"}}}
                await client.patch(Pod, "p1", patch, namespace="ns", patch_type=PatchType.MERGE)
        assert seen == [("ADDED", {}), ("MODIFIED", {"a": "1"})]

        await client.create(
            ConfigMap(metadata=ObjectMeta(name="m", namespace="kube-system"), data={"old": "1"})
        )
        await client.replace(
            ConfigMap(metadata=ObjectMeta(name="m", namespace="kube-system"), data={"new": "2"})
        )
        stored = apiserver.get("configmaps", "m", "kube-system")
        assert stored is not None and stored["data"] == {"new": "2"}

        apiserver.fail(403, verb="update", resource="configmaps")
        with pytest.raises(ApiError) as refused:
            await client.replace(ConfigMap(metadata=ObjectMeta(name="m", namespace="kube-system"), data={}))
        assert refused.value.status.code == 403
        assert (await client.get(ConfigMap, "m", namespace="kube-system")).data == {"new": "2"}
    finally:
        await client.close()
