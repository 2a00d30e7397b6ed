"""A claim's opaque configuration for this driver: ``NpuConfig`` (``npu.huawei.com/v1alpha1``).

A DeviceClass or ResourceClaim gives it under ``spec.config[].opaque`` (``spec.devices.config[].opaque`` in a
claim) with ``driver: npu.huawei.com``; the scheduler copies it into the claim's allocation, where the driver
reads it. Both fields are optional; a later entry (the claim's after the class's) wins field by field::

    parameters:
      apiVersion: npu.huawei.com/v1alpha1
      kind: NpuConfig
      runtime: ascend-runtime      # plain | ascend-runtime: what the container gets, as the agent's mode
      template: vir04              # a whole chip only: carve it into this vNPU at prepare

    config = npu_config([class_parameters, claim_parameters])   # NpuConfigError: one line naming the field
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ascend_agent.config import ASCEND_RUNTIME_MODE, MODES, PLAIN_MODE
from ascend_agent.model import ContainerBase

API_VERSION = "npu.huawei.com/v1alpha1"
KIND = "NpuConfig"
_FIELDS = ("apiVersion", "kind", "runtime", "template")
_SHOWN = 60


class NpuConfigError(ValueError):
    """The configuration is not an NpuConfig this driver knows; the message names the field."""


@dataclass(frozen=True, slots=True)
class NpuConfig:
    runtime: str | None = None
    template: str | None = None


def npu_config(parameters: Sequence[Any]) -> NpuConfig:
    """The NpuConfig the parameters add up to, in order (later entries win field by field).

    >>> npu_config([{"apiVersion": API_VERSION, "kind": KIND, "runtime": "plain"},
    ...             {"apiVersion": API_VERSION, "kind": KIND, "template": "vir04"}])
    NpuConfig(runtime='plain', template='vir04')
    >>> try:
    ...     npu_config([{"apiVersion": API_VERSION, "kind": KIND, "runtim": "plain"}])
    ... except NpuConfigError as exc:
    ...     print(exc)
    NpuConfig: unknown field 'runtim' (fields: apiVersion, ...)
    """
    config = NpuConfig()
    for entry in parameters:
        config = _merge(config, _one(entry))
    return config


def _one(entry: Any) -> NpuConfig:
    if not isinstance(entry, Mapping):
        raise NpuConfigError(f"opaque parameters must be an object ({KIND}), not {_shown(entry)}")
    if entry.get("apiVersion") != API_VERSION:
        raise NpuConfigError(
            f"opaque parameters: apiVersion {_shown(entry.get('apiVersion'))}, not {API_VERSION}"
        )
    if entry.get("kind") != KIND:
        raise NpuConfigError(f"opaque parameters: kind {_shown(entry.get('kind'))}, not {KIND}")
    unknown = sorted(str(key) for key in entry if key not in _FIELDS)
    if unknown:
        fields = ", ".join(_FIELDS)
        raise NpuConfigError(f"{KIND}: unknown field {_shown(unknown[0])} (fields: {fields})")
    runtime = entry.get("runtime")
    if runtime is not None and runtime not in MODES:
        raise NpuConfigError(f"{KIND}: runtime {_shown(runtime)} is not one of {', '.join(MODES)}")
    template = entry.get("template")
    if template is not None and (not isinstance(template, str) or not template.startswith("vir")):
        raise NpuConfigError(f"{KIND}: template {_shown(template)} is not a vNPU template name (vir04)")
    return NpuConfig(runtime, template)


def _merge(first: NpuConfig, second: NpuConfig) -> NpuConfig:
    return replace(
        first,
        runtime=second.runtime if second.runtime is not None else first.runtime,
        template=second.template if second.template is not None else first.template,
    )


def _shown(value: Any) -> str:
    return repr(str(value)[:_SHOWN])


def runtime_base(base: ContainerBase, runtime: str | None) -> ContainerBase:
    """What every container of the claim gets besides its chips, in the claim's runtime mode: the node's
    own (``base``) when it gives none or the same; NpuConfigError for ``plain`` on an ``ascend-runtime``
    node, whose management devices and mounts the agent does not gather."""
    if runtime is None or (runtime == PLAIN_MODE) == base.chip_nodes:
        return base
    if runtime == ASCEND_RUNTIME_MODE:
        return ContainerBase(chip_nodes=False, cdi=base.cdi)
    raise NpuConfigError(
        f"{KIND}: runtime plain needs the agent's mode plain (it runs in ascend-runtime mode, and gathers "
        "no management devices); leave runtime out or set mode: plain"
    )
