"""The agent registered through the real kubelet's plugin watcher (the chart's plugin-watcher values): the
kubelet finds the registration socket in plugins_registry/, dials the plugin, and a one-chip pod runs."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.cluster.agent import RENDERS, apply_chart, running_agent
from tests.cluster.harness import KUBELET_DIR, Cluster
from tests.cluster.node import wait_allocatable
from tests.cluster.pods import RESOURCE, chip_devices, one_pod_spec, runtime_spec, wait_running
from tests.support.agent_process import AgentProcess

pytestmark = pytest.mark.e2e_cluster

RENDER = RENDERS / "plugin-watcher.yaml"


@pytest.fixture(scope="module")
def watched_agent(cluster: Cluster) -> Iterator[AgentProcess]:
    apply_chart(cluster, RENDER)
    with running_agent(
        cluster, "agent-plugin-watcher", RENDER, backend="fake", fakeChips=8, fakeModel="910B4"
    ) as process:
        yield process


def test_registered_by_the_plugin_watcher_a_pod_runs(cluster: Cluster, watched_agent: AgentProcess) -> None:
    watched_agent.wait_log(f"Registered resource {RESOURCE}", timeout=60)
    # The kubelet found the agent's registration socket in its plugins registry.
    assert list((KUBELET_DIR / "plugins_registry").glob("*.sock"))
    wait_allocatable(cluster, "8")
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(one_pod_spec("watched", "watched", 1)))
    try:
        wait_running(cluster, "watched")
        spec = runtime_spec(cluster, "watched", "watched")
        assert len(chip_devices(spec)) == 1, spec["linux"].get("devices")
    finally:
        cluster.kubectl("delete", "pod", "watched", "--wait=true", "--timeout=60s", check=False, timeout=90)
