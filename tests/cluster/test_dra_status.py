"""The DRA driver's claims under the real API server, scheduler and kubelet (the chart's DRA values and RBAC,
the agent's token bound to the node as a pod's is): an exclusive claim's pod and an ``adminAccess`` claim of
every device (in a namespace labelled for admin access) run side by side; both claims get ``status.devices``
written through the status subresource; the kubelet's PodResources (``dynamic_resources``) name the pods and
claims holding a chip in ``/metrics`` and ``ascend-agent list``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.agent import DRA_DRIVER as DRIVER
from tests.cluster.agent import agent_metrics, fake_dra_agent
from tests.cluster.harness import Cluster
from tests.cluster.pods import claim_pod, one_pod_spec, wait_running
from tests.cluster.polling import until
from tests.support.agent_process import AgentProcess

pytestmark = [pytest.mark.e2e_cluster, pytest.mark.kubernetes("1.34", "resource.k8s.io/v1, GA from 1.34")]

ADMIN_NAMESPACE = "npu-ops"


@pytest.fixture(scope="module")
def dra_agent(cluster: Cluster) -> Iterator[AgentProcess]:
    state = cluster.work / "fake-state-dra-status.json"
    with fake_dra_agent(cluster, "agent-dra-status", state, healthInterval=2) as process:
        yield process


def _claim_of(cluster: Cluster, pod: str, namespace: str = "default") -> dict[str, Any]:
    got = json.loads(cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json").stdout)
    (status,) = got["status"]["resourceClaimStatuses"]
    claim: dict[str, Any] = json.loads(
        cluster.kubectl(
            "get", "resourceclaim", status["resourceClaimName"], "-n", namespace, "-o", "json"
        ).stdout
    )
    return claim


def _admin_pod(cluster: Cluster) -> None:
    """A pod in a namespace labelled for admin access, with a claim of every 910B4 device, for monitoring."""
    cluster.kubectl("create", "namespace", ADMIN_NAMESPACE, check=False)
    cluster.kubectl(
        "label", "namespace", ADMIN_NAMESPACE, "resource.kubernetes.io/admin-access=true", "--overwrite"
    )
    request = {"deviceClassName": "ascend910b4", "allocationMode": "All", "adminAccess": True}
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "monitor", "namespace": ADMIN_NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "all", "exactly": request}]}}},
    }
    pod = one_pod_spec("monitor", "exporter", 1)
    pod["metadata"]["namespace"] = ADMIN_NAMESPACE
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "all"}]}
    pod["spec"]["resourceClaims"] = [{"name": "all", "resourceClaimTemplateName": "monitor"}]
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(template))
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))


def test_an_admin_claim_runs_beside_an_exclusive_one_both_get_status_and_holders_are_named(
    cluster: Cluster, dra_agent: AgentProcess
) -> None:
    started = time.monotonic()
    claim_pod(cluster, "status-train", count=1)
    try:
        wait_running(cluster, "status-train")
        _admin_pod(cluster)
        cluster.kubectl(
            "wait", "pod/monitor", "-n", ADMIN_NAMESPACE, "--for=jsonpath={.status.phase}=Running",
            "--timeout=90s", timeout=120,
        )  # fmt: skip
        ran = time.monotonic() - started

        # The exclusive claim: one device; its status written by the agent within a few seconds.
        train = until(
            lambda: _claim_of(cluster, "status-train"),
            lambda c: len(c["status"].get("devices") or []) == 1,
            "status.devices of the exclusive claim",
        )
        ((result,),) = [train["status"]["allocation"]["devices"]["results"]]
        (entry,) = train["status"]["devices"]
        assert (entry["driver"], entry["device"]) == (DRIVER, result["device"])
        conditions = {c["type"]: (c["status"], c["reason"]) for c in entry["conditions"]}
        assert conditions == {"Ready": ("True", "Prepared"), "Healthy": ("True", "Healthy")}, entry
        physic = int(result["device"].removeprefix("npu-"))
        assert entry["data"] == {"model": "910B4", "physicId": physic}

        # The admin claim: every device, the exclusive one's too, marked adminAccess by the scheduler.
        monitor = until(
            lambda: _claim_of(cluster, "monitor", ADMIN_NAMESPACE),
            lambda c: len(c["status"].get("devices") or []) == 8,
            "status.devices of the admin claim",
        )
        results = monitor["status"]["allocation"]["devices"]["results"]
        assert len(results) == 8 and all(r.get("adminAccess") is True for r in results), results
        assert result["device"] in {r["device"] for r in results}
        assert all(e["data"].get("adminAccess") is True for e in monitor["status"]["devices"])
        print(
            f"\nexclusive and admin pods Running {ran:.1f} s after the first was created; "
            f"both claims' status.devices written {time.monotonic() - started:.1f} s after"
        )

        # The holders of the exclusive claim's chip: both pods, each with its claim.
        device = f"Ascend910-{physic}"
        train_name, monitor_name = train["metadata"]["name"], monitor["metadata"]["name"]
        series = re.compile(rf'ascend_agent_chip_held\{{[^}}]*device="{device}"[^}}]*\}}')

        def held() -> str:
            found = series.search(agent_metrics(cluster))
            return found.group(0) if found else ""

        labels = until(held, lambda s: "status-train" in s and "monitor" in s, f"{device}'s holders")
        assert f'claim="{train_name},{monitor_name}"' in labels, labels
        assert f'namespace="default,{ADMIN_NAMESPACE}"' in labels, labels
        listed = subprocess.run(
            [
                sys.executable,
                "-m",
                "ascend_agent",
                "list",
                "--json",
                "--config",
                str(cluster.work / "agent.yaml"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert listed.returncode == 0, listed.stderr
        rows = {row["id"]: row for row in json.loads(listed.stdout)}
        assert rows[device]["holders"] == [
            {"namespace": "default", "pod": "status-train", "container": "status-train", "claim": train_name},
            {"namespace": ADMIN_NAMESPACE, "pod": "monitor", "container": "exporter", "claim": monitor_name},
        ]
    finally:
        cluster.kubectl(
            "delete", "pod", "status-train", "--wait=true", "--timeout=60s", check=False, timeout=90
        )
        cluster.kubectl(
            "delete", "pod", "monitor", "-n", ADMIN_NAMESPACE, "--wait=true", "--timeout=60s",
            check=False, timeout=90,
        )  # fmt: skip
    # Unprepared: the admin claim's spec goes, nothing else of the node changed (8 devices published).
    dra_agent.wait_log(f"Unprepared claim {ADMIN_NAMESPACE}/monitor-all", timeout=60)
