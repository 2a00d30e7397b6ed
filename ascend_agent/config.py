"""Settings: defaults < YAML config file < environment < flags, validated with one-line messages.

The command line (typer) already folds ``ASCEND_AGENT_<NAME>`` variables into the flag values, so this module
sees two layers: what the command line said, and the file underneath it::

    source = SettingsSource(overrides={"backend": "fake"}, config_file=Path("config.yaml"))
    settings = source.load()          # raises ConfigError with a line naming the file and the key
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from ascend_agent.backends._container import MODES, PLAIN_MODE
from ascend_agent.faults import VERDICTS

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_DRIVER_MOUNTS = (
    "/usr/local/Ascend/driver/lib64",
    "/usr/local/Ascend/driver/include",
    "/usr/local/Ascend/driver/version.info",
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/etc/ascend_install.info",
)
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
RESOURCE_NAMINGS = ("huawei", "model")


class ConfigError(ValueError):
    """Bad usage or configuration: the CLI prints it as one line and exits 2."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the agent can be told. Field names are the flags' (``--fake-chips`` is ``fake_chips``)."""

    backend: str = "devfs"
    kubelet_dir: Path = DEFAULT_KUBELET_DIR
    host_root: Path = Path("/")
    dev_root: Path | None = None
    sys_root: Path | None = None
    npu_smi: str | None = None
    npu_smi_timeout: float = 10.0
    health_interval: float = 5.0
    health_failure_threshold: int = 3
    healthy_states: tuple[str, ...] = ("OK", "Warning")
    # Error codes (or prefixes) -> healthy/unhealthy, asked before the defaults in ascend_agent.faults.
    fault_policy: tuple[tuple[str, str], ...] = ()
    flap_threshold: int = 3
    flap_window: float = 600.0
    flap_quiet: float = 600.0
    mode: str = PLAIN_MODE
    driver_mounts: tuple[str, ...] = DEFAULT_DRIVER_MOUNTS
    model: str | None = None
    resource_naming: str = "huawei"
    replicas: int = 1
    cdi_spec_dir: Path | None = None
    metrics_address: str = "127.0.0.1:9410"
    log_format: str = "text"
    log_level: str = "info"
    fake_chips: int = 8
    fake_model: str = "910B4"
    fake_state: Path | None = None

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


def camel_case(name: str) -> str:
    """``fake_chips`` -> ``fakeChips``: the config file's key for a setting."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("must be a whole number of at least 1")
    return value


def _positive_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError("must be a number above 0")
    return float(value)


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be a whole number of at least 0 (0: off)")
    return value


_HEX_PREFIX = re.compile(r"^[0-9A-Fa-f]{1,8}$")


def _fault_policy(value: Any) -> tuple[tuple[str, str], ...]:
    """``{"80E3A203": healthy, "8C": unhealthy}``; YAML reads an all-digit code as a number, meant as text."""
    if isinstance(value, tuple):
        value = dict(value)
    if not isinstance(value, dict):
        raise ValueError(
            'must be a mapping of error codes or prefixes to healthy or unhealthy, e.g. {"8C": unhealthy}'
        )
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


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


def _model(value: Any) -> str:
    """A chip model; YAML reads ``model: 310`` as a number, which is meant as the name."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else _text(value)


def _path(value: Any) -> Path:
    return value if isinstance(value, Path) else Path(_text(value))


def _text_list(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError("must be a list of strings")
    return tuple(value)


def _one_of(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return str(value)

    return check


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else convert(value)


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "backend": _text,
    "kubelet_dir": _path,
    "host_root": _path,
    "dev_root": _optional(_path),
    "sys_root": _optional(_path),
    "npu_smi": _optional(_text),
    "npu_smi_timeout": _positive_float,
    "health_interval": _positive_float,
    "health_failure_threshold": _positive_int,
    "healthy_states": _text_list,
    "fault_policy": _fault_policy,
    "flap_threshold": _non_negative_int,
    "flap_window": _positive_float,
    "flap_quiet": _positive_float,
    "mode": _one_of(*MODES),
    "driver_mounts": _text_list,
    "model": _optional(_model),
    "resource_naming": _one_of(*RESOURCE_NAMINGS),
    "replicas": _positive_int,
    "cdi_spec_dir": _optional(_path),
    "metrics_address": _text,
    "log_format": _one_of(*LOG_FORMATS),
    "log_level": _one_of(*LOG_LEVELS),
    "fake_chips": _positive_int,
    "fake_model": _model,
    "fake_state": _optional(_path),
}
assert set(_CONVERTERS) == {f.name for f in fields(Settings)}


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings a YAML file sets, by field name; :class:`ConfigError` names the file and the key."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
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
            raise ConfigError(
                f"config file {path}: unknown setting {key!r} (settings are camelCase, e.g. fakeChips)"
            )
        try:
            values[name] = _CONVERTERS[name](raw)
        except ValueError as exc:
            raise ConfigError(f"config file {path}: {key} {exc}") from None
    return values


def validate(settings: Settings) -> Settings:
    """Checks beyond one value's type: the metrics address must be HOST:PORT."""
    if settings.metrics_address:
        host, sep, port = settings.metrics_address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(
                f"--metrics-address {settings.metrics_address!r} must be HOST:PORT (or empty to disable)"
            )
    return settings


@dataclass(frozen=True, slots=True)
class SettingsSource:
    """The command line's values plus the config file: load again to pick up file changes (SIGHUP)."""

    overrides: Mapping[str, Any]
    config_file: Path | None = None

    def load(self) -> Settings:
        values = read_config_file(self.config_file) if self.config_file else {}
        for name, value in self.overrides.items():
            if value is None:
                continue
            try:
                values[name] = _CONVERTERS[name](value)
            except ValueError as exc:
                raise ConfigError(f"--{name.replace('_', '-')} {exc}") from None
        return validate(dataclasses.replace(Settings(), **values))
