"""``--volcano`` from the agent as a process: the health the kubelet sees under its device IDs follows the
chips really mounted. A pod Volcano placed on chip 3, charged by the kubelet with ``Ascend910-0``: a fault on
chip 3 turns ``Ascend910-0`` Unhealthy (and ``Ascend910-3``, free to the kubelet, shows chip 0), one entry per
chip; the mapping goes with the pod; without ``--volcano`` every ID shows its own chip."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_volcano_allocate import NODE, T, _allocate, _pod, _start
from tests.support.agent_process import AgentProcess
from tests.support.apiserver import ApiServer
from tests.support.http_probe import free_port, wait_answer
from tests.support.kubelet_standin import KubeletStandin, Update
from tests.support.podresources import PodResourcesStandin

# What the kubelet must see within this many seconds of a fault.
FAULT_SEEN_WITHIN = 2.0


def _unhealthy(update: Update) -> list[str]:
    return sorted(device for device, health in update.health().items() if health != "Healthy")


def _fault(kubelet: KubeletStandin, state: Path, chips: list[int], expected: list[str]) -> Update:
    """Write the faulty chips to the fake backend's state; the kubelet's next device lists until one whose
    Unhealthy IDs are ``expected``."""
    after = len(kubelet.updates)
    state.write_text(json.dumps({"unhealthy": chips}))
    return kubelet.wait_update(
        lambda u: u.resource == T and _unhealthy(u) == expected,
        after=after,
        timeout=FAULT_SEEN_WITHIN,
        what=f"{expected or 'no'} Unhealthy in ListAndWatch",
    )


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def placed(
    kubelet: KubeletStandin,
    apiserver: ApiServer,
    state: Path,
    podresources: PodResourcesStandin,
    metrics_port: int,
) -> Iterator[AgentProcess]:
    """The agent with --volcano, and pod train-0 on chip 3 under the kubelet's Ascend910-0."""
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    apiserver.put("pods", _pod("train-0", "Ascend910-3", "100", count=1))
    agent = _start(
        kubelet,
        apiserver,
        "--volcano",
        "--fake-state",
        str(state),
        "--pod-resources-socket",
        str(podresources.path),
        "--health-interval",
        "1",
        "--metrics-address",
        f"127.0.0.1:{metrics_port}",
    )
    try:
        podresources.hold(T, ["Ascend910-0"], "team-a", "train-0", "main")
        assert _allocate(kubelet, ["Ascend910-0"]).envs["ASCEND_VISIBLE_DEVICES"] == "3"
        yield agent
    finally:
        agent.close()


def test_a_fault_on_the_chip_mounted_shows_under_the_kubelets_id(
    kubelet: KubeletStandin, state: Path, placed: AgentProcess
) -> None:
    seen = _fault(kubelet, state, [3], ["Ascend910-0"])
    assert len(seen.devices) == 8, "one entry per chip"
    assert seen.health()["Ascend910-3"] == "Healthy", "free to the kubelet: shows chip 0, not mounted"

    _fault(kubelet, state, [], [])  # recovery

    # Chip 0 is not mounted: its fault shows under Ascend910-3, the ID the kubelet sees free.
    _fault(kubelet, state, [0], ["Ascend910-3"])


def test_the_mapping_goes_with_the_pod_once_the_kubelet_frees_its_ids(
    kubelet: KubeletStandin,
    apiserver: ApiServer,
    state: Path,
    podresources: PodResourcesStandin,
    metrics_port: int,
    placed: AgentProcess,
) -> None:
    """The pod deleted, its containers may still run on chip 3 while the kubelet lists it under
    ``Ascend910-0``: the ID shows chip 3 until the kubelet frees it."""
    _fault(kubelet, state, [3], ["Ascend910-0"])
    # The pod watch open first (the client's rate limit may hold it after the start): the test API server
    # keeps no history, so a watch opened after the delete would not say it, as a real one's would.
    apiserver.wait_for(
        lambda: [s for s in apiserver.seen() if (s.verb, s.resource) == ("watch", "pods")], bool
    )
    apiserver.delete("pods", "train-0", "team-a")
    wait_answer(  # the agent's pod watch saw the delete
        metrics_port,
        "/metrics",
        lambda status, body: re.search(r"^ascend_agent_volcano_chips_taken 0", body, re.M) is not None,
    )
    podresources.wait_calls(podresources.calls + 2)  # and the agent took in an answer since
    # A device list made now, for chip 5's fault, shows all the agent knows: chip 3 still under Ascend910-0.
    _fault(kubelet, state, [3, 5], ["Ascend910-0", "Ascend910-5"])
    after = len(kubelet.updates)
    podresources.release_all()
    kubelet.wait_update(
        lambda u: u.resource == T and _unhealthy(u) == ["Ascend910-3", "Ascend910-5"],
        after=after,
        what="chip 3 as itself",
    )


def test_the_mapping_goes_when_podresources_lists_the_pod_no_more(
    kubelet: KubeletStandin, state: Path, podresources: PodResourcesStandin, placed: AgentProcess
) -> None:
    _fault(kubelet, state, [3], ["Ascend910-0"])
    calls = podresources.calls
    podresources.wait_calls(calls + 1)  # listed at least once since Allocate
    after = len(kubelet.updates)
    podresources.release_all()
    kubelet.wait_update(
        lambda u: u.resource == T and _unhealthy(u) == ["Ascend910-3"], after=after, what="chip 3 as itself"
    )


def test_without_volcano_every_id_shows_its_own_chip(
    kubelet: KubeletStandin, apiserver: ApiServer, state: Path
) -> None:
    apiserver.put("nodes", {"metadata": {"name": NODE}})
    apiserver.put("pods", _pod("train-0", "Ascend910-3", "100", count=1))
    agent = _start(kubelet, apiserver, "--fake-state", str(state))
    try:
        assert _allocate(kubelet, ["Ascend910-0"]).envs["ASCEND_VISIBLE_DEVICES"] == "0"
        _fault(kubelet, state, [3], ["Ascend910-3"])
    finally:
        agent.close()
