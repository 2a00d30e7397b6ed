"""The ``run`` command as a process: logging, the backend, the HTTP endpoint, the instance lock and the
signals around one :class:`~ascend_agent.reconciler.Agent`; its exit status::

    sys.exit(asyncio.run(run_agent(source, source.load_effective())))

SIGTERM and SIGINT stop the agent (every plugin stops serving and removes its sockets), SIGHUP re-reads the
config file.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from ascend_agent import __version__, cluster
from ascend_agent.backends import Backend, VnpuLayoutBackend, backend_for
from ascend_agent.backends.vnpu_keeper import VnpuLayoutKeeper, plans_now
from ascend_agent.config import DRA_API, ConfigError, EffectiveSettings, Settings, SettingsSource
from ascend_agent.health.grading import FaultGrading
from ascend_agent.health.separation import ManualSeparation
from ascend_agent.instance import exclusive
from ascend_agent.kubelet import dirs as kubelet_dirs
from ascend_agent.kubelet.deviceplugin.lifecycle import ServeFailed
from ascend_agent.kubelet.deviceplugin.plugins import DevicePlugins
from ascend_agent.kubelet.holders import Holdings
from ascend_agent.kubelet.mounted import MountedChips
from ascend_agent.kubelet.podresources import PodHolders
from ascend_agent.live_settings import log_configuration
from ascend_agent.model import Chip
from ascend_agent.node_summary import summary_document
from ascend_agent.observability import configure_logging, log_accept_failures_briefly
from ascend_agent.reconciler import Agent
from ascend_agent.stopping import ignore_while_stopping, stop_requested

if TYPE_CHECKING:
    from ascend_agent.cluster.side import Feature
    from ascend_agent.health.hotreset.manager import HotReset

log = logging.getLogger(__name__)


def _reap_children_by_pidfd() -> None:
    """On the running loop: Python 3.11 waits for every npu-smi in a thread started for it; a pidfd on the
    event loop needs no thread (3.12 and later choose it themselves)."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel before 5.3, or a seccomp profile that refuses it
        return
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)


async def run_agent(source: SettingsSource, effective: EffectiveSettings) -> int:
    """The ``run`` command: the agent until SIGTERM or SIGINT; the exit status. ``effective``: ``source``
    as loaded, the settings with where each came from."""
    settings = effective.settings
    configure_logging(settings.log_level, settings.log_format)
    log_accept_failures_briefly(asyncio.get_running_loop())
    _reap_children_by_pidfd()
    backend = backend_for(settings)
    await backend.start()
    log.info(
        "ascend-agent %s starting: backend %s, kubelet directory %s",
        __version__,
        settings.backend,
        settings.kubelet_dir,
    )
    log_configuration(effective)
    agent = _build(source, settings, backend)
    if settings.vnpu is not None and isinstance(backend, VnpuLayoutBackend):
        await backend.query()
        # A layout the chips cannot hold stops the start before anything else is asked or run (a chip npu-smi
        # cannot read now does not: the layout waits for it).
        try:
            await plans_now(backend, settings.vnpu, unread_ok=True)
        except ConfigError:
            await backend.close()
            raise
        await agent.holdings.pods.refresh()  # which vNPUs and chips pods hold, before anything is destroyed
        await agent.vnpu.apply(backend, settings)
    elif settings.vnpu is not None:
        await agent.vnpu.apply(backend, settings)  # says that this backend ignores it
    try:
        await agent.endpoint.open()
    except OSError as exc:
        raise ConfigError(f"--metrics-address {settings.metrics_address}: {exc.strerror or exc}") from None
    # What starting made (modules, classes, settings) lives as long as the process: out of the collector's
    # reach, a full collection, which may come in the middle of an Allocate, walks only what was made since.
    gc.freeze()
    failures: list[BaseException] = []
    bad_usage: list[BaseException] = []
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_signals, agent, tasks.cancel_scope, name="signals")
            await kubelet_dirs.wait_for(kubelet_dirs.kubelets_own(settings), on_wait=agent.waiting_for)
            # The default plugin directory sits in the kubelet's own plugins directory: never made here.
            make_parents = settings.plugin_dir is not None
            if agent.side_by_side:
                # A rolling update's new pod serves before the old one stops: no instance lock to wait for.
                log.info("DRA driver with its pod's UID: serving beside any other instance of it")
                await agent.run()
            else:
                async with exclusive(settings.effective_plugin_dir, agent.standby, make_parents):
                    await agent.run()
    except* ServeFailed as failed:
        failures.extend(_leaves(failed))
    except* ConfigError as bad:
        bad_usage.extend(_leaves(bad))
    if bad_usage:
        raise bad_usage[0]
    if failures:
        log.error("Giving up: %s", failures[0])
        return 1
    log.info("Stopped; sockets removed")
    return 0


def _build(source: SettingsSource, settings: Settings, backend: Backend) -> Agent:
    """Each part once, handed what it needs: the cluster side, the kubelet side (device plugins, or the DRA
    driver in their place), who holds which chip, the vNPU layout, the fault table, the hot reset, and the
    agent over them."""
    separation = ManualSeparation()
    grading = FaultGrading.builtin(settings.fault_policy)
    mounted = MountedChips() if settings.volcano else None
    dra = settings.kubelet_api == DRA_API
    more: list[Callable[[], Feature]] = []
    if dra:
        from ascend_agent.kubelet.dra import slice_publisher

        more.append(partial(slice_publisher, settings))
    if settings.node_summary:
        more.append(lambda: _summary_publisher(agent, "dra" if dra else "device-plugin"))
    side = cluster.open_side(settings, separation, mounted, grading, more)
    if side is None and dra:
        raise ConfigError(
            "--kubelet-api dra needs the Kubernetes API (claims, ResourceSlices): give --kubeconfig or run "
            "in a pod with a service account, and do not set --no-cluster"
        )
    if side is None:
        mounted = None
    pods = PodHolders(settings.pod_resources_socket, backend.health_interval or settings.health_interval)
    holdings = Holdings(pods, cluster.volcano_holders(side, settings))
    remap_ids = cluster.volcano_remapper(side, settings)
    if settings.volcano and remap_ids is None:
        log.warning(
            "--volcano needs the cluster side (--kubeconfig or a service account, and not --no-cluster): "
            "Allocate hands over the kubelet's IDs"
        )
    listed = None
    if mounted is not None:
        view = mounted
        view.kubelet_holders = holdings.by_chip
        view.refresh_kubelet_holders = pods.refresh
        view.handed_pairs = holdings.handed_out.pairs

        def listed(resource: str, devices: dict[str, Chip]) -> dict[str, Chip] | None:
            return view.listed(resource, devices, pods.holders, pods.error is None)

    plugins = DevicePlugins(settings, holdings.allocated, remap_ids, listed)
    driver = None
    if dra:  # the DRA driver in place of the device plugins
        from ascend_agent.kubelet.dra import DraDriver

        driver = DraDriver.open(settings, side)
        holdings.claimed = driver.service.held_device_ids

    # The agent's state files stay beside the instance lock, where the start's pluginDir put it, whatever a
    # reload says.
    state_dir = settings.effective_plugin_dir

    def make_resets(settings: Settings) -> HotReset:
        from ascend_agent.health.hotreset.budget import BUDGET_FILE  # loaded only once hotReset is on
        from ascend_agent.health.hotreset.manager import HotReset

        return HotReset(
            settings,
            resetter=lambda: agent.backend,
            held=holdings.held_devices,
            refresh_holders=pods.refresh,
            wake=lambda: agent.wake(),
            note=side.event if side is not None else None,
            manual_resets=side.reset_info if side is not None else None,
            budget_file=state_dir / BUDGET_FILE,
        )

    agent = Agent(
        settings,
        backend,
        source,
        cluster=side,
        separation=separation,
        holdings=holdings,
        plugins=plugins,
        dra=driver,
        mounted=mounted,
        vnpu=VnpuLayoutKeeper(holdings.held_devices),
        grading=grading,
        make_resets=make_resets,
    )
    return agent


def _summary_publisher(agent: Agent, mode: str) -> Feature:
    """The node summary ``kubectl ascend`` reads, made from what ``agent`` last reconciled."""
    from ascend_agent.cluster.summary import SummaryPublisher

    def document() -> dict[str, Any]:
        return summary_document(agent.report.last, agent.report.holders, agent.ready(), mode)

    return SummaryPublisher(document)


async def print_vnpu_plan(settings: Settings) -> int:
    """``run --dry-run-vnpu``: print the npu-smi commands the ``vnpu:`` layout needs now, run none; the exit
    status (a refused layout is a :class:`ConfigError`)."""
    if settings.vnpu is None:
        raise ConfigError("--dry-run-vnpu: the config sets no vnpu: layout, so there is nothing to plan")
    _reap_children_by_pidfd()
    backend = backend_for(settings)
    if not isinstance(backend, VnpuLayoutBackend):
        raise ConfigError(f"--dry-run-vnpu: the {settings.backend} backend does not create vNPUs")
    try:
        await backend.start()
        await backend.query()
        plans = await plans_now(backend, settings.vnpu)
    finally:
        await backend.close()
    for plan in plans:
        for command in plan.commands():
            print(command)
        for vnpu in plan.in_use:
            print(f"# kept: vNPU {vnpu.vnpu_id} ({vnpu.template}) on chip {plan.chip.phys_id} is in use")
        for template in plan.waiting:
            print(f"# waits for a vNPU in use to be freed: {template} on chip {plan.chip.phys_id}")
    if all(plan.empty and not plan.in_use for plan in plans):
        print("# nothing to do: every chip the layout names holds it")
    return 0


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions inside nested task groups' exception groups."""
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


async def _signals(agent: Agent, scope: anyio.CancelScope) -> None:
    try:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as received:
            if stop_requested():  # while the agent was starting
                scope.cancel()
                return
            async for signum in received:
                if signum == signal.SIGHUP:
                    agent.reload()
                else:
                    scope.cancel()
                    return
    finally:
        ignore_while_stopping()
