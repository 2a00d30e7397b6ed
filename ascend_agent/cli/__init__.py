"""The command line: ``ascend-agent run | list | doctor | ranktable | kubelet-sim | version``, and
``ascend-agent --version``.

Every flag is also read from ``ASCEND_AGENT_<NAME>``; a YAML file given with ``--config`` sits under both.
Exit status: 0 after SIGTERM/SIGINT, 2 for bad usage or configuration (one line on stderr), 1 otherwise.
Commands import what they need when they run, so ``version`` and ``--help`` stay fast. ``--help`` is plain
text, the options in groups (``help_layout``), whatever the terminal.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from click.core import ParameterSource

from ascend_agent import __version__, naming
from ascend_agent.cli.flags import (
    ApiBurst,
    ApiQps,
    Backend,
    CdiSpecDir,
    Cluster,
    ConfigFile,
    DaemonSetName,
    DaemonSetNamespace,
    DeviceInfo,
    DevRoot,
    DraCleanup,
    DraDriverName,
    DraTaintEffect,
    DryRunVnpu,
    FakeChips,
    FakeModel,
    FakeState,
    FakeTraining,
    FakeVnpus,
    FlapQuiet,
    FlapThreshold,
    FlapWindow,
    HccnTool,
    HealthInterval,
    HealthThreshold,
    HealthyWithoutNpuSmi,
    HostRoot,
    HotReset,
    HotResetIdle,
    HotResetLimit,
    HotResetRecover,
    HotResetTimeout,
    HotResetWindow,
    Json,
    Kubeconfig,
    KubeletApi,
    KubeletDir,
    LinkDownDebounce,
    LogFormat,
    LogLevel,
    MetricsAddress,
    Mode,
    NetworkHealth,
    NodeName,
    NpuSmi,
    NpuSmiTimeout,
    PluginDir,
    PluginsRegistryDir,
    PodResourcesSocket,
    Registration,
    Replicas,
    ServeTimeout,
    SysRoot,
    Volcano,
    VolcanoSchedulerName,
)
from ascend_agent.cli.help_layout import GroupedCommand, with_default
from ascend_agent.config import DRA_API, ConfigError, Settings, SettingsSource
from ascend_agent.runner import EXIT_USAGE, exec_agent
from ascend_agent.stopping import catch_early

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Click's plain help and errors: rich's tables cut option names and defaults to fit the terminal (and
    # take 80 columns without one), and its error boxes are no one line.
    rich_markup_mode=None,
    # Click (8.4 and later) names the nearest command itself; typer's own suggestion would say it twice.
    suggest_commands=False,
    help="Kubernetes device plugin for Huawei Ascend NPUs.",
)

EXIT_FAILURE = 1


def _fail(message: str, code: int) -> typer.Exit:
    print(f"ascend-agent: {message}", file=sys.stderr)
    return typer.Exit(code)


def _source(overrides: dict[str, Any]) -> SettingsSource:
    """The flags' and variables' values and the config file, not read yet."""
    config_file = overrides.pop("config", None)
    context = click.get_current_context()
    from_environment = frozenset(
        name for name in overrides if context.get_parameter_source(name) is ParameterSource.ENVIRONMENT
    )
    return SettingsSource(overrides=overrides, config_file=config_file, from_environment=from_environment)


def _settings(overrides: dict[str, Any]) -> tuple[SettingsSource, Settings]:
    source = _source(overrides)
    try:
        return source, source.load()
    except ConfigError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None


def _print_version(wanted: bool) -> None:
    if wanted:
        print(f"ascend-agent {__version__}")
        raise typer.Exit(0)


@app.callback()
def _commands(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    """Kubernetes device plugin for Huawei Ascend NPUs."""


@app.command(cls=GroupedCommand)
def run(
    backend: Backend = None,
    kubelet_dir: KubeletDir = None,
    registration: Registration = None,
    plugins_registry_dir: PluginsRegistryDir = None,
    plugin_dir: PluginDir = None,
    serve_timeout: ServeTimeout = None,
    config: ConfigFile = None,
    log_level: LogLevel = None,
    log_format: LogFormat = None,
    host_root: HostRoot = None,
    dev_root: DevRoot = None,
    sys_root: SysRoot = None,
    npu_smi: NpuSmi = None,
    npu_smi_timeout: NpuSmiTimeout = None,
    hccn_tool: HccnTool = None,
    network_health: NetworkHealth = None,
    link_down_debounce: LinkDownDebounce = None,
    health_interval: HealthInterval = None,
    health_failure_threshold: HealthThreshold = None,
    healthy_without_npu_smi: HealthyWithoutNpuSmi = None,
    flap_threshold: FlapThreshold = None,
    flap_window: FlapWindow = None,
    flap_quiet: FlapQuiet = None,
    mode: Mode = None,
    replicas: Replicas = None,
    cdi_spec_dir: CdiSpecDir = None,
    metrics_address: MetricsAddress = None,
    fake_chips: FakeChips = None,
    fake_model: FakeModel = None,
    fake_state: FakeState = None,
    cluster: Cluster = None,
    kubeconfig: Kubeconfig = None,
    node_name: NodeName = None,
    api_qps: ApiQps = None,
    api_burst: ApiBurst = None,
    pod_resources_socket: PodResourcesSocket = None,
    device_info: DeviceInfo = None,
    volcano: Volcano = None,
    volcano_scheduler_name: VolcanoSchedulerName = None,
    kubelet_api: KubeletApi = None,
    dra_driver_name: DraDriverName = None,
    dra_taint_effect: DraTaintEffect = None,
    dra_cleanup: DraCleanup = None,
    fake_vnpus: FakeVnpus = None,
    fake_training: FakeTraining = None,
    hot_reset: HotReset = None,
    hot_reset_idle: HotResetIdle = None,
    hot_reset_timeout: HotResetTimeout = None,
    hot_reset_recover: HotResetRecover = None,
    hot_reset_limit: HotResetLimit = None,
    hot_reset_window: HotResetWindow = None,
    dry_run_vnpu: DryRunVnpu = False,
) -> None:
    """Serve the device plugin API until SIGTERM or SIGINT."""
    catch_early()
    overrides = dict(locals())
    overrides.pop("dry_run_vnpu")
    if not dry_run_vnpu:
        exec_agent(_source(overrides))  # the runner reads the config file and checks the settings
    _, settings = _settings(overrides)
    from ascend_agent.process import print_vnpu_plan

    try:
        code = asyncio.run(print_vnpu_plan(settings))
    except ConfigError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    raise typer.Exit(code)


@app.command("list", cls=GroupedCommand, short_help="Print the chips, their vNPUs and the pods holding them.")
def list_chips(
    backend: Backend = None,
    config: ConfigFile = None,
    host_root: HostRoot = None,
    dev_root: DevRoot = None,
    sys_root: SysRoot = None,
    npu_smi: NpuSmi = None,
    npu_smi_timeout: NpuSmiTimeout = None,
    hccn_tool: HccnTool = None,
    replicas: Replicas = None,
    fake_chips: FakeChips = None,
    fake_model: FakeModel = None,
    fake_state: FakeState = None,
    fake_vnpus: FakeVnpus = None,
    fake_training: FakeTraining = None,
    pod_resources_socket: PodResourcesSocket = None,
    kubeconfig: Kubeconfig = None,
    node_name: NodeName = None,
    volcano: Volcano = None,
    metrics_address: MetricsAddress = None,
    json_output: Json = False,
) -> None:
    """Print the chips the backend sees, their vNPUs under them, and the pod holding each (the kubelet's
    PodResources socket; with --volcano on the chips the pods' marks say were mounted). The running agent,
    asked at its --metrics-address, adds what only it knows: the flap hold, whether npu-smi is down and which
    chips are network-unhealthy.
    Exit 1 when no chip can be listed because of a problem (npu-smi fails, no device files)."""
    overrides = dict(locals())
    overrides.pop("json_output")
    _, settings = _settings(overrides)
    from ascend_agent.cli.listing import chip_rows, gather, print_table

    try:
        inventory, holders, holders_problem, agent = asyncio.run(gather(settings))
    except ConfigError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    if not inventory.chips and inventory.problems:
        if json_output:
            print("[]")
        for problem in inventory.problems:
            print(f"ascend-agent: {problem}", file=sys.stderr)
        raise typer.Exit(EXIT_FAILURE)
    claim_driver = settings.dra_driver_name if settings.kubelet_api == DRA_API else None
    rows = chip_rows(inventory, holders, settings.replicas, agent, claim_driver)
    if json_output:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows)
    # --json says "no agent" as held null on each chip; a person reading the table gets the line.
    agent_problems = [agent] if isinstance(agent, str) and rows and not json_output else []
    if not isinstance(agent, str) and agent.npu_smi_down:
        agent_problems.append(f"the agent on {agent.address} sees npu-smi down: {agent.npu_smi_down}")
    for problem in (*inventory.problems, *([holders_problem] if holders_problem else []), *agent_problems):
        print(f"ascend-agent: {problem}", file=sys.stderr)


@app.command(cls=GroupedCommand, short_help="Check this node in order; exit 1 if a check failed.")
def doctor(
    config: ConfigFile = None,
    host_root: HostRoot = None,
    dev_root: DevRoot = None,
    sys_root: SysRoot = None,
    npu_smi: NpuSmi = None,
    npu_smi_timeout: NpuSmiTimeout = None,
    hccn_tool: HccnTool = None,
    kubelet_dir: KubeletDir = None,
    registration: Registration = None,
    plugin_dir: PluginDir = None,
    metrics_address: MetricsAddress = None,
    daemonset_name: DaemonSetName = None,
    daemonset_namespace: DaemonSetNamespace = naming.DAEMONSET_NAMESPACE,
    pod_resources_socket: PodResourcesSocket = None,
    kubeconfig: Kubeconfig = None,
    node_name: NodeName = None,
    volcano: Volcano = None,
    kubelet_api: KubeletApi = None,
    dra_driver_name: DraDriverName = None,
    json_output: Json = False,
) -> None:
    """Check this node in order: device files, driver, npu-smi, kubelet, agent. Exit 1 if any failed."""
    overrides = dict(locals())
    for option in ("json_output", "daemonset_name", "daemonset_namespace"):
        overrides.pop(option)
    _, settings = _settings(overrides)
    from ascend_agent.doctor import AgentDaemonSet, as_json, render, run_checks

    checks = asyncio.run(run_checks(settings, AgentDaemonSet(daemonset_name or "", daemonset_namespace)))
    print(as_json(checks) if json_output else render(checks))
    raise typer.Exit(EXIT_FAILURE if any(check.ok is False for check in checks) else 0)


# `ranktable` reads one pod; an API server that does not answer costs at most this.
_RANKTABLE_API_TIMEOUT = 5.0


@app.command(cls=GroupedCommand, short_help="Print the hccl.json entries this node gives a pod.")
def ranktable(
    pod: Annotated[
        str, typer.Option("--pod", help="The pod, NAMESPACE/NAME, placed on this node.", show_default=False)
    ] = "",
    table_version: Annotated[
        str,
        typer.Option(
            "--version",
            help=with_default(
                "hccl.json version, 1.0 or 1.2.",
                "1.2 for A3 super-pod jobs (the pod's accelerator-type, sp-block), else 1.0",
            ),
            show_default=False,
        ),
    ] = "",
    sp_block: Annotated[
        int | None,
        typer.Option(
            "--sp-block",
            min=0,
            help=with_default(
                "The job's sp-block (v1.2 logical super pods).", "the pod's sp-block annotation, else none"
            ),
            show_default=False,
        ),
    ] = None,
    config: ConfigFile = None,
    kubeconfig: Kubeconfig = None,
    node_name: NodeName = None,
    pod_resources_socket: PodResourcesSocket = None,
    backend: Backend = None,
    host_root: HostRoot = None,
    dev_root: DevRoot = None,
    sys_root: SysRoot = None,
    npu_smi: NpuSmi = None,
    npu_smi_timeout: NpuSmiTimeout = None,
    hccn_tool: HccnTool = None,
    replicas: Replicas = None,
    dra_driver_name: DraDriverName = None,
    fake_chips: FakeChips = None,
    fake_model: FakeModel = None,
    fake_state: FakeState = None,
    fake_vnpus: FakeVnpus = None,
    fake_training: FakeTraining = None,
) -> None:
    """Print the hccl.json (rank table) entries this node contributes for a pod, as ascend-operator makes
    them from the pod's ascend-910-configuration annotation, hccl/rankIndex and IP. A pod without that
    annotation (placed by another scheduler than Volcano, or holding chips through a DRA claim) gets the
    entries of the chips the kubelet's PodResources says it holds, as the backend finds them. Exit 1 when the
    pod is missing, on another node, or cannot be in a rank table (the line says why)."""
    overrides = dict(locals())
    for option in ("pod", "table_version", "sp_block"):
        overrides.pop(option)
    from ascend_agent.echo import cut
    from ascend_agent.kube_names import is_dns_label, is_dns_subdomain

    namespace, _, name = pod.partition("/")
    if not is_dns_label(namespace) or not is_dns_subdomain(name):
        raise _fail(
            f"--pod needs NAMESPACE/NAME, a namespace (a DNS label) and a pod's name (a DNS subdomain), got "
            f"{cut(pod)!r}",
            EXIT_USAGE,
        )
    if table_version not in ("", "1.0", "1.2"):
        raise _fail(f"--version is 1.0 or 1.2, got {cut(table_version)!r}", EXIT_USAGE)
    _, settings = _settings(overrides)
    # The client's own warnings (an API server refusing) would repeat the one line the failure ends with.
    logging.getLogger("ascend_agent").addHandler(logging.NullHandler())
    from ascend_agent.cli.held import held_chips
    from ascend_agent.cluster import pod_rank_table
    from ascend_agent.cluster.ranktable import RankTableError, gaps, render

    held = partial(held_chips, settings)
    try:
        table = asyncio.run(
            pod_rank_table(
                settings, namespace, name, table_version or None, sp_block, _RANKTABLE_API_TIMEOUT, held
            )
        )
    except RankTableError as exc:
        raise _fail(str(exc), EXIT_FAILURE) from None
    except ConfigError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    print(render(table))
    for gap in gaps(table):
        print(f"ascend-agent: pod {pod}: {gap}", file=sys.stderr)


@app.command("kubelet-sim", cls=GroupedCommand, short_help="A kubelet stand-in for local development.")
def kubelet_sim(
    kubelet_dir: Annotated[
        Path | None,
        typer.Option(
            "--kubelet-dir",
            help="Required: a scratch directory to serve kubelet.sock in (never a live kubelet's).",
        ),
    ] = None,
    allocate: Annotated[
        int, typer.Option("--allocate", help="After the first device list, allocate N chips.")
    ] = 1,
) -> None:
    """A kubelet stand-in for local development: serves Registration, dials back, prints what it sees."""
    if kubelet_dir is None:
        raise _fail(
            "kubelet-sim needs --kubelet-dir DIR, a scratch directory (it has no default)", EXIT_USAGE
        )
    from ascend_agent.kubelet.sim import run_simulator

    try:
        code = asyncio.run(run_simulator(kubelet_dir, allocate=allocate))
    except ConfigError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    raise typer.Exit(code)


@app.command()
def version() -> None:
    """Print the version."""
    print(f"ascend-agent {__version__}")


def main() -> None:
    app()
