"""Settings: defaults < YAML config file < environment < flags, validated with one-line messages.

The command line (typer) already folds ``ASCEND_AGENT_<NAME>`` variables into the flag values, so this module
sees two layers: what the command line said (and which of those values came from the environment), and the
file underneath it::

    source = SettingsSource(overrides={"backend": "fake"}, config_file=Path("config.yaml"))
    settings = source.load()          # raises ConfigError with a line naming the file and the key
    effective = source.load_effective()
    str(effective)                    # "backend=fake (flag), kubeletDir=/var/lib/... (default), ..."
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ascend_agent.faultclass import HUAWEI_NAMES
from ascend_agent.model import is_chip_id
from ascend_agent.naming import NAMING_SCHEMES
from ascend_agent.setting_values import (
    Check,
    accepting,
    boolean,
    chip_model,
    dns_subdomain,
    file_path,
    non_negative_float,
    non_negative_int,
    one_of,
    optional,
    plain_text,
    positive_float,
    positive_int,
    seconds,
    text_list,
)
from ascend_agent.vnpu_layout import Layout, parse_layout

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_DRIVER_MOUNTS = (
    "/usr/local/Ascend/driver/lib64",
    "/usr/local/Ascend/driver/include",
    "/usr/local/Ascend/driver/version.info",
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/etc/ascend_install.info",
)
# Each health query starts npu-smi, which takes a good part of a second on a busy node: a shorter interval
# would keep it running all the time. A timeout below a second would fail healthy but slow queries.
MIN_HEALTH_INTERVAL = 1.0
MIN_NPU_SMI_TIMEOUT = 1.0
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
# What Allocate hands a container: ``plain`` gives device nodes and driver mounts; ``ascend-runtime`` only the
# environment, which Huawei's container runtime turns into devices and mounts itself.
PLAIN_MODE = "plain"
ASCEND_RUNTIME_MODE = "ascend-runtime"
MODES = (PLAIN_MODE, ASCEND_RUNTIME_MODE)
# How the kubelet learns of our sockets: ``kubelet`` calls Register on kubelet.sock; ``plugin-watcher``
# serves a registration socket in the kubelet's plugins registry, which the kubelet finds and dials itself.
KUBELET_REGISTRATION = "kubelet"
PLUGIN_WATCHER_REGISTRATION = "plugin-watcher"
REGISTRATIONS = (KUBELET_REGISTRATION, PLUGIN_WATCHER_REGISTRATION)
# What the agent is to the kubelet: a device plugin per resource, or a DRA driver (ascend_agent.kubelet.dra).
DEVICE_PLUGIN_API = "device-plugin"
DRA_API = "dra"
KUBELET_APIS = (DEVICE_PLUGIN_API, DRA_API)
DRA_TAINT_EFFECTS = ("NoSchedule", "NoExecute")
# Hot reset (ascend_agent.health.hotreset): off, reset idle groups, or only say what would be reset.
HOT_RESET_OFF = "off"
HOT_RESET_IDLE = "idle"
HOT_RESET_DRY_RUN = "dry-run"
HOT_RESET_MODES = (HOT_RESET_OFF, HOT_RESET_IDLE, HOT_RESET_DRY_RUN)
NO_TAINT = "None"  # a fault class whose chips get no taint
# What faultPolicy says of a code (ascend_agent.health.faults): graded NotHandleFault or SeparateNPU.
HEALTHY = "healthy"
UNHEALTHY = "unhealthy"
VERDICTS = (HEALTHY, UNHEALTHY)


DEFAULT_API_LIST_LIMIT_MIB = 64


class ConfigError(ValueError):
    """Bad usage or configuration: the CLI prints it as one line and exits 2."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the agent can be told. Field names are the flags' (``--fake-chips`` is ``fake_chips``)."""

    backend: str = "devfs"
    kubelet_dir: Path = DEFAULT_KUBELET_DIR
    registration: str = KUBELET_REGISTRATION
    plugins_registry_dir: Path | None = None
    plugin_dir: Path | None = None
    serve_timeout: float = 300.0
    host_root: Path = Path("/")
    dev_root: Path | None = None
    sys_root: Path | None = None
    npu_smi: str | None = None
    npu_smi_timeout: float = 10.0
    # hccn_tool, which reads the chips' device IPs (backends/training.py); None: PATH, then the host's.
    hccn_tool: str | None = None
    # Each chip's RoCE link read every health interval (backends/network.py), and the seconds it must stay
    # DOWN before the chip is network-unhealthy.
    network_health: bool = True
    link_down_debounce: float = 20.0
    health_interval: float = 5.0
    health_failure_threshold: int = 3
    # Chips whose health no source ever confirmed (npu-smi has not answered once, the model from `model:`)
    # count as Healthy from their device files alone; off, they are Unhealthy with their health unknown.
    healthy_without_npu_smi: bool = False
    healthy_states: tuple[str, ...] = ("OK", "Warning")
    # Error codes (or prefixes) -> healthy/unhealthy, asked before the defaults in ascend_agent.health.faults.
    fault_policy: tuple[tuple[str, str], ...] = ()
    flap_threshold: int = 3
    flap_window: float = 600.0
    flap_quiet: float = 600.0
    mode: str = PLAIN_MODE
    driver_mounts: tuple[str, ...] = DEFAULT_DRIVER_MOUNTS
    model: str | None = None
    resource_naming: str = "huawei"
    replicas: int = 1
    # With replicas > 1: advertise <resource>.shared instead, and refuse a container more than one replica.
    rename_shared: bool = False
    fail_requests_greater_than_one: bool = False
    cdi_spec_dir: Path | None = None
    metrics_address: str = "127.0.0.1:9410"
    # The chip series also under Huawei npu-exporter's names (ascend_agent.observability.npu_exporter).
    npu_exporter_metrics: bool = False
    log_format: str = "text"
    log_level: str = "info"
    fake_chips: int = 8
    fake_model: str = "910B4"
    fake_state: Path | None = None
    # The cluster side (ascend_agent.cluster): off with cluster=False, or when no credentials are found.
    cluster: bool = True
    kubeconfig: Path | None = None
    node_name: str | None = None
    pod_resources_socket: Path = DEFAULT_POD_RESOURCES_SOCKET
    # MiB one list of the API server may take, its pages together (an object or a watch event: 4 MiB).
    api_list_limit_mib: int = DEFAULT_API_LIST_LIMIT_MIB
    # The client's rate limit on the API server: requests a second on average (0: no limit), and at once.
    api_qps: float = 5.0
    api_burst: int = 10
    # Volcano (ascend_agent.cluster.deviceinfo, .volcano): the device-info ConfigMap and node annotation, and
    # Allocate answering with the chips Volcano chose.
    device_info: bool = True
    # The node summary kubectl ascend reads (ascend_agent.node_summary), while the cluster side is on.
    node_summary: bool = True
    volcano: bool = False
    # Only the pods this scheduler placed (spec.schedulerName) have their choice of chips taken.
    volcano_scheduler_name: str = "volcano"
    # The DRA driver (kubelet_api="dra"): its name, the effect of its health taints, slices removed at exit.
    kubelet_api: str = DEVICE_PLUGIN_API
    dra_driver_name: str = "npu.huawei.com"
    dra_taint_effect: str = "NoSchedule"
    # Fault class (Huawei's name) -> taint effect (None, NoSchedule, NoExecute), over the defaults in
    # ascend_agent.kubelet.dra.devices.
    dra_fault_taints: tuple[tuple[str, str], ...] = ()
    dra_cleanup: bool = False
    # The vNPUs each chip should hold, by physical id or chip name (``ascend_agent.vnpu_layout``); None:
    # vNPUs are never created or destroyed.
    vnpu: Layout | None = None
    fake_vnpus: Layout | None = None
    # Fake backend: synthetic device IPs (198.18.0.0/15, the benchmarking range) and, on A3, vNIC IPs and a
    # super pod; off: none, as on a node without hccn_tool.
    fake_training: bool = False
    # Hot reset of a chip whose fault a reset clears, once its reset group is idle
    # (ascend_agent.health.hotreset): the seconds the group must be idle, the bound on `npu-smi set -t
    # reset`, the wait for the chip to answer healthy, and at most hot_reset_limit resets per chip within
    # hot_reset_window seconds.
    hot_reset: str = HOT_RESET_OFF
    hot_reset_idle: float = 60.0
    hot_reset_timeout: float = 400.0
    hot_reset_recover: float = 180.0
    hot_reset_limit: int = 3
    hot_reset_window: float = 6 * 3600.0

    @property
    def effective_plugins_registry_dir(self) -> Path:
        """The kubelet's plugin-watcher directory, beside its device-plugins directory by default."""
        return self.plugins_registry_dir or self.kubelet_dir.parent / "plugins_registry"

    @property
    def effective_plugin_dir(self) -> Path:
        """The agent's own directory (its lock, and its endpoints in plugin-watcher mode), which the kubelet's
        start-up never wipes."""
        return self.plugin_dir or self.kubelet_dir.parent / "plugins" / "ascend-agent"

    @property
    def endpoint_dir(self) -> Path:
        """Where the DevicePlugin sockets are served."""
        if self.registration == PLUGIN_WATCHER_REGISTRATION:
            return self.effective_plugin_dir
        return self.kubelet_dir

    @property
    def effective_dev_root(self) -> Path:
        return self.dev_root or self.host_root / "dev"

    @property
    def effective_sys_root(self) -> Path:
        return self.sys_root or self.host_root / "sys"

    @property
    def effective_npu_smi(self) -> str:
        """The npu-smi to run: the flag, else ``npu-smi`` on PATH, else the host's copy."""
        if self.npu_smi:
            return self.npu_smi
        return shutil.which("npu-smi") or str(self.host_root / "usr/local/bin/npu-smi")

    @property
    def effective_hccn_tool(self) -> str:
        """The hccn_tool to run: the flag, else ``hccn_tool`` on PATH, else the host driver's copy."""
        if self.hccn_tool:
            return self.hccn_tool
        return shutil.which("hccn_tool") or str(self.host_root / "usr/local/Ascend/driver/tools/hccn_tool")


def camel_case(name: str) -> str:
    """``fake_chips`` -> ``fakeChips``: the config file's key for a setting."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


# faultPolicy holds codes and prefixes; thousands are a mistake or worse.
MAX_POLICY_ENTRIES = 256
_HEX_PREFIX = re.compile(r"^[0-9A-Fa-f]{1,8}$")


@accepting(
    {
        "type": "object",
        "maxProperties": MAX_POLICY_ENTRIES,
        "propertyNames": {"pattern": _HEX_PREFIX.pattern},
        "additionalProperties": {"enum": list(VERDICTS)},
    }
)
def _fault_policy(value: Any) -> tuple[tuple[str, str], ...]:
    """``{"80E3A203": healthy, "8C": unhealthy}``; YAML reads an all-digit code as a number, meant as text."""
    if isinstance(value, tuple):
        value = dict(value)
    if not isinstance(value, dict):
        raise ValueError(
            'must be a mapping of error codes or prefixes to healthy or unhealthy, e.g. {"8C": unhealthy}'
        )
    if len(value) > MAX_POLICY_ENTRIES:
        raise ValueError(f"has {len(value)} entries; at most {MAX_POLICY_ENTRIES} are accepted")
    policy = []
    for code, verdict in value.items():
        text = str(code) if isinstance(code, int) and not isinstance(code, bool) else code
        if not isinstance(text, str) or not _HEX_PREFIX.match(text):
            raise ValueError(
                f"key {code!r} is not an error code or prefix (1 to 8 hex digits, e.g. 80E3A203)"
            )
        if verdict not in VERDICTS:
            raise ValueError(f"{text}: {verdict!r} must be one of {', '.join(VERDICTS)}")
        policy.append((text.upper(), str(verdict)))
    return tuple(sorted(policy))


@accepting(
    {
        "type": "object",
        "propertyNames": {"enum": list(HUAWEI_NAMES)},
        "additionalProperties": {"enum": [NO_TAINT, *DRA_TAINT_EFFECTS]},
    }
)
def _fault_taints(value: Any) -> tuple[tuple[str, str], ...]:
    """``{SeparateNPU: NoExecute, SubHealthFault: NoSchedule}``: the taint effect of a fault class."""
    if isinstance(value, tuple):
        value = dict(value)
    if not isinstance(value, dict):
        raise ValueError("must be a mapping of fault classes to None, NoSchedule or NoExecute")
    effects = (NO_TAINT, *DRA_TAINT_EFFECTS)
    for name, effect in value.items():
        if name not in HUAWEI_NAMES:
            raise ValueError(f"key {name!r} is not a fault class ({', '.join(HUAWEI_NAMES)})")
        if effect not in effects:
            raise ValueError(f"{name}: {effect!r} must be one of {', '.join(effects)}")
    return tuple(sorted((str(name), str(effect)) for name, effect in value.items()))


# The vnpu: layout: chips (physical ids, names, `dynamic`) to template lists, {dynamic: true} or, for the
# top-level `dynamic`, true or false (vnpu_layout.parse_layout checks the rest).
_LAYOUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {
        "type": ["array", "object", "boolean"],
        "items": {"type": "string"},
        "properties": {"dynamic": {"type": "boolean"}},
        "additionalProperties": False,
    },
}


@accepting({**_LAYOUT_SCHEMA, "type": ["string", "object"]})
def fake_vnpus(value: Any) -> Layout:
    """``"0:vir02,0:vir02,1:vir04"`` (the flag) or ``{"0": [vir02, vir02]}`` (the file): templates by
    physical id."""
    if isinstance(value, str):
        entries: dict[str, list[str]] = {}
        for item in filter(None, (part.strip() for part in value.split(","))):
            phys_id, sep, template = item.partition(":")
            if not sep or not is_chip_id(phys_id.strip()):
                raise ValueError(f"{item!r} must be PHYS_ID:TEMPLATE, e.g. 0:vir02,0:vir02,1:vir04")
            entries.setdefault(phys_id.strip(), []).append(template.strip())
        value = entries
    layout = parse_layout(value)
    for key, _ in layout:
        if not is_chip_id(key):
            raise ValueError(f"{key}: the fake backend's vNPUs are given by physical chip id (0, 1, ...)")
    return layout


_CONVERTERS: dict[str, Check[Any]] = {
    "backend": plain_text,
    "kubelet_dir": file_path,
    "registration": one_of(*REGISTRATIONS),
    "plugins_registry_dir": optional(file_path),
    "plugin_dir": optional(file_path),
    "serve_timeout": seconds(1.0),
    "host_root": file_path,
    "dev_root": optional(file_path),
    "sys_root": optional(file_path),
    "npu_smi": optional(plain_text),
    "npu_smi_timeout": seconds(MIN_NPU_SMI_TIMEOUT),
    "hccn_tool": optional(plain_text),
    "network_health": boolean,
    "link_down_debounce": seconds(0),
    "health_interval": seconds(MIN_HEALTH_INTERVAL),
    "health_failure_threshold": positive_int,
    "healthy_without_npu_smi": boolean,
    "healthy_states": text_list,
    "fault_policy": _fault_policy,
    "flap_threshold": non_negative_int,
    "flap_window": positive_float,
    "flap_quiet": positive_float,
    "mode": one_of(*MODES),
    "driver_mounts": text_list,
    "model": optional(chip_model),
    "resource_naming": one_of(*NAMING_SCHEMES),
    "replicas": positive_int,
    "rename_shared": boolean,
    "fail_requests_greater_than_one": boolean,
    "cdi_spec_dir": optional(file_path),
    "metrics_address": plain_text,
    "npu_exporter_metrics": boolean,
    "log_format": one_of(*LOG_FORMATS),
    "log_level": one_of(*LOG_LEVELS),
    "fake_chips": positive_int,
    "fake_model": chip_model,
    "fake_state": optional(file_path),
    "cluster": boolean,
    "kubeconfig": optional(file_path),
    "node_name": optional(plain_text),
    "pod_resources_socket": file_path,
    "api_list_limit_mib": positive_int,
    "api_qps": non_negative_float,
    "api_burst": positive_int,
    "device_info": boolean,
    "node_summary": boolean,
    "volcano": boolean,
    "volcano_scheduler_name": dns_subdomain,
    "kubelet_api": one_of(*KUBELET_APIS),
    "dra_driver_name": dns_subdomain,
    "dra_taint_effect": one_of(*DRA_TAINT_EFFECTS),
    "dra_fault_taints": _fault_taints,
    "dra_cleanup": boolean,
    "vnpu": optional(Check(parse_layout, _LAYOUT_SCHEMA)),
    "fake_vnpus": optional(fake_vnpus),
    "fake_training": boolean,
    "hot_reset": one_of(*HOT_RESET_MODES),
    "hot_reset_idle": positive_float,
    "hot_reset_timeout": positive_float,
    "hot_reset_recover": positive_float,
    "hot_reset_limit": positive_int,
    "hot_reset_window": positive_float,
}
assert set(_CONVERTERS) == {f.name for f in fields(Settings)}


def decode_utf8(data: bytes, what: str) -> str:
    """``data`` as text; :class:`ConfigError` names ``what`` and the first byte that is not UTF-8::

    decode_utf8(b"a: 1 # \xb2\xe2", "config file c.yaml")
    # ConfigError: config file c.yaml is not UTF-8: byte 0xb2 at offset 7 (line 1); save it as UTF-8
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{what} is not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} (line {line}); "
            "save it as UTF-8"
        ) from None


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings a YAML file sets, by field name; :class:`ConfigError` names the file and the key."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    text = decode_utf8(data, f"config file {path}")
    from ascend_agent.strict_yaml import AliasFound, DuplicateKey, YAMLError, load_document

    try:
        document = load_document(text)
    except AliasFound as found:
        raise ConfigError(
            f"config file {path} uses a YAML alias at line {found.line}; write the value out instead"
        ) from None
    except DuplicateKey as twice:
        raise ConfigError(
            f"config file {path}: {twice.key} is given twice (lines {twice.first} and {twice.again}); "
            "keep one"
        ) from None
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError(f"config file {path} must be a mapping of setting names to values")
    by_key = {camel_case(name): name for name in _CONVERTERS}
    values: dict[str, Any] = {}
    for key, raw in document.items():
        name = by_key.get(str(key))
        if name is None:
            raise ConfigError(f"config file {path}: unknown setting {key!r} ({_nearest_setting(str(key))})")
        try:
            values[name] = _CONVERTERS[name](raw)
        except ValueError as exc:
            raise ConfigError(f"config file {path}: {key} {exc}") from None
    return values


def file_schema() -> dict[str, Any]:
    """The JSON Schema of a config file: every setting under its key, with the type, choices and bounds its
    check declares, and no other key. The Helm chart's values.schema.json holds it under ``config``
    (charts/schema.py writes it there), so that ``helm install`` refuses what the agent would.

    >>> file_schema()["properties"]["logFormat"]
    {'enum': ['text', 'json']}
    """
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            camel_case(field.name): copy.deepcopy(dict(_CONVERTERS[field.name].schema))
            for field in fields(Settings)
        },
    }


def _folded(key: str) -> str:
    """``fake_chips``, ``fake-chips``, ``FakeChips`` -> ``fakechips``: a key as it might have been meant."""
    return key.replace("_", "").replace("-", "").lower()


def _nearest_setting(key: str) -> str:
    """The hint for an unknown key: the setting it is closest to, or how settings are named.

    >>> _nearest_setting("fake_chips"), _nearest_setting("helthInterval"), _nearest_setting("replica")
    ('did you mean fakeChips?', 'did you mean healthInterval?', 'did you mean replicas?')
    >>> _nearest_setting("colour")
    'settings are the flags in camelCase: --kubelet-dir is kubeletDir'
    """
    import difflib  # only a misspelt key needs it

    keys = {_folded(camel_case(name)): camel_case(name) for name in _CONVERTERS}
    nearest = difflib.get_close_matches(_folded(key), keys, n=1, cutoff=0.75)
    if nearest:
        return f"did you mean {keys[nearest[0]]}?"
    return "settings are the flags in camelCase: --kubelet-dir is kubeletDir"


def validate(settings: Settings) -> Settings:
    """Checks beyond one value's type: the metrics address must be HOST:PORT."""
    if settings.metrics_address:
        host, sep, port = settings.metrics_address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(
                f"--metrics-address {settings.metrics_address!r} must be HOST:PORT (or empty to disable)"
            )
    return settings


class Origin(enum.StrEnum):
    """Where a setting's value came from; later ones win."""

    DEFAULT = "default"
    FILE = "file"
    ENV = "env"
    FLAG = "flag"


@dataclass(frozen=True, slots=True)
class EffectiveSettings:
    """The settings and, for each, where its value came from; ``str()`` is one line for the log::

    backend=fake (flag), kubeletDir=/k (env), hostRoot=/ (default), ..., fakeChips=4 (file), ...
    """

    settings: Settings
    origins: Mapping[str, Origin]

    def entries(self) -> list[tuple[str, Any, Origin]]:
        """(camelCase key, value, origin) for every setting, in the order :class:`Settings` declares them."""
        return [
            (camel_case(f.name), getattr(self.settings, f.name), self.origins.get(f.name, Origin.DEFAULT))
            for f in fields(Settings)
        ]

    def as_fields(self) -> dict[str, dict[str, Any]]:
        """``{key: {"value": ..., "from": origin}}``, for a JSON log line's ``settings`` field."""
        return {key: {"value": _plain(value), "from": origin.value} for key, value, origin in self.entries()}

    def __str__(self) -> str:
        return ", ".join(f"{key}={_shown(value)} ({origin})" for key, value, origin in self.entries())


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    return list(value) if isinstance(value, tuple) else value


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if value == "":
        return '""'
    if isinstance(value, tuple) and value and all(_is_layout_entry(item) for item in value):
        return "{" + ", ".join(f"{key}: {_shown(templates)}" for key, templates in value) + "}"
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def _is_layout_entry(item: Any) -> bool:
    """An entry of a vNPU layout: (chip, (template, ...))."""
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], tuple)


@dataclass(frozen=True, slots=True)
class SettingsSource:
    """The command line's values plus the config file: load again to pick up file changes (SIGHUP)."""

    overrides: Mapping[str, Any]
    config_file: Path | None = None
    # The names in ``overrides`` whose values the command line took from ASCEND_AGENT_<NAME>.
    from_environment: frozenset[str] = frozenset()

    def load(self) -> Settings:
        return self.load_effective().settings

    def load_effective(self) -> EffectiveSettings:
        """The settings with the origin of each; :class:`ConfigError` names the file, flag or variable."""
        values = read_config_file(self.config_file) if self.config_file else {}
        origins = dict.fromkeys(values, Origin.FILE)
        for name, value in self.overrides.items():
            if value is None:
                continue
            from_environment = name in self.from_environment
            try:
                values[name] = _CONVERTERS[name](value)
            except ValueError as exc:
                given = f"ASCEND_AGENT_{name.upper()}" if from_environment else f"--{name.replace('_', '-')}"
                raise ConfigError(f"{given} {exc}") from None
            origins[name] = Origin.ENV if from_environment else Origin.FLAG
        return EffectiveSettings(validate(dataclasses.replace(Settings(), **values)), origins)
