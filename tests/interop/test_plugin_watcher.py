"""The agent registering through the kubelet's plugin watcher, against the grpc-go stand-in:
``ascend-agent run --registration plugin-watcher`` serves ``R/huawei.com_Ascend910.sock``
(pluginregistration) and the endpoint ``P/Ascend910.sock`` (DevicePlugin); the stand-in finds the first in R,
asks GetInfo, dials the second, and tells the agent with NotifyRegistrationStatus. A kubelet restart wipes
only its device-plugins directory."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from inotify_simple import INotify, flags

from tests.support.agent_process import AgentProcess, fake_agent
from tests.support.gokubelet import RESOURCE, GoKubelet

pytestmark = pytest.mark.interop

REGISTRY_SOCKET = "huawei.com_Ascend910.sock"


def _watcher_agent(kubelet_dir: Path, registry_dir: Path, plugin_dir: Path) -> AgentProcess:
    return fake_agent(
        kubelet_dir,
        "--registration",
        "plugin-watcher",
        "--plugins-registry-dir",
        str(registry_dir),
        "--plugin-dir",
        str(plugin_dir),
    )


def _started(agent: AgentProcess) -> AgentProcess:
    """Fails at once, with the agent's own words, if it refused to start."""
    agent.wait_log(r"Found device /dev/davinci7$")
    return agent


def _wait_for_socket(path: Path, agent: AgentProcess, timeout: float = 10.0) -> None:
    """Until ``path`` is a socket: inotify on its directory, armed before the first look."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    with INotify() as inotify:
        inotify.add_watch(path.parent, flags.CREATE | flags.MOVED_TO)
        while not path.is_socket():
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{path} did not appear within {timeout} s; agent log:\n{agent.output}"
            assert agent.proc.poll() is None, f"the agent exited; its log:\n{agent.output}"
            inotify.read(timeout=int(min(remaining, 1.0) * 1000))


@pytest.fixture
def plugin_dir(short_dir: Path) -> Path:
    return short_dir / "plugins"


@pytest.fixture
def agent(watching_kubelet: GoKubelet, plugin_dir: Path) -> Iterator[AgentProcess]:
    assert watching_kubelet.registry_dir is not None
    process = _watcher_agent(watching_kubelet.directory, watching_kubelet.registry_dir, plugin_dir)
    try:
        _started(process)
        watching_kubelet.wait_registrations(1)
        watching_kubelet.wait_update(lambda u: len(u.devices) == 8, what="the first device list")
        watching_kubelet.wait_event("register")  # reported once NotifyRegistrationStatus is answered
        yield process
    finally:
        process.close()


def test_registers_through_the_registry_socket(
    watching_kubelet: GoKubelet, agent: AgentProcess, plugin_dir: Path
) -> None:
    assert watching_kubelet.registry_dir is not None
    registry_socket = str(watching_kubelet.registry_dir / REGISTRY_SOCKET)
    endpoint = str(plugin_dir / "Ascend910.sock")
    (attempt,) = watching_kubelet.of_kind("register")
    assert attempt["via"] == "plugin-watcher"
    assert (attempt["registry"], attempt["type"], attempt["resource"]) == (
        registry_socket,
        "DevicePlugin",
        RESOURCE,
    )
    assert attempt["endpoint"] == endpoint
    assert "v1beta1" in attempt["versions"]
    assert (attempt["ok"], attempt["error"], attempt["notify_error"]) == (True, "", "")
    (registration,) = watching_kubelet.registrations
    assert (registration.socket, registration.registry) == (endpoint, registry_socket)
    assert registration.options["pre_start_required"] is False
    update = watching_kubelet.latest()
    assert update is not None
    assert update.devices == [(f"Ascend910-{i}", "Healthy", [0 if i < 4 else 1]) for i in range(8)]
    agent.wait_log(r"Registered resource huawei\.com/Ascend910$")
    answer = watching_kubelet.allocate(RESOURCE, ["Ascend910-2", "Ascend910-6"])
    assert answer.ok, answer.message
    assert answer.response["container_responses"][0]["envs"]["ASCEND_VISIBLE_DEVICES"] == "2,6"


def test_a_kubelet_started_later_finds_the_socket_on_its_scan(
    standin_binary: Path, short_dir: Path, plugin_dir: Path
) -> None:
    kubelet_dir, registry_dir = short_dir / "kubelet", short_dir / "registry"
    for kubelets_own in (kubelet_dir, registry_dir):  # made by an earlier kubelet run; the agent never does
        kubelets_own.mkdir()
    agent = _started(_watcher_agent(kubelet_dir, registry_dir, plugin_dir))
    try:
        _wait_for_socket(registry_dir / REGISTRY_SOCKET, agent)
        with GoKubelet(kubelet_dir, registry_dir, binary=standin_binary) as kubelet:
            (registration,) = kubelet.wait_registrations(1)
            assert registration.socket == str(plugin_dir / "Ascend910.sock")
            kubelet.wait_update(lambda u: len(u.devices) == 8, what="the first device list")
            agent.wait_log(r"Registered resource huawei\.com/Ascend910$")
    finally:
        agent.close()


def test_after_a_restart_the_rescan_registers_it_again(
    watching_kubelet: GoKubelet, agent: AgentProcess, plugin_dir: Path
) -> None:
    assert watching_kubelet.registry_dir is not None
    registry_socket = watching_kubelet.registry_dir / REGISTRY_SOCKET
    endpoint = plugin_dir / "Ascend910.sock"
    identity = (registry_socket.stat().st_ino, endpoint.stat().st_ino)
    for restart in range(10):
        attempts, dials, updates = (
            watching_kubelet.count("register"),
            watching_kubelet.count("dial"),
            len(watching_kubelet.updates),
        )
        watching_kubelet.restart()
        watching_kubelet.wait_update(
            lambda u: len(u.devices) == 8, after=updates, what=f"the device list after restart {restart}"
        )
        # The attempt is reported after NotifyRegistrationStatus, which may come after the list.
        watching_kubelet.wait_event("register", after=attempts)
        new_attempts = watching_kubelet.of_kind("register", attempts)
        assert [(a["ok"], a["registry"]) for a in new_attempts] == [(True, str(registry_socket))], [
            a.fields for a in new_attempts
        ]
        assert [d["error"] for d in watching_kubelet.of_kind("dial", dials) if not d["ok"]] == []
    # Neither socket was made again: the wipe touched only the device-plugins directory.
    assert (registry_socket.stat().st_ino, endpoint.stat().st_ino) == identity
    agent.wait_log(r"Registered resource huawei\.com/Ascend910$", count=11)


def test_removing_the_registry_socket_deregisters(watching_kubelet: GoKubelet, agent: AgentProcess) -> None:
    assert watching_kubelet.registry_dir is not None
    ended = watching_kubelet.count("stream-ended")
    (watching_kubelet.registry_dir / REGISTRY_SOCKET).unlink()
    deregistered = watching_kubelet.wait_event("deregistered")
    assert deregistered["resource"] == RESOURCE
    watching_kubelet.wait_event("stream-ended", after=ended)


def test_an_agent_killed_and_started_again_registers_again(
    watching_kubelet: GoKubelet, agent: AgentProcess, plugin_dir: Path
) -> None:
    """SIGKILL leaves the registry socket behind; the next agent renames its own over it (no delete event
    first), and the plugin watcher registers the new one."""
    assert watching_kubelet.registry_dir is not None
    registry_socket = watching_kubelet.registry_dir / REGISTRY_SOCKET
    attempts, updates = watching_kubelet.count("register"), len(watching_kubelet.updates)
    agent.terminate(signal.SIGKILL)
    assert registry_socket.is_socket(), "the killed agent's registry socket is gone: the test sees nothing"
    again = _started(_watcher_agent(watching_kubelet.directory, watching_kubelet.registry_dir, plugin_dir))
    try:
        watching_kubelet.wait_update(lambda u: len(u.devices) == 8, after=updates, what="the new list")
        watching_kubelet.wait_event("register", after=attempts)
        new_attempts = watching_kubelet.of_kind("register", attempts)
        assert [(a["ok"], a["registry"]) for a in new_attempts] == [(True, str(registry_socket))], [
            a.fields for a in new_attempts
        ]
        again.wait_log(r"Registered resource huawei\.com/Ascend910$")
    finally:
        again.close()
