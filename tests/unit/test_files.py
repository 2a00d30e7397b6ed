"""Files and directories the agent makes where others may write: the instance lock through a planted link,
directory modes under ``umask 000``, and the CDI spec's directory."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ascend_agent import cdi
from ascend_agent.backends._container import container_base
from ascend_agent.config import ConfigError
from ascend_agent.instance import LOCK_FILE, exclusive
from ascend_agent.kubelet.deviceplugin.service import DevicePluginService
from ascend_agent.kubelet.deviceplugin.transport import BoundedServer
from ascend_agent.kubelet.deviceplugin.wire import BytesCodec
from ascend_agent.model import Chip, ContainerBase, DeviceNode


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    yield
    os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


async def test_a_symlinked_lock_is_refused_and_its_target_untouched(short_dir: Path) -> None:
    target = short_dir / "precious"
    target.write_text("keep me\n")
    plugin_dir = short_dir / "plugin"
    plugin_dir.mkdir()
    (plugin_dir / LOCK_FILE).symlink_to(target)
    with pytest.raises(ConfigError, match="is a symbolic link; remove it"):
        async with exclusive(plugin_dir):
            raise AssertionError("the lock was taken through the link")
    assert target.read_text() == "keep me\n"


async def test_a_lock_that_is_not_a_regular_file_is_refused(short_dir: Path) -> None:
    os.mkfifo(short_dir / LOCK_FILE)
    with pytest.raises(ConfigError, match="is not a regular file"):
        async with exclusive(short_dir):
            raise AssertionError("the lock was taken on a FIFO")


async def test_directories_the_agent_makes_ignore_the_umask(short_dir: Path, open_umask: None) -> None:
    async with exclusive(short_dir / "plugin" / "nested"):
        pass
    assert _mode(short_dir / "plugin") == 0o750
    assert _mode(short_dir / "plugin" / "nested") == 0o750
    assert _mode(short_dir / "plugin" / "nested" / LOCK_FILE) & 0o022 == 0

    service = DevicePluginService("huawei.com/Ascend910", on_stream_change=lambda: None)
    server = BoundedServer([service], codec=BytesCodec())
    await server.serve(short_dir / "plugin" / "Ascend910.sock")
    try:
        assert _mode(short_dir / "plugin" / "Ascend910.sock") == 0o600
    finally:
        await server.shut()

    chips = [Chip.make(0, "910B4")]
    written = await cdi.write_spec(short_dir / "cdi", cdi.build_spec(chips, ContainerBase()))
    assert _mode(short_dir / "cdi") == 0o755
    assert _mode(written) == 0o644


async def test_the_cdi_spec_is_not_written_where_others_can_replace_it(short_dir: Path) -> None:
    shared = short_dir / "cdi"
    shared.mkdir()
    shared.chmod(0o777)
    chips = [Chip.make(0, "910B4")]
    with pytest.raises(PermissionError, match="make it 0755"):
        await cdi.write_spec(shared, cdi.build_spec(chips, ContainerBase()))
    assert not (shared / cdi.SPEC_FILE).exists()


@pytest.mark.parametrize("mode", ["plain", "ascend-runtime"])
def test_every_cdi_device_of_the_node_spec_has_edits(mode: str) -> None:
    """CDI refuses a spec with a device without edits ("invalid device, empty device edits")."""
    chips = [Chip.make(i, "910B4") for i in (0, 1)]
    base = container_base(mode, [DeviceNode("/dev/davinci_manager", "/dev/davinci_manager")])
    spec = cdi.build_spec(chips, base)
    edits = [device["containerEdits"] for device in spec["devices"]]
    assert all(any(edit.values()) for edit in edits), edits
    if mode == "plain":
        assert edits[1] == {"deviceNodes": [{"path": "/dev/davinci1", "permissions": "rw"}]}
    else:
        assert edits[1] == {"env": ["ASCEND_CLAIMED_NPU_1=1"]}
