"""The command line's flags, each also ``ASCEND_AGENT_<NAME>``, with its help, the default
:class:`~ascend_agent.config.Settings` gives and the group ``--help`` lists it under: one ``Annotated`` type
per flag, which each command lists::

    def run(backend: Backend = None, kubelet_dir: KubeletDir = None, ...) -> None: ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ascend_agent import naming
from ascend_agent.cli.help_layout import (
    BACKEND,
    CLUSTER,
    DRA,
    GENERAL,
    HEALTH,
    KUBELET,
    OBSERVABILITY,
    TRAINING,
    VNPU,
    VOLCANO,
    with_default,
)
from ascend_agent.config import Settings

_DEFAULTS = Settings()


def _option(*names: str, env: str, help: str, group: str, unset: str | None = None, **kwargs: Any) -> Any:
    """A flag that is also ``ASCEND_AGENT_<env>``, listed under ``group``; ``--help`` shows the default from
    :class:`Settings`, or ``unset``, which says what happens when a setting whose default is None is not
    given."""
    setting = names[0].split("/")[0].removeprefix("--").replace("-", "_")
    default = getattr(_DEFAULTS, setting, None)
    shown = unset if default is None else str(default)
    assert shown is not None, f"{names[0]}: say what an unset value means"
    return typer.Option(
        *names,
        envvar=f"ASCEND_AGENT_{env}",
        help=with_default(help, shown),
        show_default=False,
        rich_help_panel=group,
        **kwargs,
    )


Backend = Annotated[
    str | None, _option("--backend", env="BACKEND", group=BACKEND, help="devfs (real chips) or fake.")
]


KubeletDir = Annotated[
    Path | None,
    _option("--kubelet-dir", env="KUBELET_DIR", group=KUBELET, help="The kubelet's device plugin directory."),
]


Registration = Annotated[
    str | None,
    _option(
        "--registration",
        env="REGISTRATION",
        group=KUBELET,
        help="kubelet (Register on kubelet.sock) or plugin-watcher (the kubelet's plugins registry).",
    ),
]


PluginsRegistryDir = Annotated[
    Path | None,
    _option(
        "--plugins-registry-dir",
        env="PLUGINS_REGISTRY_DIR",
        group=KUBELET,
        help="The kubelet's plugin-watcher directory.",
        unset="<kubelet-dir>/../plugins_registry",
    ),
]


PluginDir = Annotated[
    Path | None,
    _option(
        "--plugin-dir",
        env="PLUGIN_DIR",
        group=KUBELET,
        help="The agent's lock and plugin-watcher endpoints.",
        unset="<kubelet-dir>/../plugins/ascend-agent",
    ),
]


ServeTimeout = Annotated[
    float | None,
    _option(
        "--serve-timeout",
        env="SERVE_TIMEOUT",
        group=KUBELET,
        help="Seconds serving may keep failing (an unusable kubelet directory) before exit 1.",
    ),
]


ConfigFile = Annotated[
    Path | None,
    _option(
        "--config",
        env="CONFIG",
        group=GENERAL,
        help="YAML config file; keys are the flag names in camelCase.",
        unset="none",
    ),
]


LogLevel = Annotated[
    str | None,
    _option("--log-level", env="LOG_LEVEL", group=OBSERVABILITY, help="debug, info, warning, error."),
]


LogFormat = Annotated[
    str | None, _option("--log-format", env="LOG_FORMAT", group=OBSERVABILITY, help="text or json.")
]


HostRoot = Annotated[
    Path | None, _option("--host-root", env="HOST_ROOT", group=BACKEND, help="Where the host's / is seen.")
]


DevRoot = Annotated[
    Path | None,
    _option("--dev-root", env="DEV_ROOT", group=BACKEND, help="Device files.", unset="<host-root>/dev"),
]


SysRoot = Annotated[
    Path | None, _option("--sys-root", env="SYS_ROOT", group=BACKEND, help="sysfs.", unset="<host-root>/sys")
]


NpuSmi = Annotated[
    str | None,
    _option(
        "--npu-smi",
        env="NPU_SMI",
        group=BACKEND,
        help="The npu-smi executable.",
        unset="npu-smi on PATH, else <host-root>/usr/local/bin/npu-smi",
    ),
]


HccnTool = Annotated[
    str | None,
    _option(
        "--hccn-tool",
        env="HCCN_TOOL",
        group=TRAINING,
        help="The hccn_tool executable (the chips' device IPs).",
        unset="hccn_tool on PATH, else tools/hccn_tool in the host's driver "
        "(<host-root>/usr/local/Ascend/driver)",
    ),
]


NpuSmiTimeout = Annotated[
    float | None,
    _option(
        "--npu-smi-timeout",
        env="NPU_SMI_TIMEOUT",
        group=BACKEND,
        help="Seconds before npu-smi is killed; at least 1.",
    ),
]


NetworkHealth = Annotated[
    bool | None,
    _option(
        "--network-health/--no-network-health",
        env="NETWORK_HEALTH",
        group=TRAINING,
        help="Read each chip's RoCE link state (hccn_tool) every health interval: -NetworkUnhealthy.",
    ),
]


LinkDownDebounce = Annotated[
    float | None,
    _option(
        "--link-down-debounce",
        env="LINK_DOWN_DEBOUNCE",
        group=TRAINING,
        help="Seconds a chip's RoCE link must stay DOWN before the chip is network-unhealthy; 0: at once.",
    ),
]


HealthInterval = Annotated[
    float | None,
    _option(
        "--health-interval",
        env="HEALTH_INTERVAL",
        group=HEALTH,
        help="Seconds between health queries; at least 1.",
    ),
]


HealthThreshold = Annotated[
    int | None,
    _option(
        "--health-failure-threshold",
        env="HEALTH_FAILURE_THRESHOLD",
        group=HEALTH,
        help="Failed health queries in a row before every chip is Unhealthy.",
    ),
]


HealthyWithoutNpuSmi = Annotated[
    bool | None,
    _option(
        "--healthy-without-npu-smi/--no-healthy-without-npu-smi",
        env="HEALTHY_WITHOUT_NPU_SMI",
        group=HEALTH,
        help="While npu-smi has not answered once, chips (model: set) are Healthy from their device files.",
    ),
]


FlapThreshold = Annotated[
    int | None,
    _option(
        "--flap-threshold",
        env="FLAP_THRESHOLD",
        group=HEALTH,
        help="Times a chip may turn Unhealthy within --flap-window before it is held Unhealthy; 0: off.",
    ),
]


FlapWindow = Annotated[
    float | None,
    _option("--flap-window", env="FLAP_WINDOW", group=HEALTH, help="Seconds in which the turns are counted."),
]


FlapQuiet = Annotated[
    float | None,
    _option(
        "--flap-quiet",
        env="FLAP_QUIET",
        group=HEALTH,
        help="Seconds a held chip must stay Healthy before it is Healthy again.",
    ),
]


Mode = Annotated[
    str | None,
    _option("--mode", env="MODE", group=KUBELET, help="plain or ascend-runtime: what Allocate hands over."),
]


Replicas = Annotated[
    int | None, _option("--replicas", env="REPLICAS", group=KUBELET, help="Advertise each chip N times.")
]


CdiSpecDir = Annotated[
    Path | None,
    _option(
        "--cdi-spec-dir",
        env="CDI_SPEC_DIR",
        group=KUBELET,
        help="Write a CDI spec here.",
        unset="none (no CDI)",
    ),
]


MetricsAddress = Annotated[
    str | None,
    _option(
        "--metrics-address",
        env="METRICS_ADDRESS",
        group=OBSERVABILITY,
        help="HOST:PORT for /metrics, /healthz, /readyz; empty: off.",
    ),
]


FakeChips = Annotated[
    int | None, _option("--fake-chips", env="FAKE_CHIPS", group=BACKEND, help="Fake backend: chips.")
]


FakeModel = Annotated[
    str | None, _option("--fake-model", env="FAKE_MODEL", group=BACKEND, help="Fake backend: model.")
]


FakeState = Annotated[
    Path | None,
    _option(
        "--fake-state",
        env="FAKE_STATE",
        group=BACKEND,
        help='Fake backend: a JSON file, watched: {"unhealthy": [ids], "absent": [ids], "faults": {"5": '
        '["80E18402"]}, "vnpus": {"0": ["vir02"]}} (physical ids; fault codes as npu-smi prints them).',
        unset="none (every chip healthy)",
    ),
]


FakeVnpus = Annotated[
    str | None,
    _option(
        "--fake-vnpus",
        env="FAKE_VNPUS",
        group=VNPU,
        help="Fake backend: vNPUs as PHYS_ID:TEMPLATE items, e.g. 0:vir02,0:vir02,1:vir04.",
        unset="none",
    ),
]


FakeTraining = Annotated[
    bool | None,
    _option(
        "--fake-training/--no-fake-training",
        env="FAKE_TRAINING",
        group=TRAINING,
        help="Fake backend: synthetic device IPs (198.18.0.0/15) and, on A3, vNIC IPs and a super pod.",
        unset="off",
    ),
]


HotReset = Annotated[
    str | None,
    _option(
        "--hot-reset",
        env="HOT_RESET",
        group=HEALTH,
        help="off, idle (reset a chip whose fault a reset clears once its reset group is idle) or dry-run "
        "(say what would be reset, run nothing).",
    ),
]


HotResetIdle = Annotated[
    float | None,
    _option(
        "--hot-reset-idle",
        env="HOT_RESET_IDLE",
        group=HEALTH,
        help="Seconds the reset group must have had no pod and no process before the reset.",
    ),
]


HotResetTimeout = Annotated[
    float | None,
    _option(
        "--hot-reset-timeout",
        env="HOT_RESET_TIMEOUT",
        group=HEALTH,
        help="Seconds npu-smi set -t reset may take before it is killed and the reset counts as failed.",
    ),
]


HotResetRecover = Annotated[
    float | None,
    _option(
        "--hot-reset-recover",
        env="HOT_RESET_RECOVER",
        group=HEALTH,
        help="Seconds a reset chip has to answer healthy before the reset counts as failed.",
    ),
]


HotResetLimit = Annotated[
    int | None,
    _option(
        "--hot-reset-limit",
        env="HOT_RESET_LIMIT",
        group=HEALTH,
        help="Resets per chip within --hot-reset-window.",
    ),
]


HotResetWindow = Annotated[
    float | None,
    _option(
        "--hot-reset-window",
        env="HOT_RESET_WINDOW",
        group=HEALTH,
        help="Seconds in which the resets are counted.",
    ),
]


DryRunVnpu = Annotated[
    bool,
    typer.Option(
        "--dry-run-vnpu",
        help=with_default("Print the npu-smi commands the vnpu: layout needs, run none, and exit.", "off"),
        rich_help_panel=VNPU,
    ),
]


Cluster = Annotated[
    bool | None,
    _option(
        "--cluster/--no-cluster",
        env="CLUSTER",
        group=CLUSTER,
        help="Node labels and Events through the Kubernetes API; off without credentials.",
    ),
]


Kubeconfig = Annotated[
    Path | None,
    _option(
        "--kubeconfig",
        env="KUBECONFIG",
        group=CLUSTER,
        help="kubeconfig for the API server.",
        unset="the pod's service account, else $KUBECONFIG",
    ),
]


NodeName = Annotated[
    str | None,
    _option(
        "--node-name",
        env="NODE_NAME",
        group=CLUSTER,
        help="This node's Node object.",
        unset="$NODE_NAME, else the hostname",
    ),
]


ApiQps = Annotated[
    float | None,
    _option(
        "--api-qps",
        env="API_QPS",
        group=CLUSTER,
        help="Requests a second to the API server, on average (0: no limit).",
    ),
]


ApiBurst = Annotated[
    int | None,
    _option(
        "--api-burst",
        env="API_BURST",
        group=CLUSTER,
        help="Requests to the API server at once, past --api-qps, after a quiet spell.",
    ),
]


PodResourcesSocket = Annotated[
    Path | None,
    _option(
        "--pod-resources-socket",
        env="POD_RESOURCES_SOCKET",
        group=KUBELET,
        help="The kubelet's PodResources socket: which pod holds which chip.",
    ),
]


DeviceInfo = Annotated[
    bool | None,
    _option(
        "--device-info/--no-device-info",
        env="DEVICE_INFO",
        group=VOLCANO,
        help="Publish the device-info ConfigMap and the baseDeviceInfos annotation Volcano reads.",
        unset="on while the cluster side is",
    ),
]


Volcano = Annotated[
    bool | None,
    _option(
        "--volcano/--no-volcano",
        env="VOLCANO",
        group=VOLCANO,
        help="Allocate mounts the chips Volcano chose for the pod (its annotations), not the kubelet's.",
        unset="off",
    ),
]


VolcanoSchedulerName = Annotated[
    str | None,
    _option(
        "--volcano-scheduler-name",
        env="VOLCANO_SCHEDULER_NAME",
        group=VOLCANO,
        help="With --volcano: only the choice on pods this scheduler placed (spec.schedulerName) counts.",
        unset="volcano",
    ),
]


KubeletApi = Annotated[
    str | None,
    _option(
        "--kubelet-api",
        env="KUBELET_API",
        group=DRA,
        help="device-plugin, or dra: a DRA driver publishing ResourceSlices (needs the cluster side).",
    ),
]


DraDriverName = Annotated[
    str | None, _option("--dra-driver-name", env="DRA_DRIVER_NAME", group=DRA, help="DRA: the driver's name.")
]


DraTaintEffect = Annotated[
    str | None,
    _option(
        "--dra-taint-effect",
        env="DRA_TAINT_EFFECT",
        group=DRA,
        help="DRA: NoSchedule or NoExecute, the effect of an Unhealthy chip's taint.",
    ),
]


DraCleanup = Annotated[
    bool | None,
    _option(
        "--dra-cleanup/--no-dra-cleanup",
        env="DRA_CLEANUP",
        group=DRA,
        help="DRA: delete the node's ResourceSlices on exit (only when its chips are going).",
        unset="off",
    ),
]


Json = Annotated[bool, typer.Option("--json", help="Print JSON for machines.", rich_help_panel=GENERAL)]


DaemonSetName = Annotated[
    str | None,
    typer.Option(
        "--daemonset-name",
        envvar="ASCEND_AGENT_DAEMONSET_NAME",
        help=with_default(
            "The agent's DaemonSet.",
            f"{naming.DAEMONSET_NAME}; {naming.DRA_DAEMONSET_NAME} with --kubelet-api dra",
        ),
        show_default=False,
        rich_help_panel=CLUSTER,
    ),
]


DaemonSetNamespace = Annotated[
    str,
    typer.Option(
        "--daemonset-namespace",
        envvar="ASCEND_AGENT_DAEMONSET_NAMESPACE",
        help=with_default("The DaemonSet's namespace.", naming.DAEMONSET_NAMESPACE),
        show_default=False,
        rich_help_panel=CLUSTER,
    ),
]
