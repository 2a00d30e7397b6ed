"""Bad input as an operator meets it: files that are not UTF-8, seconds that make no sense, a state file
that is not there, chip ids that do not exist. One line and exit 2 at start; at a live reload the agent keeps
going."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.agent_process import fake_agent
from tests.support.cli import run_cli
from tests.support.kubelet_standin import KubeletStandin

GBK_COMMENT = "# 节点配置\n".encode("gbk")


_cli = run_cli
ALIAS_BOMB = b"driverMounts:\n  - &long " + b"A" * 10_000 + b"\n" + b"  - *long\n" * 10_000


@pytest.mark.parametrize(
    ("files", "args", "env", "message"),
    [
        (
            {"c.yaml": b"backend: fake\n" + GBK_COMMENT},
            ["--config", "{dir}/c.yaml"],
            {},
            "config file {dir}/c.yaml is not UTF-8: byte 0xbd at offset 16 (line 2); save it as UTF-8",
        ),
        (
            {"s.json": GBK_COMMENT + b"{}"},
            ["--backend", "fake", "--fake-state", "{dir}/s.json"],
            {},
            "fake state file {dir}/s.json is not UTF-8: byte 0xbd at offset 2 (line 1)",
        ),
        ({}, ["--backend", "fake", "--fake-state", "{dir}/gone.json"], {}, "{dir}/gone.json does not exist"),
        ({}, ["--health-interval", "nan"], {}, "--health-interval must be a finite number of seconds"),
        ({}, ["--health-interval", "inf"], {}, "--health-interval must be a finite number of seconds"),
        (
            {},
            ["--health-interval", "0.001"],
            {},
            "--health-interval must be a finite number of seconds, at least 1",
        ),
        (
            {},
            ["--npu-smi-timeout", "0.1"],
            {},
            "--npu-smi-timeout must be a finite number of seconds, at least 1",
        ),
        (
            {},
            [],
            {"ASCEND_AGENT_HEALTH_INTERVAL": "nan"},
            "ascend-agent: ASCEND_AGENT_HEALTH_INTERVAL must be a finite number of seconds, at least 1",
        ),
        (
            {},
            ["--health-interval", "0.5"],
            {"ASCEND_AGENT_HEALTH_INTERVAL": "nan"},
            "ascend-agent: --health-interval must be a finite number of seconds, at least 1",
        ),
        (  # an alias bomb: 100 KB that expanded into a 400 MB log line
            {"c.yaml": ALIAS_BOMB},
            ["--config", "{dir}/c.yaml"],
            {},
            "config file {dir}/c.yaml uses a YAML alias at line 3; write the value out instead",
        ),
        (
            {"c.yaml": b"driverMounts: [" + b", ".join(b"/d%d" % n for n in range(65)) + b"]\n"},
            ["--config", "{dir}/c.yaml"],
            {},
            "config file {dir}/c.yaml: driverMounts has 65 entries; at most 64 are accepted",
        ),
        (
            {"c.yaml": b'backend: fake\nfakeModel: "910\\nERROR forged line"\n'},
            ["--config", "{dir}/c.yaml"],
            {},
            "config file {dir}/c.yaml: fakeModel contains the control character U+000A at position 3",
        ),
        (
            {"c.yaml": b'model: "910\\0"\n'},
            ["--config", "{dir}/c.yaml"],
            {},
            "config file {dir}/c.yaml: model contains the control character U+0000 at position 3",
        ),
        (
            {},
            ["--npu-smi", "/usr/bin/npu-smi\x1b[2J"],
            {},
            "--npu-smi contains the control character U+001B at position 16; remove it",
        ),
    ],
)
def test_exit_2_with_one_line(
    short_dir: Path, files: dict[str, bytes], args: list[str], env: dict[str, str], message: str
) -> None:
    for name, data in files.items():
        (short_dir / name).write_bytes(data)
    arguments = [arg.replace("{dir}", str(short_dir)) for arg in args]
    result = _cli("run", *arguments, "--kubelet-dir", str(short_dir / "k"), env=env)
    assert result.returncode == 2, result.stderr
    assert message.replace("{dir}", str(short_dir)) in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_list_names_state_ids_that_are_not_chips(short_dir: Path) -> None:
    state = short_dir / "s.json"
    state.write_text(json.dumps({"absent": [99], "unhealthy": [1]}))
    # No running agent is asked (another on this machine would give its own chips' health).
    result = _cli("list", "--backend", "fake", "--fake-state", str(state), "--json", "--metrics-address", "")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"fake state file {state} names chips that do not exist: 99 (8 chips, ids 0-7); ignored"
    ]
    assert [row["health"] for row in json.loads(result.stdout)].count("Unhealthy") == 1


def test_a_config_turned_gbk_at_a_live_reload_keeps_the_running_settings(
    kubelet: KubeletStandin, short_dir: Path
) -> None:
    config = short_dir / "config.yaml"
    config.write_text("fakeChips: 4\n")
    agent = fake_agent(kubelet.directory, "--config", str(config))
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 4)
        config.write_bytes(b"fakeChips: 2\n" + GBK_COMMENT)
        (line,) = agent.wait_log("Config not applied")
        assert line.endswith(
            f"Config not applied, keeping the running settings: config file {config} is not UTF-8: "
            "byte 0xbd at offset 15 (line 2); save it as UTF-8"
        )
        config.write_text("fakeChips: 2\n")
        kubelet.wait_update(lambda u: len(u.devices) == 2)
        assert agent.proc.poll() is None
        assert "Traceback" not in agent.output
    finally:
        agent.close()
