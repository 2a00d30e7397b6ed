"""The flap hold is the running agent's: `list` and `doctor` ask it at its /chips (metricsAddress) and say
held, why and until when, or that no agent answers; a held chip flipping underneath logs nothing more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.agent_process import AgentProcess
from tests.support.cli import run_cli
from tests.support.files import write_state
from tests.support.http_probe import free_port
from tests.support.kubelet_standin import KubeletStandin
from tests.support.scripted_chips import ScriptedChips


def _list(state: Path, address: str, *extra: str) -> Any:
    return run_cli(
        "list", "--backend", "fake", "--fake-state", str(state), "--metrics-address", address, *extra
    )


def _doctor_check(kubelet: KubeletStandin, short_dir: Path, address: str, name: str) -> dict[str, Any]:
    config = short_dir / "doctor.yaml"
    config.write_text(json.dumps({"backend": "fake"}))
    result = run_cli(
        "doctor", "--config", str(config), "--host-root", str(short_dir / "nohost"),
        "--kubelet-dir", str(kubelet.directory), "--metrics-address", address, "--json", timeout=60,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    check: dict[str, Any] = next(c for c in json.loads(result.stdout) if c["check"] == name)
    return check


def test_list_and_doctor_show_the_agents_hold(kubelet: KubeletStandin, short_dir: Path) -> None:
    state = short_dir / "state.json"
    write_state(state, {"unhealthy": []})
    address = f"127.0.0.1:{free_port()}"
    agent = AgentProcess(
        ["run", "--backend", "fake", "--fake-state", str(state), "--kubelet-dir", str(kubelet.directory),
         "--metrics-address", address, "--flap-threshold", "2", "--flap-window", "600", "--flap-quiet", "600"]
    )  # fmt: skip
    try:
        node = ScriptedChips(kubelet, state, markers=(0, 1, 2, 4, 5, 6, 7))
        kubelet.wait_registrations(1)
        node.script([3])
        node.script([])
        node.script([3])
        agent.wait_log("Ascend910-3 is held Unhealthy")
        logged = len(agent.matching("Ascend910-3 is Unhealthy"))
        calm = node.script([])
        assert calm.health()["Ascend910-3"] == "Unhealthy"

        listed = _list(state, address, "--json")
        assert listed.returncode == 0, listed.stderr
        row = next(r for r in json.loads(listed.stdout) if r["id"] == "Ascend910-3")
        assert row["held"] is True and row["health"] == "Unhealthy"
        assert "turned Unhealthy 2 times within 600 s" in row["held_why"]
        assert row["held_until"] is not None and row["held_until"].endswith("Z"), "Healthy now: quiet runs"
        assert {r["held"] for r in json.loads(listed.stdout) if r["id"] != "Ascend910-3"} == {False}
        table = _list(state, address)
        line = next(line for line in table.stdout.splitlines() if line.startswith("Ascend910-3 "))
        assert f"until {row['held_until']}" in line

        check = _doctor_check(kubelet, short_dir, address, "held chips (agent)")
        assert check["ok"] is False
        assert check["detail"].startswith(f"Ascend910-3 held until {row['held_until']}: ")

        # Flips of the held chip underneath: no line per flip while it is held.
        node.script([3])
        node.script([])
        node.script([3])
        assert len(agent.matching("Ascend910-3 is Unhealthy")) == logged
        assert len(agent.matching("Ascend910-3 is held Unhealthy")) == 1
    finally:
        agent.close()

    table = _list(state, address)
    assert table.returncode == 0
    assert f"ascend-agent: no running agent answers on {address}" in table.stderr
    assert "Ascend910-3 " in table.stdout
    assert _list(state, address, "--json").stdout.count('"held": null') == 8
    check = _doctor_check(kubelet, short_dir, address, "held chips (agent)")
    assert check["ok"] is None and check["detail"].startswith(
        f"unknown: no running agent answers on {address}"
    )
