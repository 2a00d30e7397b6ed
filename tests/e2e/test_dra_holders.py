"""The DRA driver's claims seen from outside, end to end: the agent as a process on the fake backend, the
DRA kubelet stand-in on its sockets, the kubelet's PodResources stand-in naming the pods and claims that hold
devices (``dynamic_resources``), and the Kubernetes API emulator. A prepared claim gets ``status.devices``;
``/metrics``, ``list`` and the doctor name the pod and claim holding a chip."""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import pytest

from ascend_agent._proto.dra.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from tests.e2e.test_dra import DRIVER, NODE, _devices, _Host, _slices, dra_host
from tests.support.apiserver import ApiServer
from tests.support.cli import run_cli
from tests.support.dra_kubelet import DraKubelet
from tests.support.http_probe import free_port, wait_answer
from tests.support.podresources import PodResourcesStandin

host = pytest.fixture(dra_host, name="host")


def _status(apiserver: ApiServer, name: str) -> list[dict[str, Any]]:
    found = apiserver.get("resourceclaims", name, "default") or {}
    devices: list[dict[str, Any]] = (found.get("status") or {}).get("devices") or []
    return devices


def _health(entry: dict[str, Any]) -> tuple[str, str]:
    (healthy,) = [c for c in entry["conditions"] if c["type"] == "Healthy"]
    return healthy["status"], healthy["reason"]


async def test_claims_get_their_status_and_their_holders_are_named(
    host: _Host, apiserver: ApiServer, podresources: PodResourcesStandin
) -> None:
    port = free_port()
    host.start(
        f"--metrics-address=127.0.0.1:{port}",
        f"--pod-resources-socket={podresources.path}",
        "--health-interval=1",
    )
    kubelet = DraKubelet(host.registry)
    await kubelet.register(DRIVER)
    apiserver.wait_for(lambda: _slices(apiserver), lambda found: len(found) == 1)
    train = apiserver.put_claim("train", ["npu-1"], driver=DRIVER, pool=NODE)
    monitor = apiserver.put_claim("monitor", ["npu-1", "npu-2"], driver=DRIVER, pool=NODE, admin_access=True)
    answer = await kubelet.prepare(
        [
            dra_v1.Claim(namespace="default", uid=train, name="train"),
            dra_v1.Claim(namespace="default", uid=monitor, name="monitor"),
        ]
    )
    assert not answer.claims[train].error and not answer.claims[monitor].error, answer

    # status.devices: each device Ready and Healthy, with what hardware it is.
    (entry,) = await anyio.to_thread.run_sync(
        lambda: apiserver.wait_for(lambda: _status(apiserver, "train"), lambda found: len(found) == 1)
    )
    assert (entry["device"], entry["data"]) == ("npu-1", {"model": "910B3", "physicId": 1})
    assert _health(entry) == ("True", "Healthy")
    watched = apiserver.wait_for(lambda: _status(apiserver, "monitor"), lambda found: len(found) == 2)
    assert [e["data"].get("adminAccess") for e in watched] == [True, True]

    # The kubelet's PodResources names the pods of both claims: /metrics carries the claim.
    podresources.claim(DRIVER, NODE, "npu-1", "default", "train-0", "main", "train")
    podresources.claim(DRIVER, NODE, "npu-1", "default", "exporter", "npu-exporter", "monitor")
    podresources.claim(DRIVER, NODE, "npu-2", "default", "exporter", "npu-exporter", "monitor")
    expected = (
        'ascend_agent_chip_held{claim="monitor,train",container="npu-exporter,main",device="Ascend910-1",'
        'namespace="default,default",pod="exporter,train-0"} 0.0'
    )
    await anyio.to_thread.run_sync(
        lambda: wait_answer(port, "/metrics", lambda status, body: expected in body, what="npu-1's holders")
    )
    _, body = await anyio.to_thread.run_sync(lambda: wait_answer(port, "/metrics", lambda s, b: s == 200))
    free = re.search(r'ascend_agent_chip_held\{[^}]*device="Ascend910-3"[^}]*\}', body)
    assert free is not None and 'claim=""' in free.group(0) and 'pod=""' in free.group(0)

    # npu-1 fails: its condition says so in both claims.
    host.faults([1])
    entry = apiserver.wait_for(
        lambda: _status(apiserver, "train"), lambda found: _health(found[0])[0] == "False", timeout=15
    )
    assert _health(entry[0]) == ("False", "Unhealthy")
    apiserver.wait_for(lambda: _devices(apiserver), lambda found: bool(found["npu-1"].get("taints")))

    # `list` and the doctor name the pods and claims holding the failing chip.
    config = host.cli_config(kubeletApi="dra", podResourcesSocket=str(podresources.path))
    listed = await anyio.to_thread.run_sync(lambda: run_cli("list", "--json", "--config", str(config)))
    assert listed.returncode == 0, listed.stderr
    rows = {row["id"]: row for row in json.loads(listed.stdout)}
    assert rows["Ascend910-1"]["holders"] == [
        {"namespace": "default", "pod": "exporter", "container": "npu-exporter", "claim": "monitor"},
        {"namespace": "default", "pod": "train-0", "container": "main", "claim": "train"},
    ]
    assert rows["Ascend910-3"]["holders"] == []
    table = await anyio.to_thread.run_sync(lambda: run_cli("list", "--config", str(config)))
    assert "default/train-0/main (claim train)" in table.stdout, table.stdout
    doctor = await anyio.to_thread.run_sync(
        lambda: run_cli(
            "doctor",
            "--json",
            "--config",
            str(config),
            f"--kubeconfig={apiserver.kubeconfig}",
            f"--node-name={NODE}",
            timeout=60,
        )
    )
    checks = {check["check"]: check for check in json.loads(doctor.stdout)}
    pods = checks["pods on Unhealthy chips"]
    assert pods["ok"] is False
    assert pods["detail"] == (
        "npu-1 held by default/exporter/npu-exporter (claim monitor), default/train-0/main (claim train)"
    )
