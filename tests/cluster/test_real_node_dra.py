"""The real node as a DRA node: the chart's DRA values installed with Helm, the DaemonSet's pod the DRA driver
(devfs on the node's driver tree), a claim pod whose container containerd makes from the CDI spec the driver
wrote, and the node rebooted under it: containerd and the kubelet started again with every container gone and
/var/run/cdi (a tmpfs on a node) emptied; the claim pod's container starts again with its chip."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.cluster import helm
from tests.cluster.agent import ROOT
from tests.cluster.harness import FIGURES, Cluster
from tests.cluster.pods import chip_devices, claim_pod, runtime_spec, shown, wait_running
from tests.cluster.polling import until
from tests.cluster.released import (
    DriverTree,
    agent_pod,
    chart_values,
    keep_agent_logs,
    logged,
    released,
    remove_applied_chart,
)

pytestmark = [pytest.mark.e2e_cluster, pytest.mark.kubernetes("1.34", "resource.k8s.io/v1, GA from 1.34")]

DRIVER = "npu.huawei.com"


@pytest.fixture(scope="module")
def dra_node(cluster: Cluster) -> Iterator[DriverTree]:
    remove_applied_chart(cluster)
    cluster.kubectl("apply", "-f", str(ROOT / "examples" / "dra" / "deviceclasses.yaml"))
    tree = DriverTree.make(cluster)
    values = chart_values(cluster, tree)
    values.update(dra={"enabled": True}, deviceInfo={"enabled": False})
    try:
        released(helm.install(cluster, values))
        pod = agent_pod(cluster)
        logged(cluster, pod["metadata"]["name"], f"Registered DRA driver {DRIVER}")
        yield tree
    finally:
        keep_agent_logs(cluster, "agent-pod-dra")
        helm.uninstall(cluster)  # a failed install leaves a release to end too
        cluster.kubectl("delete", "-f", str(ROOT / "examples" / "dra" / "deviceclasses.yaml"), "--wait=true",
                        check=False, timeout=120)  # fmt: skip


def restart_count(cluster: Cluster, pod: str) -> int:
    status = json.loads(cluster.kubectl("get", "pod", pod, "-o", "json").stdout)["status"]
    return int(status.get("containerStatuses", [{}])[0].get("restartCount", 0))


def test_a_claim_pod_sees_its_chip_and_gets_it_again_after_the_node_rebooted(
    cluster: Cluster, dra_node: DriverTree
) -> None:
    claim_pod(cluster, "claimed")
    try:
        wait_running(cluster, "claimed")
        (chip,) = chip_devices(runtime_spec(cluster, "claimed", "claimed"))
        devices, envs = shown(cluster, "claimed")
        assert chip in devices and envs["ASCEND_VISIBLE_DEVICES"] == chip.removeprefix("/dev/davinci"), (
            devices,
            envs,
        )
        assert list(cluster.cdi_dir.glob("*")), "the driver wrote no CDI spec"
        before = restart_count(cluster, "claimed")

        rebooted = time.monotonic()
        cluster.reboot_node(volatile=[cluster.cdi_dir])
        again = until(
            lambda: json.loads(cluster.kubectl("get", "pod", "claimed", "-o", "json").stdout)["status"],
            lambda status: (
                status.get("phase") == "Running"
                and all(c.get("ready") for c in status.get("containerStatuses", []))
                and status["containerStatuses"][0].get("restartCount", 0) > before
            ),
            "the claim pod's container started again after the reboot",
            timeout=180,
        )
        FIGURES["node rebooted (containerd and kubelet started again) -> claim pod Running again"] = (
            f"{time.monotonic() - rebooted:.1f} s"
        )
        assert again["containerStatuses"][0]["restartCount"] > before
        assert chip_devices(runtime_spec(cluster, "claimed", "claimed")) == {chip}
    finally:
        cluster.kubectl("delete", "pod", "claimed", "--wait=true", "--timeout=90s", check=False, timeout=120)
