"""A config file mounted from a ConfigMap: an update swaps the ``..data`` link, and the agent applies it."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.agent_process import fake_agent
from tests.support.kubelet_standin import KubeletStandin


def _version(directory: Path, serial: int, text: str) -> str:
    name = f"..2026_12_04_10_00_{serial:02d}.{serial:09d}"
    (directory / name).mkdir()
    (directory / name / "config.yaml").write_text(text)
    return name


def test_a_configmap_update_is_applied(kubelet: KubeletStandin, short_dir: Path) -> None:
    volume = short_dir / "config"
    volume.mkdir()
    (volume / "..data").symlink_to(_version(volume, 0, "fakeChips: 4\n"))
    (volume / "config.yaml").symlink_to("..data/config.yaml")
    agent = fake_agent(kubelet.directory, "--config", str(volume / "config.yaml"))
    try:
        kubelet.wait_update(lambda u: len(u.devices) == 4)
        (volume / "..data_tmp").symlink_to(_version(volume, 1, "fakeChips: 2\n"))
        os.rename(volume / "..data_tmp", volume / "..data")
        kubelet.wait_update(lambda u: len(u.devices) == 2)
        agent.wait_log("Config applied: fake_chips changed")
    finally:
        agent.close()
