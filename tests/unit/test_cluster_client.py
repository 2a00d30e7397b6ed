"""The cluster client layer against the Kubernetes API emulator over HTTP: credentials, the bounded request,
the failure kinds logged once, ``ascend_agent_kube_api_up``, and the writer where the newest state wins."""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import subprocess
import sys
from pathlib import Path
from typing import cast

import anyio
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType
from prometheus_client import REGISTRY

from ascend_agent.cluster import find_target, node_name, open_side
from ascend_agent.cluster.client import ApiUnavailable, ClusterConnectError, KubeApi, _transport_options
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.cluster.labels import NodeLabels, _patch_labels, node_labels, sanitise
from ascend_agent.cluster.side import ClusterSide
from ascend_agent.cluster.writer import LatestWriter, api_backoff
from ascend_agent.config import ConfigError, Settings
from ascend_agent.model import Chip, Inventory
from tests.support.apiserver import ApiServer


def _api(apiserver: ApiServer, timeout: float = 2.0) -> KubeApi:
    return KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", timeout=timeout)


def _up() -> float | None:
    return REGISTRY.get_sample_value("ascend_agent_kube_api_up")


def test_credentials_flag_then_service_account_then_kubeconfig_env(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBECONFIG": "/env/kc"}
    assert find_target("/flag/kc", in_pod, tmp_path) == ClusterTarget("kubeconfig", Path("/flag/kc"))
    assert find_target(None, in_pod, tmp_path) == ClusterTarget("in-cluster")
    assert find_target(None, {"KUBECONFIG": "/env/kc:/other"}, tmp_path) == ClusterTarget(
        "kubeconfig", Path("/env/kc")
    )
    assert find_target(None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, tmp_path / "absent") is None


def test_node_name_flag_then_environment_then_hostname() -> None:
    assert node_name("flag", {"NODE_NAME": "env"}) == "flag"
    assert node_name(None, {"NODE_NAME": "env"}) == "env"
    assert node_name(None, {}) != ""


def test_cluster_side_off_by_flag_and_without_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert open_side(Settings(cluster=False, kubeconfig=Path("/x"))) is None
    assert open_side(Settings()) is None


def test_unusable_kubeconfig_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--kubeconfig: cannot use kubeconfig .*absent"):
        open_side(Settings(kubeconfig=tmp_path / "absent"))


@pytest.mark.parametrize(
    "content",
    [
        "a: [b\n",  # not YAML
        "- 1\n- 2\n",  # a list, not a map
        "",  # empty
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "contexts: [{name: x, context: {cluster: absent, user: u}}]\nclusters: []\nusers: []\n",
    ],
)
async def test_a_kubeconfig_that_does_not_parse_turns_the_cluster_side_off_in_one_line(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(content)
    target = ClusterTarget("kubeconfig", kubeconfig)
    with pytest.raises(ClusterConnectError, match=f"^cannot use kubeconfig {kubeconfig}: [A-Za-z]+: [^\n]+$"):
        KubeApi.connect(target, "node-1")
    side = ClusterSide(target, "node-1", lambda: [])
    with anyio.fail_after(5):
        await side.run()  # returns: the agent goes on without its cluster side
    assert side.state().detail.startswith(f"off: cannot use kubeconfig {kubeconfig}")
    assert "Traceback" not in caplog.text


def test_agent_without_cluster_side_never_imports_the_client() -> None:
    code = (
        "import sys; import ascend_agent.reconciler, ascend_agent.cli, ascend_agent.cluster\n"
        "from ascend_agent.config import Settings\n"
        "assert ascend_agent.cluster.open_side(Settings(cluster=False)) is None\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightkube', 'httpx2')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(("scheme", "verified"), [("http", False), ("https", True)])
def test_only_a_server_behind_tls_gets_a_verifying_context(
    tmp_path: Path, scheme: str, verified: bool
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{scheme}://127.0.0.1:1'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    api = KubeApi.connect(ClusterTarget("kubeconfig", kubeconfig), "node-1")
    assert api._config is not None
    context = _transport_options(api._config)["verify"]
    # Plain HTTP has no certificate to verify: no CA bundle is read for it.
    assert (context.verify_mode == ssl.CERT_REQUIRED) is verified
    if not verified:
        assert context.cert_store_stats()["x509_ca"] == 0


async def test_requests_reach_the_server_and_mark_it_up(apiserver: ApiServer) -> None:
    apiserver.put("nodes", {"metadata": {"name": "node-1", "labels": {"other": "kept"}}})
    api = _api(apiserver)
    try:
        node = await api.call(
            "patch",
            "nodes",
            api.client.patch(
                Node, "node-1", {"metadata": {"labels": {"mine": "1"}}}, patch_type=PatchType.MERGE
            ),
        )
    finally:
        await api.close()
    assert node.metadata is not None and node.metadata.labels == {"other": "kept", "mine": "1"}
    assert api.health.state().up is True
    assert _up() == 1


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (403, r"patch nodes failed: 403 Forbidden: the agent may not patch nodes \(check its RBAC\)"),
        (401, r"patch nodes failed: 401 Unauthorized"),
        (500, r"patch nodes failed: 500 InternalError"),
    ],
)
async def test_refusals_are_logged_once_while_they_last(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture, status: int, message: str
) -> None:
    apiserver.put("nodes", {"metadata": {"name": "node-1"}})
    apiserver.fail(status, verb="patch", resource="nodes")
    api = _api(apiserver)
    patch = {"metadata": {"labels": {"mine": "1"}}}
    caplog.set_level(logging.INFO, "ascend_agent.cluster")
    try:
        for _ in range(3):
            with pytest.raises(ApiUnavailable) as raised:
                await api.call(
                    "patch", "nodes", api.client.patch(Node, "node-1", patch, patch_type=PatchType.MERGE)
                )
            assert raised.value.failure.status == status
        assert _up() == 0
        assert api.health.state().up is False
        await api.call("get", "nodes", api.client.get(Node, "node-1"))  # another channel works meanwhile
        assert _up() == 0
        apiserver.behave()
        await api.call("patch", "nodes", api.client.patch(Node, "node-1", patch, patch_type=PatchType.MERGE))
    finally:
        await api.close()
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1, failures
    assert re.search(message, failures[0]), failures
    assert [r.getMessage() for r in caplog.records if "works again" in r.getMessage()] == [
        "Kubernetes API: patch nodes works again"
    ]
    assert _up() == 1


async def test_a_hanging_server_is_a_failure_after_the_timeout(apiserver: ApiServer) -> None:
    apiserver.put("nodes", {"metadata": {"name": "node-1"}})
    apiserver.fail("hang")
    api = _api(apiserver, timeout=0.3)
    try:
        with pytest.raises(ApiUnavailable, match=r"get nodes: no answer within 0.3 s"):
            await api.call("get", "nodes", api.client.get(Node, "node-1"))
    finally:
        await api.close()
    assert _up() == 0


async def test_not_found_is_an_answer_not_an_outage(apiserver: ApiServer) -> None:
    api = _api(apiserver)
    try:
        with pytest.raises(ApiError):
            await api.call("get", "nodes", api.client.get(Node, "absent"))
    finally:
        await api.close()
    assert api.health.state().up is True


async def test_a_blocking_request_answers_refuses_and_hangs_as_an_async_one_does(
    apiserver: ApiServer,
) -> None:
    """call_blocking (a worker thread, lightkube's blocking client): the answer, a 404 for the caller, a 500
    as an outage, and a hanging server as a failure after the timeout, each recorded as call records them."""
    apiserver.put("nodes", {"metadata": {"name": "node-1"}})
    api = _api(apiserver, timeout=0.5)
    patch = {"metadata": {"labels": {"mine": "1"}}}
    try:
        node = await api.call_blocking(
            "patch", "nodes", lambda client: client.patch(Node, "node-1", patch, patch_type=PatchType.MERGE)
        )
        assert node.metadata is not None and node.metadata.labels == {"mine": "1"}
        assert api.health.state().up is True
        with pytest.raises(ApiError):
            await api.call_blocking("get", "nodes", lambda client: client.get(Node, "absent"))
        apiserver.fail(500, verb="patch", resource="nodes")
        with pytest.raises(ApiUnavailable, match="patch nodes: 500"):
            await api.call_blocking(
                "patch",
                "nodes",
                lambda client: client.patch(Node, "node-1", patch, patch_type=PatchType.MERGE),
            )
        assert api.health.state().up is False
        apiserver.behave()
        apiserver.fail("hang")
        with pytest.raises(ApiUnavailable, match=r"get nodes: no answer within 0.5 s"):
            await api.call_blocking("get", "nodes", lambda client: client.get(Node, "node-1"))
    finally:
        apiserver.behave()
        await api.close()


async def test_a_blocking_request_to_a_hanging_server_does_not_hold_the_agent_stopping(
    apiserver: ApiServer,
) -> None:
    """Cancelled (the agent stopping) while the server hangs: the wait ends at once, not after the request's
    30 s timeout; the closed client takes no more requests."""
    apiserver.put("nodes", {"metadata": {"name": "node-1"}})
    apiserver.fail("hang")
    api = _api(apiserver, timeout=30)
    try:
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(api.call_blocking, "get", "nodes", lambda client: client.get(Node, "node-1"))
                await anyio.to_thread.run_sync(
                    apiserver.wait_for, lambda: [s for s in apiserver.seen() if s.resource == "nodes"], bool
                )
                tasks.cancel_scope.cancel()
            await api.close()
    finally:
        apiserver.behave()
    with pytest.raises(ApiUnavailable, match="the client is closed"):
        await api.call_blocking("get", "nodes", lambda client: client.get(Node, "node-1"))


def test_backoff_doubles_to_the_cap_with_full_jitter_and_resets() -> None:
    low, half, high = (api_backoff(rng=lambda r=r: r) for r in (0.0, 0.5, 1.0))
    lows = [low.next() for _ in range(10)]
    halves = [half.next() for _ in range(10)]
    highs = [high.next() for _ in range(10)]
    assert lows == [0.05] * 10, "full jitter down to a tenth of the first wait, never 0"
    assert halves[:3] == [0.25, 0.5, 1.0] and halves[-1] == 15.0
    assert highs[:3] == [0.5, 1.0, 2.0] and max(highs) == highs[-1] == 30.0
    assert high.next(at_least=45.0) == 45.0, "the server's Retry-After when longer"
    half.reset()
    assert half.next() == 0.25


async def test_writer_writes_the_newest_state_and_retries_until_it_lands(apiserver: ApiServer) -> None:
    apiserver.put("nodes", {"metadata": {"name": "node-1"}})
    apiserver.fail(500, verb="patch", resource="nodes")
    api = _api(apiserver)
    written = anyio.Event()

    async def apply(count: int) -> None:
        patch = {"metadata": {"labels": {"count": str(count)}}}
        await api.call("patch", "nodes", api.client.patch(Node, "node-1", patch, patch_type=PatchType.MERGE))
        if count == 99:
            written.set()

    writer: LatestWriter[int] = LatestWriter("labels", apply, api_backoff(first=0.05, cap=0.1))
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(writer.run)
            for count in range(100):
                writer.set(count)
                await anyio.sleep(0)
            await anyio.to_thread.run_sync(
                lambda: apiserver.wait_for(lambda: writer.failures, lambda failures: failures >= 2)
            )
            apiserver.behave()
            with anyio.fail_after(5):
                await written.wait()
            tasks.cancel_scope.cancel()
    finally:
        await api.close()
    node = apiserver.get("nodes", "node-1")
    assert node is not None and node["metadata"]["labels"] == {"count": "99"}
    patches = [s for s in apiserver.seen() if s.verb == "patch"]
    assert writer.writes == 1
    assert len(patches) == writer.failures + 1 < 20
    assert not writer.pending


def test_label_values_are_made_valid_or_skipped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert sanitise("x" * 70) == "x" * 63
    assert sanitise("24.1.RC2 (beta)") == "24.1.RC2--beta"
    assert sanitise("(!)") == ""
    labels = NodeLabels(replicas=lambda: 1)
    inventory = Inventory((Chip.make(0, "310P3"),), driver_version="((?))")
    for _ in range(2):
        labels.observe(inventory)
    assert labels._pending is not None and "huawei.com/driver.version" not in labels._pending
    assert labels._pending["accelerator"] == "huawei-Ascend310P"
    assert "mind-cluster/npu-chip-memory" not in labels._pending, "310P3 has no HBM"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "Node label huawei.com/driver.version not set: '((?))' cannot be made a valid label value"
    ]
    assert node_labels(Inventory(), replicas=1) == {}


async def test_accelerator_is_never_removed_nor_changed_and_set_only_with_a_chip_seen(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """``accelerator`` is what the shipped DaemonSet selects on: removing it takes the agent off the node."""
    caplog.set_level(logging.INFO, "ascend_agent.cluster")
    placed = {"accelerator": "huawei-Ascend910", "huawei.com/npu.count": "8", "team": "a"}
    apiserver.put("nodes", {"metadata": {"name": "node-1", "labels": placed}})
    labels = NodeLabels(lambda: 1)
    for _ in range(2):
        labels.observe(Inventory())  # npu-smi failing at start, no device files yet
    assert labels._pending is None, "no chips: nothing to write"
    assert caplog.text.count("Node labels kept as they are: the agent sees no chips") == 1
    api = _api(apiserver)
    try:
        await _patch_labels(api, {"huawei.com/npu.count": "8"})  # a set of labels without it
        node = apiserver.get("nodes", "node-1")
        assert node is not None and node["metadata"]["labels"] == placed
        await _patch_labels(api, node_labels(Inventory((Chip.make(0, "310P3"),)), replicas=1))
        node = apiserver.get("nodes", "node-1")
    finally:
        await api.close()
    assert node is not None and node["metadata"]["labels"]["accelerator"] == "huawei-Ascend910"
    assert node["metadata"]["labels"]["huawei.com/npu.family"] == "310P"
    assert node["metadata"]["labels"]["team"] == "a"
    assert (
        "Node label accelerator=huawei-Ascend910 kept though the chips say huawei-Ascend310P" in caplog.text
    )


async def test_a_watch_through_stream_records_its_failures(apiserver: ApiServer) -> None:
    apiserver.put("nodes", {"metadata": {"name": "node-1"}})
    api = _api(apiserver)
    try:
        with anyio.fail_after(5):
            async for kind, node in api.stream("nodes", api.client.watch(Node)):
                assert (kind, node.metadata and node.metadata.name) == ("ADDED", "node-1")
                break
        assert api.health.state().up is True
        apiserver.fail(403, verb="watch", resource="nodes")
        with pytest.raises(
            ApiUnavailable, match=r"watch nodes: 403 Forbidden: the agent may not watch nodes"
        ):
            async for _ in api.stream("nodes", api.client.watch(Node)):
                pass
    finally:
        await api.close()
    assert _up() == 0


class _FailsOnce:
    """A cluster feature with a bug on its first run."""

    def __init__(self) -> None:
        self.runs = 0
        self.second = anyio.Event()

    def observe(self, inventory: Inventory) -> None:
        return None

    async def run(self, api: KubeApi) -> None:
        self.runs += 1
        if self.runs == 1:
            raise RuntimeError("a bug")
        self.second.set()
        await anyio.sleep_forever()


async def test_a_failing_feature_is_started_again_not_the_end_of_the_agent(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    feature = _FailsOnce()
    side = ClusterSide(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", lambda: [feature])
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(side.run)
            await feature.second.wait()
            tasks.cancel_scope.cancel()
    assert feature.runs == 2
    assert "Cluster feature _FailsOnce failed; starting it again" in caplog.text


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 3\r\n",  # no Content-Type
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 3\r\n",
    ],
    ids=["no-content-type", "not-json"],
)
async def test_an_error_page_that_is_no_status_object_is_an_outage(
    tmp_path: Path, answer: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """A proxy in front of the API server answers with its own page: the request failed, in one line."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer + b"Connection: close\r\n\r\nbad")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    api = KubeApi.connect(ClusterTarget("kubeconfig", kubeconfig), "node-1", timeout=5.0)
    try:
        for _ in range(2):
            with pytest.raises(ApiUnavailable, match=r"^get nodes: an answer the client cannot read"):
                await api.call("get", "nodes", api.client.get(Node, "node-1"))
    finally:
        await api.close()
        server.close()
    assert api.health.state().up is False
    assert caplog.text.count("get nodes failed") == 1


class _BrokenObserve:
    def observe(self, inventory: Inventory) -> None:
        raise RuntimeError("a bug")

    async def run(self, api: KubeApi) -> None:
        await anyio.sleep_forever()


async def test_wait_loaded_returns_once_the_features_are_loaded(apiserver: ApiServer) -> None:
    feature = _BrokenObserve()
    side = ClusterSide(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", lambda: [feature])
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(side.run)
        with anyio.fail_after(10):
            await side.wait_loaded()
            assert side.features == (feature,)
            await side.wait_loaded()  # loaded already: returns at once
        tasks.cancel_scope.cancel()


async def test_a_feature_failing_on_an_inventory_does_not_fail_the_reconcile(
    apiserver: ApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    labels = NodeLabels(lambda: 1)
    side = ClusterSide(
        ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1", lambda: [_BrokenObserve(), labels]
    )
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(side.run)
        with anyio.fail_after(10):
            await side.wait_loaded()
        side.observe(Inventory((Chip.make(0, "910B4"),)))
        tasks.cancel_scope.cancel()
    got_it = labels._pending if labels._writer is None else labels._writer._desired
    assert got_it == node_labels(Inventory((Chip.make(0, "910B4"),)), 1), (
        "the next feature still got the inventory"
    )
    assert "Cluster feature _BrokenObserve failed on the new inventory" in caplog.text


async def test_a_token_file_that_is_gone_is_an_outage_in_one_line(
    apiserver: ApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The service account's token is read at the first request and again after a 401 (the kubelet rotates
    it): a token file that is gone then is a failed request, not an exception out of the feature."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{apiserver.url}'}}}}]\n"
        f"users: [{{name: u, user: {{tokenFile: '{tmp_path / 'token'}'}}}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    api = KubeApi.connect(ClusterTarget("kubeconfig", kubeconfig), "node-1", timeout=5.0)
    try:
        with pytest.raises(
            ApiUnavailable, match=r"^get nodes: cannot make the request: ConfigError: Token file"
        ):
            await api.call("get", "nodes", api.client.get(Node, "node-1"))
    finally:
        await api.close()
    assert "Traceback" not in caplog.text


async def test_close_gives_up_on_a_client_that_does_not_close() -> None:
    """Shielded from the agent's stop, but not without end: a close that hangs is abandoned after the
    request timeout (without the bound this test waits the whole 20 s and then fails)."""
    abandoned = anyio.Event()

    class HangingClose:
        async def close(self) -> None:
            try:
                await anyio.sleep(20)
            except anyio.get_cancelled_exc_class():
                abandoned.set()
                raise

    api = KubeApi(cast(AsyncClient, HangingClose()), "node-1", "https://127.0.0.1:1", timeout=0.2)
    with anyio.CancelScope() as scope:
        scope.cancel()  # the agent stopping: close still runs
        await api.close()
    assert abandoned.is_set()


def test_a_watch_error_without_a_code_is_an_outage_not_a_crash() -> None:
    """An ERROR event whose Status names no code (a broken server or proxy) comes without an HTTP answer
    of its own: it is taken for a server error, never an AttributeError that restarts the feature."""
    from lightkube.models.meta_v1 import Status

    api = KubeApi(cast(AsyncClient, None), "node-1", "https://127.0.0.1:6443")
    failed = api._failed(
        "watch configmaps", "watch", "configmaps", ApiError(status=Status(message="broken")), frozenset()
    )
    assert isinstance(failed, ApiUnavailable)
    assert failed.failure.status == 500
