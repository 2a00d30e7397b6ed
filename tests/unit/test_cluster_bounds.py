"""Every answer of the API server is bounded in bytes: an API server gone wrong that streams without end is
an outage of one line, never the agent's memory."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import anyio
import pytest
from lightkube.resources.core_v1 import Node

from ascend_agent.cluster.bounded import MIB
from ascend_agent.cluster.client import ApiUnavailable, KubeApi
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.cluster.side import ClusterSide
from ascend_agent.config import Settings
from tests.support.endless_api import EndlessApi


def _api(server: EndlessApi, list_limit: int = 64 * MIB) -> KubeApi:
    return KubeApi.connect(
        ClusterTarget("kubeconfig", server.kubeconfig), "node-1", timeout=5, list_limit=list_limit
    )


def _node_list(size: int, more: bool = False) -> bytes:
    """A NodeList of about ``size`` bytes; with ``more``, a page that says another follows."""
    label = "x" * 60
    per_node = len(json.dumps({"metadata": {"name": "node-00000", "labels": {"a": label}}})) + 2
    items = [{"metadata": {"name": f"node-{i:05}", "labels": {"a": label}}} for i in range(size // per_node)]
    metadata = {"continue": "more"} if more else {}
    return json.dumps({"kind": "NodeList", "apiVersion": "v1", "metadata": metadata, "items": items}).encode()


@pytest.mark.parametrize("request_kind", ["get", "blocking get", "watch"])
async def test_an_answer_without_end_is_an_outage_not_all_the_memory(
    short_dir: Path, request_kind: str
) -> None:
    with EndlessApi(short_dir) as server:
        api = _api(server)
        try:
            with anyio.fail_after(5), pytest.raises(ApiUnavailable) as raised:
                if request_kind == "get":
                    await api.call("get", "nodes", api.client.get(Node, "node-1"))
                elif request_kind == "blocking get":
                    await api.call_blocking("get", "nodes", lambda client: client.get(Node, "node-1"))
                else:
                    async for _ in api.stream("nodes", api.client.watch(Node)):
                        pass
        finally:
            await api.close()
    what = "a watch event" if request_kind == "watch" else "an answer"
    assert str(raised.value).endswith(
        f"nodes: {what} over 4 MiB, refused (a broken API server, or something else answering at its address)"
    )
    assert api.health.state().up is False


async def test_a_watch_is_bounded_per_event_not_in_all(short_dir: Path) -> None:
    event = json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": "node-1"}}}).encode() + b"\n"
    events = event * (65536 // len(event))
    with EndlessApi(short_dir, repeated=events) as server:
        api = _api(server)
        try:
            seen = 0
            with anyio.fail_after(30):
                async for kind, node in api.stream("nodes", api.client.watch(Node)):
                    assert (kind, node.metadata and node.metadata.name) == ("MODIFIED", "node-1")
                    seen += 1
                    if seen * len(event) > 12 * MIB:
                        break
        finally:
            await api.close()


async def test_a_list_may_be_larger_than_one_object_up_to_its_own_limit(short_dir: Path) -> None:
    answer = _node_list(6 * MIB)
    with EndlessApi(short_dir, answer=answer) as server:
        api = _api(server, list_limit=8 * MIB)
        try:

            async def listed() -> list[Node]:
                return [node async for node in api.client.list(Node)]

            nodes = await api.call("list", "nodes", listed())
            assert len(nodes) > 50_000
            with pytest.raises(ApiUnavailable, match=r"get nodes: an answer over 4 MiB, refused"):
                await api.call("get", "nodes", api.client.get(Node, "node-1"))
        finally:
            await api.close()


async def test_the_pages_of_one_list_share_its_limit(short_dir: Path) -> None:
    """A server that says "continue" without end: each page is small, all of them together are not."""
    with EndlessApi(short_dir, answer=_node_list(MIB, more=True)) as server:
        api = _api(server, list_limit=4 * MIB)
        try:

            async def listed() -> int:
                return len([node async for node in api.client.list(Node)])

            with pytest.raises(
                ApiUnavailable, match=r"^list nodes: a list \(apiListLimitMib\) over 4 MiB, refused"
            ):
                await api.call("list", "nodes", listed())
        finally:
            await api.close()
    assert server.sent < 8 * MIB


async def test_a_compressed_answer_is_refused_it_would_be_bounded_only_before_inflating(
    short_dir: Path,
) -> None:
    inflated = json.dumps({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "node-1"}}).encode()
    with EndlessApi(
        short_dir, answer=gzip.compress(inflated), headers="Content-Encoding: gzip\r\n"
    ) as server:
        api = _api(server)
        try:
            with pytest.raises(
                ApiUnavailable, match=r"get nodes: an answer compressed \(gzip\) though asked not to be"
            ):
                await api.call("get", "nodes", api.client.get(Node, "node-1"))
        finally:
            await api.close()


async def test_the_list_limit_is_the_setting(short_dir: Path) -> None:
    with EndlessApi(short_dir) as server:
        side = ClusterSide(
            ClusterTarget("kubeconfig", server.kubeconfig),
            "node-1",
            lambda: [],
            settings=Settings(api_list_limit_mib=3),
        )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(side.run)
            with anyio.fail_after(10):
                await side.wait_loaded()
            assert side.api is not None and side.api.list_limit == 3 * MIB
            tasks.cancel_scope.cancel()
