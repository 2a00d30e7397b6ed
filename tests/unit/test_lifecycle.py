"""One ResourcePlugin in the test's event loop against a grpclib kubelet stand-in: registration with back-off,
kubelet restarts, lost sockets and streams, readiness, and a clean stop."""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import cast

import anyio
import pytest
from anyio.abc import TaskGroup

from ascend_agent._proto.v1beta1 import DevicePluginStub, ListAndWatchResponse
from ascend_agent.config import Settings
from ascend_agent.kubelet.deviceplugin import lifecycle
from ascend_agent.kubelet.deviceplugin.lifecycle import BACKOFF_START, STREAM_GRACE, ResourcePlugin
from ascend_agent.kubelet.deviceplugin.transport import LocalChannel
from ascend_agent.model import Chip, ContainerBase, Health
from tests.support.grpclib_kubelet import AsyncKubelet

RESOURCE = "huawei.com/Ascend910"
CHIPS = [Chip.make(i, "910B4", numa_node=i // 4) for i in range(8)]


_CONTAINER = ContainerBase(chip_nodes=False)


def _plugin(directory: Path, chips: Sequence[Chip] = CHIPS) -> ResourcePlugin:
    plugin = ResourcePlugin(RESOURCE, Settings(kubelet_dir=directory, plugin_dir=directory.parent / "agent"))
    plugin.publish({chip.device_id: chip for chip in chips}, None, _CONTAINER)
    return plugin


@contextlib.asynccontextmanager
async def _running(plugin: ResourcePlugin) -> AsyncIterator[TaskGroup]:
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(plugin.run)
        yield tasks
        tasks.cancel_scope.cancel()


async def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Look at a condition that has no event of its own (the plugin's status) until it holds."""
    try:
        with anyio.fail_after(timeout):
            while not condition():
                await anyio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"no {what} within {timeout} s") from None


async def _no_more_registrations(kubelet: AsyncKubelet, count: int, within: float) -> None:
    """A negative check: no registration beyond ``count`` arrives within ``within`` seconds."""
    with pytest.raises(AssertionError):
        await kubelet.wait_registrations(count + 1, timeout=within)
    assert len(kubelet.registrations) == count


async def _registered_and_streaming(kubelet: AsyncKubelet, plugin: ResourcePlugin, count: int) -> None:
    await kubelet.wait_registrations(count)
    await _until(lambda: plugin.status()[0], f"ready after registration {count}")


@pytest.fixture
async def kubelet(short_dir: Path) -> AsyncIterator[AsyncKubelet]:
    standin = AsyncKubelet(short_dir / "device-plugins")
    await standin.start()
    yield standin
    await standin.stop()


async def test_registration_retries_with_growing_back_off_after_refusals(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ascend_agent")
    kubelet = AsyncKubelet(short_dir / "device-plugins", refuse=3)
    await kubelet.start()
    plugin = _plugin(kubelet.directory)
    try:
        async with _running(plugin):
            (registration,) = await kubelet.wait_registrations(1)
            await _until(lambda: plugin.status()[0], "ready")
            assert kubelet.refused == 3
            assert registration.resource == RESOURCE and registration.endpoint == "Ascend910.sock"
            assert len(kubelet.attempts) == 4
            gaps = [later - earlier for earlier, later in itertools.pairwise(kubelet.attempts)]
            # Each retry waits at least its back-off: 0.1, 0.2, 0.4 s.
            for n, gap in enumerate(gaps):
                assert gap >= BACKOFF_START * 2**n * 0.9, gaps
            await _no_more_registrations(kubelet, 1, within=0.5)
    finally:
        await kubelet.stop()
    refusals = [r for r in caplog.records if "Cannot register" in r.getMessage()]
    assert len(refusals) == 1, "one refusal is logged once, not once per attempt"
    assert "refused" in refusals[0].getMessage()


async def test_a_new_kubelet_sock_not_listening_yet_is_tried_again_soon(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """kubelet.sock appears at the kubelet's bind(), before it listens: a plugin woken by the file meets a
    refusal. Its next try comes at the start of the back-off (0.1 s), not after the 3.2 s grown while there
    was no kubelet at all."""
    caplog.set_level(logging.DEBUG, logger="ascend_agent")
    kubelet = AsyncKubelet(short_dir / "device-plugins")
    kubelet.directory.mkdir(parents=True)

    def next_attempts() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Next registration")]

    plugin = _plugin(kubelet.directory)
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        async with _running(plugin):
            await _until(lambda: any(" in 1.6 s" in m for m in next_attempts()), "a back-off grown to 1.6 s")
            bound.bind(str(kubelet.socket))  # the kubelet's bind(); it does not listen yet
            tried = len(next_attempts())
            plugin.poke()  # what the agent's inotify watch does when kubelet.sock appears
            await _until(lambda: len(next_attempts()) > tried, "the refused attempt")
            assert "refused" in plugin.status()[1]
            await kubelet.start(wipe=False, sock=bound)  # listens now
            await kubelet.wait_registrations(1, timeout=2.0)
    finally:
        await kubelet.stop()
        bound.close()


async def test_kubelet_restart_gives_exactly_one_registration_served_first(kubelet: AsyncKubelet) -> None:
    plugin = _plugin(kubelet.directory)
    async with _running(plugin):
        await _registered_and_streaming(kubelet, plugin, 1)
        for restart in range(1, 6):
            await kubelet.stop()
            await kubelet.start()  # removes Ascend910.sock, as a starting kubelet does
            plugin.poke()
            await _registered_and_streaming(kubelet, plugin, 1 + restart)
            latest = kubelet.registrations[-1]
            assert latest.socket_present, "Register arrived before the plugin served its socket again"
        await _no_more_registrations(kubelet, 6, within=1.0)
        assert kubelet.dial_failures == []
        assert plugin.socket_path.is_socket()
        assert kubelet.updates[-1] == (RESOURCE, [c.device_id for c in CHIPS])


async def test_socket_loss_alone_serves_and_registers_again(
    kubelet: AsyncKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ascend_agent")
    plugin = _plugin(kubelet.directory)
    async with _running(plugin):
        await _registered_and_streaming(kubelet, plugin, 1)
        plugin.socket_path.unlink()
        plugin.poke()
        await _registered_and_streaming(kubelet, plugin, 2)
        assert plugin.socket_path.is_socket()
        served_again = [
            r for r in caplog.records if "is gone; serving huawei.com/Ascend910 again" in r.getMessage()
        ]
        assert len(served_again) == 1
        assert kubelet.registrations[1].socket_present
        await _no_more_registrations(kubelet, 2, within=1.0)
        assert kubelet.dial_failures == []
        # The new socket answers a client of its own.
        channel = LocalChannel(plugin.socket_path)
        try:
            with anyio.fail_after(5):
                first = await anext(aiter(DevicePluginStub(channel).list_and_watch()))
        finally:
            channel.close()
        assert [d.id for d in first.devices] == [c.device_id for c in CHIPS]


async def test_kubelet_stream_ending_registers_again_after_the_grace(kubelet: AsyncKubelet) -> None:
    plugin = _plugin(kubelet.directory)
    async with _running(plugin):
        await _registered_and_streaming(kubelet, plugin, 1)
        ended = anyio.current_time()
        await kubelet.end_stream()
        await _registered_and_streaming(kubelet, plugin, 2)
        assert kubelet.registrations[1].at - ended >= STREAM_GRACE * 0.9, "registered again before the grace"
        await _no_more_registrations(kubelet, 2, within=1.0)


async def test_not_ready_while_the_kubelet_stream_is_closed_though_another_stream_is_open(
    kubelet: AsyncKubelet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long grace keeps the plugin from registering again while we look.
    monkeypatch.setattr(lifecycle, "STREAM_GRACE", 30.0)
    plugin = _plugin(kubelet.directory)
    async with _running(plugin):
        await _registered_and_streaming(kubelet, plugin, 1)
        channel = LocalChannel(plugin.socket_path)
        # The generated stub is typed as an iterator; it is an async generator, closed to end the stream.
        stream = cast(AsyncGenerator[ListAndWatchResponse, None], DevicePluginStub(channel).list_and_watch())
        try:
            with anyio.fail_after(5):
                assert len((await anext(stream)).devices) == 8
            await kubelet.end_stream()
            await _until(lambda: not plugin.status()[0], "not ready after the kubelet's stream ended")
            _, why = plugin.status()
            assert "ListAndWatch stream is not open" in why and RESOURCE in why
            # The other client's stream is alive: it gets the next device list, and still we are not ready.
            plugin.publish({c.device_id: c for c in CHIPS[:4]}, None, _CONTAINER)
            with anyio.fail_after(5):
                assert len((await anext(stream)).devices) == 4
            plugin.poke()
            await anyio.wait_all_tasks_blocked()  # the plugin has looked again
            assert plugin.status()[0] is False
            assert len(kubelet.registrations) == 1
        finally:
            await stream.aclose()
            channel.close()


async def test_cancelling_the_run_removes_the_socket(kubelet: AsyncKubelet) -> None:
    plugin = _plugin(kubelet.directory)
    async with _running(plugin) as tasks:
        await _registered_and_streaming(kubelet, plugin, 1)
        assert plugin.socket_path.is_socket()
        tasks.cancel_scope.cancel()
    assert not plugin.socket_path.exists()
    assert kubelet.socket.is_socket(), "the kubelet's socket is not ours to remove"
    await kubelet.wait_for(lambda: kubelet.streams_ended >= 1, "the kubelet's stream to end")


async def test_a_held_chip_flipping_underneath_sends_no_device_list(kubelet: AsyncKubelet) -> None:
    """The chip's own health flips while the hold keeps it Unhealthy: only its reason changes, which the
    kubelet never sees; each flip used to send the same list again."""
    plugin = _plugin(kubelet.directory)

    def devices(reason: str, without_7: bool) -> dict[str, Chip]:
        chips = [
            replace(chip, held=True).with_health(Health.UNHEALTHY, reason) if chip.phys_id == 3 else chip
            for chip in CHIPS
            if not (without_7 and chip.phys_id == 7)
        ]
        return {chip.device_id: chip for chip in chips}

    async with _running(plugin):
        await _registered_and_streaming(kubelet, plugin, 1)
        plugin.publish(devices("Alarm; held Unhealthy", without_7=False), None, _CONTAINER)
        await kubelet.wait_for(lambda: len(kubelet.updates) == 2, "the held chip's list")
        for flip in range(10):
            reason = "Healthy now; held Unhealthy" if flip % 2 == 0 else "Alarm; held Unhealthy"
            plugin.publish(devices(reason, without_7=flip % 2 == 1), None, _CONTAINER)  # the flip alone
            await anyio.wait_all_tasks_blocked()  # a list the flip sent is on its way before the next publish
            shown = devices(reason, without_7=flip % 2 == 0)
            plugin.publish(shown, None, _CONTAINER)  # a change the kubelet sees, to follow the stream
            ids = list(shown)
            await kubelet.wait_for(lambda ids=ids: kubelet.updates[-1][1] == ids, f"step {flip}")
        assert len(kubelet.updates) == 2 + 10, "one list per change the kubelet sees, none per flip"
