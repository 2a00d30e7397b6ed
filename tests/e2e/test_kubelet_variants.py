"""Kubelets as they come: old ones that never ask for the options, clients that do, kubelets that crash
again and again, and a second agent waiting for the node."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.agent_process import fake_agent
from tests.support.http_probe import free_port, wait_answer
from tests.support.kubelet_standin import KubeletStandin


@pytest.fixture
def old_kubelet(kubelet_api: tuple[ModuleType, ModuleType], short_dir: Path) -> Iterator[KubeletStandin]:
    standin = KubeletStandin(short_dir / "kubelet", *kubelet_api, asks_options=False)
    standin.start()
    yield standin
    standin.stop()


def test_a_kubelet_that_never_asks_for_the_options_is_registered_once(old_kubelet: KubeletStandin) -> None:
    port = free_port()
    agent = fake_agent(old_kubelet.directory, "--metrics-address", f"127.0.0.1:{port}")
    try:
        old_kubelet.wait_registrations(1)
        old_kubelet.wait_update(lambda u: len(u.devices) == 8)
        assert wait_answer(port, "/readyz", lambda status, body: status == 200)[0] == 200
        old_kubelet.no_registration_beyond(1, within=2.0)
        assert len(agent.matching("Registered resource")) == 1
    finally:
        agent.close()


def test_another_client_asking_for_the_options_is_not_the_kubelet(kubelet: KubeletStandin) -> None:
    port = free_port()
    agent = fake_agent(kubelet.directory, "--metrics-address", f"127.0.0.1:{port}")
    try:
        kubelet.wait_registrations(1)
        kubelet.wait_update(lambda u: len(u.devices) == 8)
        channel, stub = kubelet.plugin_stub()
        stub.GetDevicePluginOptions(kubelet.pb.Empty(), timeout=5)
        stream = stub.ListAndWatch(kubelet.pb.Empty())
        assert len(next(stream).devices) == 8
        stream.cancel()
        channel.close()
        kubelet.no_registration_beyond(1, within=2.0)
        assert wait_answer(port, "/readyz", lambda status, body: status == 200)[0] == 200
        assert agent.matching("stream for huawei.com/Ascend910") == []
    finally:
        agent.close()


def test_kubelet_restarts_do_not_stretch_the_grace_for_a_lost_stream(kubelet: KubeletStandin) -> None:
    agent = fake_agent(kubelet.directory)
    try:
        kubelet.wait_registrations(1)
        for restart in range(8):
            updates = len(kubelet.updates)
            kubelet.restart()
            kubelet.wait_registrations(2 + restart)
            # The new kubelet's own stream is open (an update before the restart would not say so).
            kubelet.wait_update(lambda u: len(u.devices) == 8, after=updates)
        # A stream lost while the kubelet stays: registered again after the first grace (0.5 s), not after
        # one doubled by every restart before it (up to 60 s).
        kubelet.end_stream()
        kubelet.wait_registrations(10, timeout=5)
        agent.wait_log("ListAndWatch stream for huawei.com/Ascend910 ended; registering again")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nagent log:\n{agent.output}") from None
    finally:
        agent.close()


def test_a_waiting_second_agent_is_a_ready_standby_and_stops_at_once(kubelet: KubeletStandin) -> None:
    first = fake_agent(kubelet.directory)
    try:
        kubelet.wait_registrations(1)  # the first holds the lock before the second starts
        port = free_port()
        second = fake_agent(kubelet.directory, "--metrics-address", f"127.0.0.1:{port}")
        try:
            second.wait_log(
                rf"Another ascend-agent \(pid {first.proc.pid}\) holds .*; waiting for it to stop"
            )
            _, body = wait_answer(port, "/readyz", lambda status, body: status == 200)
            holder = first.proc.pid
            assert (
                body == f"ready: standby: the ascend-agent with pid {holder} holds this node until it stops\n"
            )
            code, _ = second.terminate(signal.SIGTERM)
            assert code == 0
            kubelet.no_registration_beyond(1, within=0.5)
        finally:
            second.close()
    finally:
        first.close()
