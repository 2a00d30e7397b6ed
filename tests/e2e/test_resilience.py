"""Staying true while things change: kubelet restarts, lost sockets and streams, live faults, signals."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.files import write_state
from tests.support.kubelet_standin import KubeletStandin


@pytest.fixture
def agent(kubelet: KubeletStandin, state: Path) -> Iterator[AgentProcess]:
    process = fake_agent(kubelet.directory, "--fake-state", str(state))
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda u: len(u.devices) == 8, what="the first device list")
    yield process
    process.close()


def test_exactly_one_registration_per_kubelet_restart(kubelet: KubeletStandin, agent: AgentProcess) -> None:
    fds_after_first = None
    for restart in range(1, 31):
        updates = len(kubelet.updates)
        kubelet.restart()
        kubelet.wait_registrations(1 + restart)
        kubelet.wait_update(lambda u: len(u.devices) == 8, after=updates)  # the new kubelet's own stream
        if restart == 1:
            fds_after_first = agent.open_fds()
    kubelet.no_registration_beyond(31, within=1.5)
    assert fds_after_first is not None
    # Connections of the old kubelet close asynchronously: the count may only be lower than after the first.
    assert agent.open_fds() <= fds_after_first
    assert agent.proc.poll() is None


def test_a_mixed_event_storm_still_gives_one_registration(
    kubelet: KubeletStandin, agent: AgentProcess
) -> None:
    for storm in range(1, 6):
        # The stream ends, the kubelet goes, our socket is deleted (twice over: the kubelet wipes it too on
        # start), kubelet.sock returns: all in one burst.
        kubelet.stop()
        kubelet.plugin_socket().unlink()
        kubelet.start()
        kubelet.wait_registrations(1 + storm)
    kubelet.no_registration_beyond(6, within=1.5)


def test_socket_deleted_right_after_a_registration_registers_again(
    kubelet: KubeletStandin, agent: AgentProcess
) -> None:
    # The stand-in records a registration inside Register, before the agent has its answer: deleting the
    # socket at once restarts the server while that registration is still under way. The kubelet dialled the
    # old server, so the new one must register too.
    for _ in range(20):
        count = len(kubelet.registrations)
        kubelet.restart()
        kubelet.wait_registrations(count + 1)
        kubelet.plugin_socket().unlink()
        kubelet.wait_registrations(count + 2, timeout=5)
    kubelet.wait_update(lambda u: len(u.devices) == 8, after=len(kubelet.updates) - 1)


def test_socket_deleted_while_the_kubelet_stays(kubelet: KubeletStandin, agent: AgentProcess) -> None:
    kubelet.plugin_socket().unlink()
    kubelet.wait_registrations(2)
    assert kubelet.plugin_socket().is_socket()
    agent.wait_log("is gone; serving huawei.com/Ascend910 again")
    kubelet.no_registration_beyond(2, within=1.5)


def test_stream_ended_registers_once_not_in_a_loop(kubelet: KubeletStandin, agent: AgentProcess) -> None:
    kubelet.end_stream()
    kubelet.wait_registrations(2)
    agent.wait_log("ListAndWatch stream for huawei.com/Ascend910 ended; registering again")
    kubelet.no_registration_beyond(2, within=2.0)
    assert len(agent.matching("registering again")) == 1


@pytest.mark.parametrize(
    ("faults", "chip"),
    [({"unhealthy": [2]}, "Ascend910-2"), ({"absent": [5]}, "Ascend910-5")],
    ids=["fault", "absent"],
)
def test_live_fault_and_recovery_reach_the_stream(
    kubelet: KubeletStandin, agent: AgentProcess, state: Path, faults: dict[str, list[int]], chip: str
) -> None:
    before = len(kubelet.updates)
    write_state(state, faults)
    fault = kubelet.wait_update(
        lambda u: u.health()[chip] == "Unhealthy", after=before, what=f"{chip} Unhealthy"
    )
    assert len(fault.devices) == 8, "a faulty or absent chip stays listed"
    assert sum(h == "Healthy" for h in fault.health().values()) == 7
    write_state(state, {})
    recovered = kubelet.wait_update(lambda u: set(u.health().values()) == {"Healthy"}, after=before + 1)
    assert len(recovered.devices) == 8


def test_an_answer_given_before_a_fault_is_not_given_after_it(
    kubelet: KubeletStandin, agent: AgentProcess, state: Path
) -> None:
    channel, stub = kubelet.plugin_stub()
    request = kubelet.pb.AllocateRequest(
        container_requests=[kubelet.pb.ContainerAllocateRequest(devices_ids=["Ascend910-2"])]
    )
    assert stub.Allocate(request, timeout=5).container_responses
    before = len(kubelet.updates)
    write_state(state, {"unhealthy": [2]})
    kubelet.wait_update(lambda u: u.health()["Ascend910-2"] == "Unhealthy", after=before)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Allocate(request, timeout=5)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    write_state(state, {})
    kubelet.wait_update(lambda u: set(u.health().values()) == {"Healthy"}, after=before + 1)
    assert stub.Allocate(request, timeout=5).container_responses
    channel.close()


def test_an_invalid_state_file_keeps_the_last_state(
    kubelet: KubeletStandin, agent: AgentProcess, state: Path
) -> None:
    write_state(state, {"unhealthy": [1]})
    kubelet.wait_update(lambda u: u.health()["Ascend910-1"] == "Unhealthy")
    state.write_text("{broken")
    agent.wait_log("not valid JSON.*keeping the previous state")
    write_state(state, {"unhealthy": [1, 2]})
    update = kubelet.wait_update(lambda u: u.health()["Ascend910-2"] == "Unhealthy")
    assert update.health()["Ascend910-1"] == "Unhealthy"


def test_sighup_and_config_changes_apply(kubelet: KubeletStandin, short_dir: Path) -> None:
    config = short_dir / "config.yaml"
    config.write_text("fakeChips: 8\n")
    process = fake_agent(kubelet.directory, "--config", str(config))
    try:
        kubelet.wait_registrations(1)
        kubelet.wait_update(lambda u: len(u.devices) == 8)
        config.write_text("fakeChips: 4\n")
        kubelet.wait_update(lambda u: len(u.devices) == 4, what="4 devices after the file changed")
        process.wait_log("Config applied: fake_chips changed")
        # A broken file is refused with one line and the running settings stay.
        config.write_text("fakeChips: [\n")
        process.wait_log("Config not applied, keeping the running settings")
        # SIGHUP re-reads it.
        tmp = config.with_name("c.tmp")
        tmp.write_text("fakeChips: 6\n")
        os.replace(tmp, config)
        kubelet.wait_update(lambda u: len(u.devices) == 6, what="6 devices")
        process.proc.send_signal(signal.SIGHUP)
        process.wait_log("Config re-read: nothing changed")
        assert len(kubelet.registrations) == 1, "a device-count change does not restart the server"
    finally:
        process.close()


def test_sigint_also_stops_cleanly(kubelet: KubeletStandin, agent: AgentProcess) -> None:
    code, _ = agent.terminate(signal.SIGINT)
    assert code == 0
    assert not kubelet.plugin_socket().exists()


def test_registers_as_soon_as_kubelet_sock_appears(
    kubelet_api: tuple[object, object], short_dir: Path
) -> None:
    directory = short_dir / "slow"
    directory.mkdir()  # the kubelet's directories are there, from an earlier kubelet run; it is not listening
    (short_dir / "plugins").mkdir()
    process = fake_agent(directory, "--log-level", "debug")
    try:
        # Once the back-off has grown to 3.2 s, the kubelet appears: inotify, not the timer, must wake us.
        process.wait_log(r"Next registration attempt for huawei.com/Ascend910 in 3\.2 s", timeout=15)
        standin = KubeletStandin(directory, *kubelet_api)  # type: ignore[arg-type]
        standin.start(wipe=False)
        try:
            try:
                standin.wait_registrations(1, timeout=2.0)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nagent log:\n{process.output}") from None
        finally:
            standin.stop()
    finally:
        process.close()


@pytest.mark.soak
def test_soak_500_kubelet_restarts_hold_fds_and_memory(kubelet: KubeletStandin, agent: AgentProcess) -> None:
    kubelet.restart()
    kubelet.wait_registrations(2)
    fds, rss = agent.open_fds(), agent.rss_kib()
    for restart in range(2, 502):
        kubelet.restart()
        kubelet.wait_registrations(1 + restart)
    kubelet.wait_update(lambda u: len(u.devices) == 8, after=len(kubelet.updates) - 1)
    assert len(kubelet.registrations) == 502, "one registration per restart"
    # The last restart's old connection may still be closing: allow it, and nothing that grows per restart.
    assert agent.open_fds() <= fds + 2
    grown = agent.rss_kib() - rss
    print(f"soak: 500 restarts, fds {fds} -> {agent.open_fds()}, RSS {rss} KiB -> {rss + grown} KiB")
    assert grown < 4 * 1024, f"RSS grew by {grown} KiB over 500 kubelet restarts"
