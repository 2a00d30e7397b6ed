"""The command line: ``ascend-agent run | list | doctor | kubelet-sim | version``.

Every flag is also read from ``ASCEND_AGENT_<NAME>``; a YAML file given with ``--config`` sits under both.
Exit status: 0 after SIGTERM/SIGINT, 2 for bad usage or configuration (one line on stderr), 1 otherwise.
Commands import what they need when they run, so ``version`` and ``--help`` stay fast.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from click.core import ParameterSource

from ascend_agent import __version__, naming
from ascend_agent.config import DEFAULT_POD_RESOURCES_SOCKET, DRA_API, ConfigError, Settings, SettingsSource
from ascend_agent.stopping import catch_early

if TYPE_CHECKING:
    from ascend_agent.chipstate import AgentView
    from ascend_agent.model import Chip, Inventory
    from ascend_agent.podresources import Holder

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Help text is rich markup: a literal [ is written \[.
    rich_markup_mode="rich",
    help="Kubernetes device plugin for Huawei Ascend NPUs.",
)

EXIT_USAGE = 2
EXIT_FAILURE = 1


_DEFAULTS = Settings()


def _option(*names: str, env: str, help: str, unset: str | None = None, **kwargs: Any) -> Any:
    """A flag that is also ``ASCEND_AGENT_<env>``; ``--help`` shows the default from :class:`Settings`, or
    ``unset``, which says what happens when a setting whose default is None is not given."""
    setting = names[0].split("/")[0].removeprefix("--").replace("-", "_")
    default = getattr(_DEFAULTS, setting, None)
    shown = unset if default is None else str(default)
    assert shown is not None, f"{names[0]}: say what an unset value means"
    return typer.Option(
        *names,
        envvar=f"ASCEND_AGENT_{env}",
        help=f"{help} \\[default: {shown}]",
        show_default=False,
        **kwargs,
    )


Backend = Annotated[str | None, _option("--backend", env="BACKEND", help="devfs (real chips) or fake.")]
KubeletDir = Annotated[
    Path | None,
    _option("--kubelet-dir", env="KUBELET_DIR", help="The kubelet's device plugin directory."),
]
Registration = Annotated[
    str | None,
    _option(
        "--registration",
        env="REGISTRATION",
        help="kubelet (Register on kubelet.sock) or plugin-watcher (the kubelet's plugins registry).",
    ),
]
PluginsRegistryDir = Annotated[
    Path | None,
    _option(
        "--plugins-registry-dir",
        env="PLUGINS_REGISTRY_DIR",
        help="The kubelet's plugin-watcher directory.",
        unset="<kubelet-dir>/../plugins_registry",
    ),
]
PluginDir = Annotated[
    Path | None,
    _option(
        "--plugin-dir",
        env="PLUGIN_DIR",
        help="The agent's lock and plugin-watcher endpoints.",
        unset="<kubelet-dir>/../plugins/ascend-agent",
    ),
]
ServeTimeout = Annotated[
    float | None,
    _option(
        "--serve-timeout",
        env="SERVE_TIMEOUT",
        help="Seconds serving may keep failing (an unusable kubelet directory) before exit 1.",
    ),
]
ConfigFile = Annotated[
    Path | None,
    _option(
        "--config",
        env="CONFIG",
        help="YAML config file; keys are the flag names in camelCase.",
        unset="none",
    ),
]
LogLevel = Annotated[str | None, _option("--log-level", env="LOG_LEVEL", help="debug, info, warning, error.")]
LogFormat = Annotated[str | None, _option("--log-format", env="LOG_FORMAT", help="text or json.")]
HostRoot = Annotated[Path | None, _option("--host-root", env="HOST_ROOT", help="Where the host's / is seen.")]
DevRoot = Annotated[
    Path | None, _option("--dev-root", env="DEV_ROOT", help="Device files.", unset="<host-root>/dev")
]
SysRoot = Annotated[
    Path | None, _option("--sys-root", env="SYS_ROOT", help="sysfs.", unset="<host-root>/sys")
]
NpuSmi = Annotated[
    str | None,
    _option(
        "--npu-smi",
        env="NPU_SMI",
        help="The npu-smi executable.",
        unset="npu-smi on PATH, else <host-root>/usr/local/bin/npu-smi",
    ),
]
HccnTool = Annotated[
    str | None,
    _option(
        "--hccn-tool",
        env="HCCN_TOOL",
        help="The hccn_tool executable (the chips' device IPs).",
        unset="hccn_tool on PATH, else <host-root>/usr/local/Ascend/driver/tools/hccn_tool",
    ),
]
NpuSmiTimeout = Annotated[
    float | None,
    _option(
        "--npu-smi-timeout",
        env="NPU_SMI_TIMEOUT",
        help="Seconds before npu-smi is killed; at least 1.",
    ),
]
NetworkHealth = Annotated[
    bool | None,
    _option(
        "--network-health/--no-network-health",
        env="NETWORK_HEALTH",
        help="Read each chip's RoCE link state (hccn_tool) every health interval: -NetworkUnhealthy.",
    ),
]
LinkDownDebounce = Annotated[
    float | None,
    _option(
        "--link-down-debounce",
        env="LINK_DOWN_DEBOUNCE",
        help="Seconds a chip's RoCE link must stay DOWN before the chip is network-unhealthy; 0: at once.",
    ),
]
HealthInterval = Annotated[
    float | None,
    _option("--health-interval", env="HEALTH_INTERVAL", help="Seconds between health queries; at least 1."),
]
HealthThreshold = Annotated[
    int | None,
    _option(
        "--health-failure-threshold",
        env="HEALTH_FAILURE_THRESHOLD",
        help="Failed health queries in a row before every chip is Unhealthy.",
    ),
]
FlapThreshold = Annotated[
    int | None,
    _option(
        "--flap-threshold",
        env="FLAP_THRESHOLD",
        help="Times a chip may turn Unhealthy within --flap-window before it is held Unhealthy; 0: off.",
    ),
]
FlapWindow = Annotated[
    float | None,
    _option("--flap-window", env="FLAP_WINDOW", help="Seconds in which the turns are counted."),
]
FlapQuiet = Annotated[
    float | None,
    _option(
        "--flap-quiet",
        env="FLAP_QUIET",
        help="Seconds a held chip must stay Healthy before it is Healthy again.",
    ),
]
Mode = Annotated[
    str | None, _option("--mode", env="MODE", help="plain or ascend-runtime: what Allocate hands over.")
]
Replicas = Annotated[int | None, _option("--replicas", env="REPLICAS", help="Advertise each chip N times.")]
CdiSpecDir = Annotated[
    Path | None,
    _option("--cdi-spec-dir", env="CDI_SPEC_DIR", help="Write a CDI spec here.", unset="none (no CDI)"),
]
MetricsAddress = Annotated[
    str | None,
    _option(
        "--metrics-address",
        env="METRICS_ADDRESS",
        help="HOST:PORT for /metrics, /healthz, /readyz; empty: off.",
    ),
]
FakeChips = Annotated[int | None, _option("--fake-chips", env="FAKE_CHIPS", help="Fake backend: chips.")]
FakeModel = Annotated[str | None, _option("--fake-model", env="FAKE_MODEL", help="Fake backend: model.")]
FakeState = Annotated[
    Path | None,
    _option(
        "--fake-state",
        env="FAKE_STATE",
        help='Fake backend: {"unhealthy": [..], "absent": [..]}, watched.',
        unset="none (every chip healthy)",
    ),
]
FakeVnpus = Annotated[
    str | None,
    _option(
        "--fake-vnpus",
        env="FAKE_VNPUS",
        help="Fake backend: vNPUs as PHYS_ID:TEMPLATE items, e.g. 0:vir02,0:vir02,1:vir04.",
        unset="none",
    ),
]
FakeTraining = Annotated[
    bool | None,
    _option(
        "--fake-training/--no-fake-training",
        env="FAKE_TRAINING",
        help="Fake backend: synthetic device IPs (198.18.0.0/15) and, on A3, vNIC IPs and a super pod.",
        unset="off",
    ),
]
HotReset = Annotated[
    str | None,
    _option(
        "--hot-reset",
        env="HOT_RESET",
        help="off, idle (reset a chip whose fault a reset clears once its reset group is idle) or dry-run "
        "(say what would be reset, run nothing).",
    ),
]
HotResetIdle = Annotated[
    float | None,
    _option(
        "--hot-reset-idle",
        env="HOT_RESET_IDLE",
        help="Seconds the reset group must have had no pod and no process before the reset.",
    ),
]
HotResetTimeout = Annotated[
    float | None,
    _option(
        "--hot-reset-timeout",
        env="HOT_RESET_TIMEOUT",
        help="Seconds npu-smi set -t reset may take before it is killed and the reset counts as failed.",
    ),
]
HotResetRecover = Annotated[
    float | None,
    _option(
        "--hot-reset-recover",
        env="HOT_RESET_RECOVER",
        help="Seconds a reset chip has to answer healthy before the reset counts as failed.",
    ),
]
HotResetLimit = Annotated[
    int | None,
    _option("--hot-reset-limit", env="HOT_RESET_LIMIT", help="Resets per chip within --hot-reset-window."),
]
HotResetWindow = Annotated[
    float | None,
    _option("--hot-reset-window", env="HOT_RESET_WINDOW", help="Seconds in which the resets are counted."),
]
DryRunVnpu = Annotated[
    bool,
    typer.Option(
        "--dry-run-vnpu",
        help="Print the npu-smi commands the vnpu: layout needs, run none, and exit. \\[default: off]",
    ),
]
Cluster = Annotated[
    bool | None,
    _option(
        "--cluster/--no-cluster",
        env="CLUSTER",
        help="Node labels and Events through the Kubernetes API; off without credentials.",
    ),
]
Kubeconfig = Annotated[
    Path | None,
    _option(
        "--kubeconfig",
        env="KUBECONFIG",
        help="kubeconfig for the API server.",
        unset="the pod's service account, else $KUBECONFIG",
    ),
]
NodeName = Annotated[
    str | None,
    _option(
        "--node-name", env="NODE_NAME", help="This node's Node object.", unset="$NODE_NAME, else the hostname"
    ),
]
PodResourcesSocket = Annotated[
    Path | None,
    _option(
        "--pod-resources-socket",
        env="POD_RESOURCES_SOCKET",
        help="The kubelet's PodResources socket: which pod holds which chip.",
    ),
]
DeviceInfo = Annotated[
    bool | None,
    _option(
        "--device-info/--no-device-info",
        env="DEVICE_INFO",
        help="Publish the device-info ConfigMap and the baseDeviceInfos annotation Volcano reads.",
        unset="on while the cluster side is",
    ),
]
Volcano = Annotated[
    bool | None,
    _option(
        "--volcano/--no-volcano",
        env="VOLCANO",
        help="Allocate mounts the chips Volcano chose for the pod (its annotations), not the kubelet's.",
        unset="off",
    ),
]
VolcanoSchedulerName = Annotated[
    str | None,
    _option(
        "--volcano-scheduler-name",
        env="VOLCANO_SCHEDULER_NAME",
        help="With --volcano: only the choice on pods this scheduler placed (spec.schedulerName) counts.",
        unset="volcano",
    ),
]
KubeletApi = Annotated[
    str | None,
    _option(
        "--kubelet-api",
        env="KUBELET_API",
        help="device-plugin, or dra: a DRA driver publishing ResourceSlices (needs the cluster side).",
    ),
]
DraDriverName = Annotated[
    str | None, _option("--dra-driver-name", env="DRA_DRIVER_NAME", help="DRA: the driver's name.")
]
DraTaintEffect = Annotated[
    str | None,
    _option(
        "--dra-taint-effect",
        env="DRA_TAINT_EFFECT",
        help="DRA: NoSchedule or NoExecute, the effect of an Unhealthy chip's taint.",
    ),
]
DraCleanup = Annotated[
    bool | None,
    _option(
        "--dra-cleanup/--no-dra-cleanup",
        env="DRA_CLEANUP",
        help="DRA: delete the node's ResourceSlices on exit (only when its chips are going).",
        unset="off",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]
DaemonSetName = Annotated[
    str | None,
    typer.Option(
        "--daemonset-name",
        envvar="ASCEND_AGENT_DAEMONSET_NAME",
        help="The agent's DaemonSet.",
        show_default=f"{naming.DAEMONSET_NAME}; {naming.DRA_DAEMONSET_NAME} with --kubelet-api dra",
    ),
]
DaemonSetNamespace = Annotated[
    str,
    typer.Option(
        "--daemonset-namespace",
        envvar="ASCEND_AGENT_DAEMONSET_NAMESPACE",
        help="The DaemonSet's namespace.",
        show_default=True,
    ),
]


def _fail(message: str, code: int) -> typer.Exit:
    print(f"ascend-agent: {message}", file=sys.stderr)
    return typer.Exit(code)


def _settings(overrides: dict[str, Any]) -> tuple[SettingsSource, Settings]:
    config_file = overrides.pop("config", None)
    context = click.get_current_context()
    from_environment = frozenset(
        name for name in overrides if context.get_parameter_source(name) is ParameterSource.ENVIRONMENT
    )
    source = SettingsSource(overrides=overrides, config_file=config_file, from_environment=from_environment)
    try:
        return source, source.load()
    except ConfigError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None


@app.command()
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
    source, settings = _settings(overrides)
    from ascend_agent.process import print_vnpu_plan, run_agent

    try:
        code = asyncio.run(print_vnpu_plan(settings) if dry_run_vnpu else run_agent(source, settings))
    except ConfigError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    raise typer.Exit(code)


# `list --volcano` reads the node's pods once; an API server that does not answer costs at most this.
_LIST_API_TIMEOUT = 5.0


@app.command("list")
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
    from ascend_agent.backends import discover_once
    from ascend_agent.chipstate import ask_agent
    from ascend_agent.podresources import Holders, PodResourcesError, list_holders

    async def discover() -> tuple[Inventory, Holders, str | None, AgentView | str]:
        inventory, holders, problem = await with_holders()
        return inventory, holders, problem, await ask_agent(settings.metrics_address)

    async def with_holders() -> tuple[Inventory, Holders, str | None]:
        inventory = await discover_once(settings)
        socket = settings.pod_resources_socket
        if socket == DEFAULT_POD_RESOURCES_SOCKET and not socket.exists():
            return inventory, Holders(), None  # not on a node (or not mounted): say nothing unless asked
        try:
            holders = await list_holders(settings.pod_resources_socket)
        except PodResourcesError as exc:
            return inventory, Holders(), f"cannot tell which pod holds which chip: {exc}"
        if not settings.volcano:
            return inventory, holders, None
        from ascend_agent.cluster import on_mounted_chips

        holders, problem = await on_mounted_chips(settings, holders, _LIST_API_TIMEOUT)
        return inventory, holders, f"holders by the kubelet's IDs: {problem}" if problem else None

    try:
        inventory, holders, holders_problem, agent = asyncio.run(discover())
    except ConfigError as exc:
        raise _fail(str(exc), EXIT_USAGE) from None
    if not inventory.chips and inventory.problems:
        if json_output:
            print("[]")
        for problem in inventory.problems:
            print(f"ascend-agent: {problem}", file=sys.stderr)
        raise typer.Exit(EXIT_FAILURE)

    def held_by(chip: Chip, replicas: int) -> Sequence[Holder]:
        """As a DRA driver, the holders of the claims that gave the chip; else of its device IDs."""
        if settings.kubelet_api == DRA_API:
            return holders.of_claimed(settings.dra_driver_name, chip)
        return holders.of(chip, replicas)

    rows = [
        {
            "id": chip.device_id,
            "resource": chip.resource,
            "health": chip.health.value,
            "reason": chip.reason,
            "model": chip.model,
            "phys_id": chip.phys_id,
            "device": chip.device_path,
            "bus_id": chip.bus_id,
            "numa_node": chip.numa_node,
            "npu_id": chip.npu_id,
            "fault_class": chip.fault_class.huawei if chip.fault_class is not None else None,
            "faults": [
                {
                    "code": fault.code,
                    "text": fault.text,
                    "class": fault.fault_class.huawei if fault.fault_class is not None else None,
                }
                for fault in chip.faults
            ],
            **_training_row(chip),
            "holders": _holder_rows(held_by(chip, settings.replicas)),
            "vnpus": [
                _vnpu_row(part, _holder_rows(held_by(part, 1)))
                for part in inventory.vnpus
                if part.phys_id == chip.phys_id
            ],
        }
        for chip in inventory.chips
    ]
    for row, chip in zip(rows, inventory.chips, strict=True):
        row.update(_agent_fields(chip.device_id, agent))
    if json_output:
        print(json.dumps(rows, indent=2))
    else:
        _print_table(rows)
    # --json says "no agent" as held null on each chip; a person reading the table gets the line.
    agent_problems = [agent] if isinstance(agent, str) and rows and not json_output else []
    if not isinstance(agent, str) and agent.npu_smi_down:
        agent_problems.append(f"the agent on {agent.address} sees npu-smi down: {agent.npu_smi_down}")
    for problem in (*inventory.problems, *([holders_problem] if holders_problem else []), *agent_problems):
        print(f"ascend-agent: {problem}", file=sys.stderr)


def _agent_fields(device: str, agent: AgentView | str) -> dict[str, Any]:
    """What the running agent says of a chip: its health as the kubelet sees it, its hold and why it is
    network-unhealthy; ``held`` and ``network_fault`` are None when no agent could be asked (this process
    cannot know either)."""
    state = None if isinstance(agent, str) else agent.chips.get(device)
    if state is None:
        return {"held": None, "held_why": "", "held_until": None, "network_fault": None}
    return {
        "health": state.health,
        "reason": state.reason,
        "held": state.held,
        "held_why": state.held_why,
        "held_until": state.held_until,
        "network_fault": state.network_fault,
    }


def _holder_rows(holders: Sequence[Holder]) -> list[dict[str, str]]:
    return [
        {
            "namespace": h.namespace,
            "pod": h.pod,
            "container": h.container,
            **({"claim": h.claim} if h.claim else {}),
        }
        for h in holders
    ]


def _training_row(chip: Chip) -> dict[str, Any]:
    """A chip's device IP, vNIC IP and super-pod identity (A3), None where it has none."""
    super_pod = chip.super_pod
    return {
        "device_ip": chip.device_ip,
        "vnic_ip": chip.vnic_ip,
        "super_pod": None
        if super_pod is None
        else {
            "super_pod_id": super_pod.super_pod_id,
            "server_index": super_pod.server_index,
            "sdid": super_pod.sdid,
            "size": super_pod.size,
        },
    }


def _vnpu_row(part: Chip, holders: list[dict[str, str]]) -> dict[str, Any]:
    assert part.vnpu is not None
    return {
        "id": part.device_id,
        "resource": part.resource,
        "health": part.health.value,
        "reason": part.reason,
        "vnpu_id": part.vnpu.vnpu_id,
        "template": part.vnpu.template,
        "aicore": part.vnpu.aicore,
        "memory_gb": part.vnpu.memory_gb,
        "device": part.device_path,
        "device_ip": part.rank_ip,
        "container_id": part.vnpu.container_id if part.vnpu.in_container else None,
        "holders": holders,
    }


def _print_table(rows: list[dict[str, Any]]) -> None:
    """One line per chip; a chip's vNPUs on lines under it, with their template, AI cores and memory."""
    if not rows:
        print("no chips found")
        return
    columns = ("id", "model", "health", "held", "bus_id", "numa_node", "resource", "holder", "reason")
    lines = []
    for row in rows:
        lines.append({**row, "resource": "vNPUs below"} if row["vnpus"] else row)
        for part in row["vnpus"]:
            cores = "?" if part["aicore"] is None else part["aicore"]
            memory = "?" if part["memory_gb"] is None else part["memory_gb"]
            lines.append(
                {
                    "id": f"  {part['id']}",
                    "model": f"{part['template']}: {cores} AI cores, {memory} GB",
                    "health": part["health"],
                    "held": None,
                    "bus_id": None,
                    "numa_node": None,
                    "resource": part["resource"],
                    "holders": part["holders"],
                    "reason": part["reason"],
                }
            )
    cells = [[_cell(row, c) for c in columns] for row in lines]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    for line in [list(columns), *cells]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())


def _cell(row: dict[str, Any], column: str) -> str:
    if column == "held":
        held = row.get("held")
        if held is None:
            return "?" if "held_until" in row else "-"
        return f"until {row['held_until'] or 'quiet'}" if held else "no"
    if column == "holder":
        return (
            ",".join(
                f"{h['namespace']}/{h['pod']}/{h['container']}"
                + (f" (claim {h['claim']})" if "claim" in h else "")
                for h in row["holders"]
            )
            or "-"
        )
    if column == "reason" and row.get("network_fault"):
        return "; ".join(
            [*([row["reason"]] if row["reason"] else []), f"network-unhealthy: {row['network_fault']}"]
        )
    return "-" if row[column] is None else str(row[column])


@app.command()
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


@app.command()
def ranktable(
    pod: Annotated[
        str, typer.Option("--pod", help="The pod, NAMESPACE/NAME, placed on this node.", show_default=False)
    ] = "",
    table_version: Annotated[
        str,
        typer.Option(
            "--version",
            help="hccl.json version, 1.0 or 1.2.",
            show_default="1.2 for A3 super-pod jobs (the pod's accelerator-type, sp-block), else 1.0",
        ),
    ] = "",
    sp_block: Annotated[
        int | None,
        typer.Option(
            "--sp-block",
            min=0,
            help="The job's sp-block (v1.2 logical super pods).",
            show_default="the pod's sp-block annotation, else none",
        ),
    ] = None,
    config: ConfigFile = None,
    kubeconfig: Kubeconfig = None,
    node_name: NodeName = None,
) -> None:
    """Print the hccl.json (rank table) entries this node contributes for a pod, as ascend-operator makes
    them from the pod's ascend-910-configuration annotation, hccl/rankIndex and IP. Exit 1 when the pod is
    missing, on another node, or cannot be in a rank table (the line says why)."""
    namespace, _, name = pod.partition("/")
    if not namespace or not name or "/" in name:
        raise _fail(f"--pod needs NAMESPACE/NAME, got {pod!r}", EXIT_USAGE)
    if table_version not in ("", "1.0", "1.2"):
        raise _fail(f"--version is 1.0 or 1.2, got {table_version!r}", EXIT_USAGE)
    _, settings = _settings({"config": config, "kubeconfig": kubeconfig, "node_name": node_name})
    # The client's own warnings (an API server refusing) would repeat the one line the failure ends with.
    logging.getLogger("ascend_agent").addHandler(logging.NullHandler())
    from ascend_agent.cluster import pod_rank_table
    from ascend_agent.cluster.ranktable import RankTableError, gaps, render

    try:
        table = asyncio.run(
            pod_rank_table(settings, namespace, name, table_version or None, sp_block, _RANKTABLE_API_TIMEOUT)
        )
    except RankTableError as exc:
        raise _fail(str(exc), EXIT_FAILURE) from None
    print(render(table))
    for gap in gaps(table):
        print(f"ascend-agent: pod {pod}: {gap}", file=sys.stderr)


@app.command("kubelet-sim")
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
    from ascend_agent.sim.kubelet import run_simulator

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
