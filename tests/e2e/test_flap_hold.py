"""The flap hold is the agent's, not a backend's: the fake backend's chips are held exactly as devfs's are,
and a config reload that makes a new backend keeps the chips held and what they did before."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.support.agent_process import AgentProcess
from tests.support.files import write_state
from tests.support.kubelet_standin import KubeletStandin
from tests.support.scripted_chips import ScriptedChips


class _Node(ScriptedChips):
    """Scripts chips 1 and 3 (the others are the steps' markers)."""

    def __init__(self, kubelet: KubeletStandin, state: Path) -> None:
        super().__init__(kubelet, state, markers=(0, 2, 4, 5, 6, 7))

    def flap_chip_3(self) -> None:
        """Chip 3 turns Unhealthy twice: with --flap-threshold 2 it is held."""
        assert self.script([3]).health()["Ascend910-3"] == "Unhealthy"
        assert self.script([]).health()["Ascend910-3"] == "Healthy", "recovered once: back at once"
        self.script([3])


def _agent(kubelet: KubeletStandin, config: Path) -> AgentProcess:
    return AgentProcess(["run", "--config", str(config)])


def _config(path: Path, kubelet: KubeletStandin, state: Path, **extra: str) -> Path:
    settings = {"backend": "fake", "kubeletDir": str(kubelet.directory), "metricsAddress": "",
                "fakeState": str(state), "flapThreshold": 2, "flapWindow": 600, "flapQuiet": 600,
                **extra}  # fmt: skip
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(settings))
    os.replace(temporary, path)
    return path


def test_the_fake_backend_holds_a_flapping_chip(kubelet: KubeletStandin, short_dir: Path) -> None:
    state = short_dir / "state.json"
    write_state(state, {"unhealthy": []})
    agent = _agent(kubelet, _config(short_dir / "c.yaml", kubelet, state))
    try:
        node = _Node(kubelet, state)
        kubelet.wait_registrations(1)
        node.flap_chip_3()
        agent.wait_log("Ascend910-3 is held Unhealthy: it turned Unhealthy 2 times within 600 s")
        calm = node.script([])
        assert calm.health()["Ascend910-3"] == "Unhealthy", "held although the state file says Healthy"
    finally:
        agent.close()


def test_a_reload_keeps_held_chips_and_their_history(kubelet: KubeletStandin, short_dir: Path) -> None:
    state = short_dir / "state.json"
    write_state(state, {"unhealthy": []})
    config = _config(short_dir / "c.yaml", kubelet, state)
    agent = _agent(kubelet, config)
    try:
        node = _Node(kubelet, state)
        kubelet.wait_registrations(1)
        node.flap_chip_3()
        node.script([1])  # chip 1 turns Unhealthy once: history, not yet held
        agent.wait_log("Ascend910-3 is held Unhealthy")
        _config(config, kubelet, state, mode="ascend-runtime")  # a backend setting: a new backend
        agent.proc.send_signal(signal.SIGHUP)
        agent.wait_log("Config applied: mode changed")
        calm = node.script([])
        assert calm.health()["Ascend910-3"] == "Unhealthy", "the hold survived the new backend"
        assert calm.health()["Ascend910-1"] == "Healthy"
        node.script([1])  # chip 1's second turn, counted with the one before the reload
        agent.wait_log("Ascend910-1 is held Unhealthy")
        assert len(agent.matching("Ascend910-3 is held Unhealthy")) == 1
    finally:
        agent.close()
