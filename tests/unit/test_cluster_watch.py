"""How lightly the agent uses the API server: watches resumed from their resourceVersion with bookmarks (a
list only on 410 Gone), Retry-After obeyed, and the client's rate limit. Against
tests/support/versioned_api.py, which records every request with its arrival time."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from lightkube.resources.core_v1 import ConfigMap, Pod

from ascend_agent.cluster.client import ApiUnavailable, KubeApi, WatchCursor
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.cluster.faultconfig import NAME, NAMESPACE, FaultConfigFollow
from ascend_agent.health.grading import FaultGrading
from tests.support.versioned_api import VersionedApi


@pytest.fixture
def server(tmp_path: Path) -> Iterator[VersionedApi]:
    with VersionedApi(tmp_path) as api:
        yield api


def _api(server: VersionedApi, qps: float = 0.0, burst: int = 1) -> KubeApi:
    return KubeApi.connect(ClusterTarget("kubeconfig", server.kubeconfig), "node-1", qps=qps, burst=burst)


def _map(codes: list[str]) -> dict[str, object]:
    return {
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "data": {"faultCode.json": json.dumps({"SubHealthFaultCodes": codes})},
    }


async def _until(server: VersionedApi, ready: object) -> None:
    assert callable(ready)
    await anyio.to_thread.run_sync(server.wait_for, ready)


async def test_a_watch_asks_for_bookmarks_and_a_bookmark_only_moves_it_on(server: VersionedApi) -> None:
    """Also the check that lightkube's parts the watch is built from still work as they did."""
    server.put("configmaps", _map([]))
    api, cursor, seen = _api(server), WatchCursor(), []
    try:
        with anyio.fail_after(10):
            watch = api.watch(
                "configmaps", ConfigMap, cursor, namespace=NAMESPACE, fields={"metadata.name": NAME},
                server_timeout=30,
            )  # fmt: skip
            async for kind, found in watch:
                seen.append((kind, found.metadata.name, found.metadata.resourceVersion))
                version = server.put("configmaps", _map(["8C03A000"]), seen=False)
                server.bookmark()
                server.end_watches()
    finally:
        await api.close()
    (watch_request,) = server.arrived("watch")
    assert watch_request.params == {
        "watch": "true",
        "timeoutSeconds": "30",
        "fieldSelector": f"metadata.name={NAME}",
        "allowWatchBookmarks": "true",
    }
    assert seen == [("ADDED", NAME, "101")], "no BOOKMARK reaches the caller"
    assert cursor.version == version == "102", "only the bookmark named 102; the watch ended normally"


async def test_a_watch_from_a_version_the_server_no_longer_has_asks_for_a_list(server: VersionedApi) -> None:
    server.put("configmaps", _map([]))
    server.put("configmaps", _map(["8C03A000"]))
    server.compact()
    api, cursor = _api(server), WatchCursor("101")
    try:
        with anyio.fail_after(10):
            events = [kind async for kind, _ in api.watch("configmaps", ConfigMap, cursor, server_timeout=30)]
    finally:
        await api.close()
    assert events == [] and cursor.version is None
    assert server.arrived("watch")[0].params["resourceVersion"] == "101"


class _Changes:
    """Waits on the grading's changes: a condition on it is checked again at each one."""

    def __init__(self, grading: FaultGrading) -> None:
        self.grading = grading
        self._changed = anyio.Event()
        grading.on_change = self._change

    def _change(self) -> None:
        self._changed.set()

    async def until(self, ready: Callable[[FaultGrading], bool]) -> None:
        while not ready(self.grading):
            await self._changed.wait()
            self._changed = anyio.Event()


@asynccontextmanager
async def _following(server: VersionedApi, grading: FaultGrading) -> AsyncIterator[KubeApi]:
    api = _api(server)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(FaultConfigFollow(grading).run, api)
            yield api
            tasks.cancel_scope.cancel()
    finally:
        await api.close()


async def test_a_watch_ended_or_cut_is_resumed_and_only_410_reads_the_map_again(server: VersionedApi) -> None:
    server.put("configmaps", _map([]))
    grading = FaultGrading.builtin()
    changes = _Changes(grading)
    watches = server.arrived

    async with _following(server, grading):
        with anyio.fail_after(30):
            await _until(server, lambda: server.watching == 1)
            server.end_watches()  # as after timeoutSeconds: opened again from where it was
            await _until(server, lambda: len(watches("watch")) == 2 and server.watching == 1)
            assert watches("watch")[1].params["resourceVersion"] == "101"

            # The API server restarts: a change made meanwhile comes with the resumed watch.
            server.put("configmaps", _map(["8C03A000"]), seen=False)
            server.drop_watches()
            await changes.until(lambda g: 0x8C03A000 in g.table.classes)
            assert watches("watch")[2].params["resourceVersion"] == "101"

            # Deleted while the agent was cut off: noticed all the same.
            server.delete("configmaps", NAME, seen=False)
            server.drop_watches()
            await changes.until(lambda g: g.table.source == "built in")
            assert len(watches("list")) == 1, "no read of the map while the watch could go on"

            # Past what the server keeps: 410, and the map is read again, once.
            server.put("configmaps", _map(["8C03A001"]), seen=False)
            server.compact()
            server.drop_watches()
            await changes.until(lambda g: 0x8C03A001 in g.table.classes)
            await _until(server, lambda: server.watching == 1)
    assert len(watches("list")) == 2 and not watches("get")
    assert "resourceVersion" in watches("watch")[-1].params


async def test_a_map_older_than_what_the_server_keeps_is_read_once_and_watched_from_now(
    server: VersionedApi,
) -> None:
    """After an API server restart every version before it is gone, a map unchanged for long too: read
    with a get, its own version would be refused again at once (a get, a watch and a 410, round and round);
    the list's version is the server's current one."""
    server.put("configmaps", _map(["8C03A000"]))
    grading = FaultGrading.builtin()
    watches = server.arrived
    async with _following(server, grading):
        with anyio.fail_after(30):
            await _until(server, lambda: server.watching == 1)
            other = {"metadata": {"name": "other", "namespace": NAMESPACE}}
            current = server.put("configmaps", other, seen=False)
            server.compact()
            server.drop_watches()
            await _until(server, lambda: len(watches("list")) == 2 and server.watching == 1)
    assert [w.params.get("resourceVersion") for w in watches("watch")] == ["101", "101", current]
    assert len(watches("list")) == 2 and not watches("get")


@pytest.mark.parametrize("asked", ["2", None])
async def test_a_429_with_retry_after_holds_the_next_attempt_that_long(
    server: VersionedApi, asked: str | None
) -> None:
    server.put("configmaps", _map([]))
    server.refuse(429, "watch", retry_after=asked)
    async with _following(server, FaultGrading.builtin()):
        with anyio.fail_after(30):
            await _until(server, lambda: len(server.arrived("watch")) == 2)
    refused, next_one = server.arrived("watch")[:2]
    waited = next_one.at - refused.at
    if asked is None:
        assert waited < 2.0, "without Retry-After, the back-off's first wait (at most 0.5 s)"
    else:
        assert waited >= 2.0
    assert len(server.arrived("list")) == 1, "the refused watch is asked again, not the map read again"


@pytest.mark.parametrize(
    ("status", "asked", "carried"), [(429, "7", 7.0), (503, "9999", 60.0), (500, "7", 0.0)]
)
async def test_retry_after_is_carried_on_the_failure_within_bounds(
    server: VersionedApi, status: int, asked: str, carried: float
) -> None:
    server.refuse(status, "get", retry_after=asked)
    api = _api(server)
    try:
        with pytest.raises(ApiUnavailable) as raised:
            await api.call("get", "configmaps", api.client.get(ConfigMap, NAME, namespace=NAMESPACE))
    finally:
        await api.close()
    assert raised.value.retry_after == carried


async def test_the_rate_limit_spaces_requests_past_the_burst_and_spares_the_kubelets(
    server: VersionedApi,
) -> None:
    server.put("configmaps", _map([]))
    api = _api(server, qps=10.0, burst=3)

    async def get(limited: bool = True) -> None:
        await api.call(
            "get", "configmaps", api.client.get(ConfigMap, NAME, namespace=NAMESPACE), limited=limited
        )

    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                for _ in range(6):
                    tasks.start_soon(get)
            times = [a.at for a in server.arrived("get")]
            assert times[5] - times[0] >= 0.25, "three at once, then one every 0.1 s"
            assert times[2] - times[0] < 0.1

            slow = _api(server, qps=0.5, burst=1)
            try:
                await slow.call("get", "configmaps", slow.client.get(ConfigMap, NAME, namespace=NAMESPACE))
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(slow.call, "get", "configmaps",
                                     slow.client.get(ConfigMap, NAME, namespace=NAMESPACE))  # fmt: skip
                    await anyio.sleep(0)
                    await slow.call("list", "configmaps", _listed(slow), limited=False)
                    assert len(server.arrived("get")) == 7, "the limited one still waits for its token"
            finally:
                await slow.close()
    finally:
        await api.close()
    assert len(server.arrived("get")) == 8


async def _listed(api: KubeApi) -> list[ConfigMap]:
    return [found async for found in api.client.list(ConfigMap, namespace=NAMESPACE)]


async def test_a_watch_quiet_past_its_bookmarks_is_opened_again_from_its_version(
    server: VersionedApi, caplog: pytest.LogCaptureFixture
) -> None:
    """The API server sends a watch that asks for them a bookmark a minute: one that brings nothing for
    ``watch_idle`` is a connection that died unseen, opened again from its version; not an outage."""
    server.put("configmaps", _map([]))
    api = _api(server)
    api.watch_idle = 0.3
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(FaultConfigFollow(FaultGrading.builtin()).run, api)
            with anyio.fail_after(30):
                await _until(server, lambda: len(server.arrived("watch")) >= 3)
            tasks.cancel_scope.cancel()
    finally:
        await api.close()
    assert {w.params["resourceVersion"] for w in server.arrived("watch")} == {"101"}
    assert len(server.arrived("list")) == 1
    assert api.health.state().up is True
    assert not [r.message for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_watch_that_ends_as_soon_as_it_opens_waits_for_the_back_off(server: VersionedApi) -> None:
    """Something that answers a watch and hangs up at once (a proxy, a server going down) must not be asked
    again at once, in a tight loop: each such watch is a failure, and the next waits for the back-off."""
    server.put("configmaps", _map([]))
    server.hang_up(3)
    grading = FaultGrading.builtin()
    changes = _Changes(grading)
    async with _following(server, grading) as api:
        with anyio.fail_after(30):
            await _until(server, lambda: server.watching == 1)
            assert api.health.state().up is False, "a watch that hung up at once is a failure"
            server.put("configmaps", _map(["8C03A000"]))
            await changes.until(lambda g: 0x8C03A000 in g.table.classes)
        assert api.health.state().up is True
    opened = [w.at for w in server.arrived("watch")]
    assert len(opened) == 4
    assert all(later - earlier >= 0.04 for earlier, later in itertools.pairwise(opened))


async def test_a_role_without_list_reads_with_get_and_watches_from_now(
    server: VersionedApi, caplog: pytest.LogCaptureFixture
) -> None:
    """A Role from before the agent listed (get, watch only): the map is read with a get, and watched from
    now (the map first, as ADDED), not from its own version, which a restarted server would refuse."""
    server.put("configmaps", _map(["8C03A000"]))
    server.refuse(403, "list")
    grading = FaultGrading.builtin()
    changes = _Changes(grading)
    async with _following(server, grading):
        with anyio.fail_after(30):
            await changes.until(lambda g: 0x8C03A000 in g.table.classes)
            await _until(server, lambda: server.watching == 1)
    assert len(server.arrived("get")) == 1
    assert "resourceVersion" not in server.arrived("watch")[0].params
    assert any("may not list configmaps" in r.getMessage() for r in caplog.records)


async def test_a_pods_bookmark_moves_the_watch_on_and_keeps_it_open(server: VersionedApi) -> None:
    """A Pod's bookmark carries "containers": null, which no Pod may have: read as a Pod it ended the watch
    as unreadable, and the pods were listed again at every bookmark (once a minute)."""
    server.put("pods", {"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": []}})
    api, cursor, seen = _api(server), WatchCursor(), []
    try:
        with anyio.fail_after(10):
            async for kind, _found in api.watch("pods", Pod, cursor, namespace="*", server_timeout=30):
                seen.append(kind)
                version = server.put("configmaps", _map([]), seen=False)
                server.bookmark()
                server.end_watches()
    finally:
        await api.close()
    assert seen == ["ADDED"]
    assert cursor.version == version, "the bookmark moved it on, and it ended normally"
