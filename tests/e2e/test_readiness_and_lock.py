"""/readyz follows the kubelet's own ListAndWatch stream, whatever other clients hold open; and one agent per
node: a second agent on the same kubelet directory waits for the first, then takes over."""

from __future__ import annotations

from tests.support.agent_process import fake_agent
from tests.support.http_probe import free_port, wait_answer
from tests.support.kubelet_standin import KubeletStandin

RESOURCE = "huawei.com/Ascend910"


def test_readyz_follows_the_kubelets_stream_not_another_clients(kubelet: KubeletStandin) -> None:
    port = free_port()
    agent = fake_agent(kubelet.directory, "--metrics-address", f"127.0.0.1:{port}")
    channel, stub = None, None
    try:
        kubelet.wait_registrations(1)
        kubelet.wait_update(lambda u: len(u.devices) == 8, what="the first device list")
        assert wait_answer(port, "/readyz", lambda status, _: status == 200, what="ready") == (200, "ready\n")
        channel, stub = kubelet.plugin_stub()
        other = stub.ListAndWatch(kubelet.pb.Empty())
        assert len(next(other).devices) == 8
        kubelet.end_stream()
        _, body = wait_answer(port, "/readyz", lambda status, _: status == 503, timeout=5, what="503")
        assert f"{RESOURCE}: the kubelet's ListAndWatch stream is not open" in body
        kubelet.wait_registrations(2)
        wait_answer(port, "/readyz", lambda status, _: status == 200, what="ready again")
        agent.wait_log(f"ListAndWatch stream for {RESOURCE} ended; registering again")
        assert other.is_active(), "the other client's stream stayed open throughout"
        other.cancel()
    finally:
        if channel is not None:
            channel.close()
        agent.close()


def test_a_second_agent_waits_for_the_first_then_takes_over(kubelet: KubeletStandin) -> None:
    first = fake_agent(kubelet.directory)
    try:
        kubelet.wait_registrations(1)
        kubelet.wait_update(lambda u: len(u.devices) == 8, what="the first device list")
        second = fake_agent(kubelet.directory)
        try:
            (waiting,) = second.wait_log(r"Another ascend-agent \(pid \S+\) holds")
            assert f"(pid {first.proc.pid})" in waiting, waiting
            kubelet.no_registration_beyond(1, within=1.5)
            assert second.proc.poll() is None, second.output
            assert len(second.matching("Another ascend-agent")) == 1
            assert not second.matching("Registered resource")
            assert {len(u.devices) for u in kubelet.updates} == {8}
            before = len(kubelet.updates)
            code, _ = first.terminate()
            assert code == 0, first.output
            second.wait_log(rf"pid {first.proc.pid} stopped; taking over")
            kubelet.wait_registrations(2)
            kubelet.wait_update(lambda u: len(u.devices) == 8, after=before, what="8 devices from the second")
            second.wait_log(f"Registered resource {RESOURCE}$")
            assert kubelet.plugin_socket().is_socket()
            assert {len(u.devices) for u in kubelet.updates} == {8}, "the device count never changed"
            kubelet.no_registration_beyond(2, within=1.0)
        finally:
            second.close()
    finally:
        first.close()


def test_a_second_agent_on_the_same_metrics_port_waits_too(kubelet: KubeletStandin) -> None:
    """The metrics endpoint does not decide who runs: the second agent waits for the lock, then serves it."""
    port = free_port()
    address = ("--metrics-address", f"127.0.0.1:{port}")
    first = fake_agent(kubelet.directory, *address)
    try:
        kubelet.wait_registrations(1)
        wait_answer(port, "/readyz", lambda status, _: status == 200, what="the first agent ready")
        second = fake_agent(kubelet.directory, *address)
        try:
            second.wait_log(r"Cannot serve /metrics on 127\.0\.0\.1:\d+ yet")
            second.wait_log(r"Another ascend-agent \(pid \S+\) holds")
            assert second.proc.poll() is None, second.output
            code, _ = first.terminate()
            assert code == 0, first.output
            second.wait_log(rf"pid {first.proc.pid} stopped; taking over")
            kubelet.wait_registrations(2)
            second.wait_log(f"Serving /metrics, /healthz and /readyz on 127.0.0.1:{port}")
            wait_answer(port, "/readyz", lambda status, _: status == 200, what="the second agent ready")
            code, _ = second.terminate()
            assert code == 0, second.output
        finally:
            second.close()
    finally:
        first.close()
