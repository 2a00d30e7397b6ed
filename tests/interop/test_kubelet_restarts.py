"""100 kubelet restarts in a row against the grpc-go stand-in: each must be answered by exactly one
registration whose dial-back connects at once. grpc-go waits about 1 s before it redials a socket that was not
there yet, so an agent that registers before serving again shows up here as a failed dial."""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import pytest

from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.gokubelet import GoKubelet

pytestmark = pytest.mark.interop

RESTARTS = 100


@pytest.fixture
def agent(go_kubelet: GoKubelet) -> Iterator[AgentProcess]:
    process = fake_agent(go_kubelet.directory)
    go_kubelet.wait_registrations(1)
    go_kubelet.wait_update(lambda u: len(u.devices) == 8, what="the first device list")
    go_kubelet.wait_event("register")  # reported once Register has its answer
    yield process
    process.close()


def test_a_hundred_restarts_each_registered_exactly_once(go_kubelet: GoKubelet, agent: AgentProcess) -> None:
    latencies: list[float] = []
    attempts_per_restart: list[int] = []
    failed_attempts: list[str] = []
    failed_dials: list[str] = []
    for restart in range(RESTARTS):
        attempts, dials, updates = (
            go_kubelet.count("register"),
            go_kubelet.count("dial"),
            len(go_kubelet.updates),
        )
        listening = go_kubelet.restart()
        update = go_kubelet.wait_update(
            lambda u: len(u.devices) == 8,
            after=updates,
            timeout=15,
            what=f"the device list after restart {restart}",
        )
        latencies.append(update.at - listening.at)
        # The attempt is reported once Register has its answer, which may come after the list.
        go_kubelet.wait_event("register", after=attempts)
        if restart == RESTARTS - 1:
            # A registration that arrives late would count for no restart: give one the time to show.
            with pytest.raises(AssertionError):
                go_kubelet.wait_event("register", after=attempts + 1, timeout=1.5)
        new_attempts = go_kubelet.of_kind("register", attempts)
        attempts_per_restart.append(len(new_attempts))
        failed_attempts += [f"restart {restart}: {a['error']}" for a in new_attempts if not a["ok"]]
        # A dial the kubelet itself cancelled (it closed that connection: grpc-go was redialling the socket of
        # the kubelet before the restart) made nothing wait.
        failed_dials += [
            f"restart {restart}: {d['error']}"
            for d in go_kubelet.of_kind("dial", dials)
            if not d["ok"] and not d["error"].endswith("operation was canceled")
        ]

    ordered = sorted(latencies)
    median, p99 = statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    slow = sum(latency > 0.100 for latency in latencies)
    print(
        f"\n{RESTARTS} kubelet restarts (grpc-go), kubelet.sock listening -> the full device list: "
        f"median {median * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {ordered[-1] * 1e3:.1f} ms, "
        f"{slow} over 100 ms; Register attempts {sum(attempts_per_restart)}, failed {len(failed_attempts)}, "
        f"failed dials {len(failed_dials)}"
    )
    assert failed_attempts == []
    assert failed_dials == [], "each failed dial cost the kubelet grpc-go's ~1 s wait before redialling"
    assert attempts_per_restart == [1] * RESTARTS
    assert agent.proc.poll() is None
