"""A config reload applies each setting the agent owns: the config file (``--config``, nothing on the command
line above it) is replaced by rename, as ConfigMaps and editors do, and the agent is told by its file watch or
by SIGHUP."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.support.agent_process import AgentProcess
from tests.support.http_probe import free_port, get, wait_answer
from tests.support.kubelet_standin import KubeletStandin

SPEC_FILE = "huawei.com-npu.yaml"


def _write_config(path: Path, settings: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(yaml.safe_dump(settings))
    os.replace(temporary, path)


class _Configured:
    """The agent as a process whose settings all come from one config file."""

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path = path
        self.settings = {"backend": "fake", "metricsAddress": "", **settings}
        _write_config(path, self.settings)
        self.process = AgentProcess(["run", "--config", str(path)])

    def change(self, **settings: Any) -> None:
        self.settings.update(settings)
        _write_config(self.path, self.settings)


@pytest.fixture
def configured() -> Iterator[list[_Configured]]:
    started: list[_Configured] = []
    yield started
    for agent in started:
        agent.process.close()


def _start(configured: list[_Configured], path: Path, **settings: Any) -> _Configured:
    agent = _Configured(path, settings)
    configured.append(agent)
    return agent


def test_metrics_address_moves_the_http_endpoint(
    kubelet: KubeletStandin, short_dir: Path, configured: list[_Configured]
) -> None:
    old, new = free_port(), free_port()
    assert old != new
    agent = _start(
        configured,
        short_dir / "config.yaml",
        kubeletDir=str(kubelet.directory),
        metricsAddress=f"127.0.0.1:{old}",
    )
    kubelet.wait_registrations(1)
    assert wait_answer(old, "/healthz", lambda status, _: status == 200) == (200, "ok\n")
    agent.change(metricsAddress=f"127.0.0.1:{new}")
    agent.process.proc.send_signal(signal.SIGHUP)
    agent.process.wait_log("Config applied: metrics_address changed")
    assert wait_answer(new, "/healthz", lambda status, _: status == 200) == (200, "ok\n")
    wait_answer(old, "/healthz", lambda status, _: status is None, what="connection refused")
    assert get(old, "/healthz") is None
    assert wait_answer(new, "/readyz", lambda status, _: status == 200) == (200, "ready\n")
    assert len(kubelet.registrations) == 1, "moving the HTTP endpoint does not re-register"


def test_cdi_spec_dir_writes_the_spec_in_the_new_directory(
    kubelet: KubeletStandin, short_dir: Path, configured: list[_Configured]
) -> None:
    old, new = short_dir / "cdi-old", short_dir / "cdi-new"
    agent = _start(
        configured, short_dir / "config.yaml", kubeletDir=str(kubelet.directory), cdiSpecDir=str(old)
    )
    agent.process.wait_log(f"Wrote CDI spec {old / SPEC_FILE} with 8 devices")
    assert (old / SPEC_FILE).is_file()
    agent.change(cdiSpecDir=str(new))
    agent.process.wait_log(f"Wrote CDI spec {new / SPEC_FILE} with 8 devices")
    agent.process.wait_log("Config applied: cdi_spec_dir changed")
    spec = yaml.safe_load((new / SPEC_FILE).read_text())
    assert len(spec["devices"]) == 8
    assert not (old / SPEC_FILE).exists(), "the spec in the old directory is removed"
    assert list(old.iterdir()) == [], "nothing of ours left in the old directory"


def test_kubelet_dir_moves_the_plugin(
    kubelet: KubeletStandin,
    kubelet_api: tuple[ModuleType, ModuleType],
    short_dir: Path,
    configured: list[_Configured],
) -> None:
    other = KubeletStandin(short_dir / "kubelet2", *kubelet_api)
    other.start()
    try:
        agent = _start(configured, short_dir / "config.yaml", kubeletDir=str(kubelet.directory))
        kubelet.wait_registrations(1)
        kubelet.wait_update(lambda u: len(u.devices) == 8)
        agent.change(kubeletDir=str(other.directory))
        (registration,) = other.wait_registrations(1)
        assert registration.endpoint == "Ascend910.sock"
        other.wait_update(lambda u: len(u.devices) == 8, what="8 devices in the new directory")
        agent.process.wait_log("Config applied: kubelet_dir changed")
        assert other.plugin_socket().is_socket()
        assert not kubelet.plugin_socket().exists(), "the socket in the old directory is gone"
        assert len(kubelet.registrations) == 1
        # The old kubelet restarting is no concern of the agent any more.
        kubelet.restart()
        with pytest.raises(AssertionError):
            kubelet.wait_registrations(2, timeout=1.0)
    finally:
        other.stop()


def test_replicas_changes_the_device_list(
    kubelet: KubeletStandin, short_dir: Path, configured: list[_Configured]
) -> None:
    agent = _start(configured, short_dir / "config.yaml", kubeletDir=str(kubelet.directory))
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda u: len(u.devices) == 8)
    agent.change(replicas=2)
    update = kubelet.wait_update(lambda u: len(u.devices) == 16, what="16 devices")
    assert sorted(update.health()) == sorted(f"Ascend910-{chip}-{n}" for chip in range(8) for n in range(2))
    agent.process.wait_log("Config applied: replicas changed")
    assert len(kubelet.registrations) == 1, "a device list change does not re-register"


def test_a_burst_of_sighups_makes_at_most_two_reloads(
    kubelet: KubeletStandin, short_dir: Path, configured: list[_Configured]
) -> None:
    agent = _start(configured, short_dir / "config.yaml", kubeletDir=str(kubelet.directory))
    kubelet.wait_registrations(1)
    for _ in range(50):  # 100 a second, as a loop in a shell sends them; pending signals would merge
        agent.process.proc.send_signal(signal.SIGHUP)
        time.sleep(0.01)
    agent.change(replicas=2)
    agent.process.wait_log("Config applied: replicas changed")
    repeated = agent.process.matching("Config re-read: nothing changed")
    assert len(repeated) <= 2, f"{len(repeated)} reloads for one burst of SIGHUPs"


def test_an_edit_right_after_one_that_restarts_the_backend_is_applied(
    kubelet: KubeletStandin, short_dir: Path, configured: list[_Configured]
) -> None:
    agent = _start(configured, short_dir / "config.yaml", kubeletDir=str(kubelet.directory))
    kubelet.wait_registrations(1)
    kubelet.wait_update(lambda u: len(u.devices) == 8)
    agent.change(fakeChips=4)  # a new backend
    agent.change(replicas=2)  # written while the first is applied
    expected = sorted(f"Ascend910-{chip}-{n}" for chip in range(4) for n in range(2))
    kubelet.wait_update(lambda u: sorted(u.health()) == expected, what="4 chips, 2 replicas each")


def test_a_key_given_twice_is_not_applied_and_the_agent_keeps_running(
    kubelet: KubeletStandin, short_dir: Path, configured: list[_Configured]
) -> None:
    agent = _start(configured, short_dir / "config.yaml", kubeletDir=str(kubelet.directory))
    kubelet.wait_registrations(1)
    text = yaml.safe_dump(agent.settings) + "replicas: 2\nreplicas: 3\n"
    temporary = agent.path.with_name(".config.yaml.tmp")
    temporary.write_text(text)
    os.replace(temporary, agent.path)
    lines = len(text.splitlines())
    agent.process.wait_log(
        "Config not applied, keeping the running settings: config file .*: replicas is given twice "
        rf"\(lines {lines - 1} and {lines}\); keep one"
    )
    agent.change(replicas=2)
    kubelet.wait_update(lambda u: len(u.devices) == 16, what="16 devices")
    assert agent.process.proc.poll() is None


def test_a_start_only_setting_says_it_waits_for_the_next_start(
    kubelet: KubeletStandin, short_dir: Path, configured: list[_Configured]
) -> None:
    agent = _start(configured, short_dir / "config.yaml", kubeletDir=str(kubelet.directory))
    kubelet.wait_for(lambda: kubelet.latest() is not None, what="the chips advertised")
    agent.change(volcanoSchedulerName="batch-scheduler")
    agent.process.wait_log("volcano_scheduler_name changed: the cluster side takes it at the next start")
