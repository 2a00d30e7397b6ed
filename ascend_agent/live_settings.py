"""Which settings a config reload applies live, and what else a change means: a new backend for any setting
the agent does not apply itself; every resource served again when where or how resources are served changed;
a warning for the settings that take effect at the next start only. And the configuration line logged at
start and after each reload::

    change = SettingsChange(running, loaded)
    change.changed              # ("fake_chips", "replicas")
    change.new_backend, change.serve_again
    change.warn()               # one line per group of settings that waits for a restart
"""

from __future__ import annotations

import logging
from dataclasses import fields

from ascend_agent.config import EffectiveSettings, Settings
from ascend_agent.observability import log_fields
from ascend_agent.vnpu_layout import dynamic_entries

log = logging.getLogger(__name__)

# The cluster side is set up once, at start.
_CLUSTER_SETTINGS = ("cluster", "kubeconfig", "node_name", "api_list_limit_mib", "api_qps", "api_burst",
                     "volcano_scheduler_name", "node_summary")  # fmt: skip
# Device plugin or DRA driver, and the DRA driver's settings: chosen once, at start.
_KUBELET_API_SETTINGS = (
    "kubelet_api",
    "dra_driver_name",
    "dra_taint_effect",
    "dra_fault_taints",
    "dra_cleanup",
)
# The hot reset's limits, applied by it live (hotReset itself starts a new backend, which reads more then).
_HOT_RESET_SETTINGS = ("hot_reset_idle", "hot_reset_timeout", "hot_reset_recover", "hot_reset_limit",
                       "hot_reset_window")  # fmt: skip
# Settings the agent applies itself; a change to any other one means a new backend.
_AGENT_SETTINGS = frozenset(
    {
        "kubelet_dir",
        "registration",
        "plugins_registry_dir",
        "plugin_dir",
        "replicas",
        "rename_shared",
        "fail_requests_greater_than_one",
        "flap_threshold",
        "flap_window",
        "flap_quiet",
        "fault_policy",
        "serve_timeout",
        "cdi_spec_dir",
        "metrics_address",
        "npu_exporter_metrics",
        "log_level",
        "log_format",
        "vnpu",
        *_HOT_RESET_SETTINGS,
        *_CLUSTER_SETTINGS,
        "pod_resources_socket",
        *_KUBELET_API_SETTINGS,
    }
)
# Settings that decide where and how each resource is served: a change re-serves every resource.
_SERVING_SETTINGS = frozenset({"kubelet_dir", "registration", "plugins_registry_dir", "plugin_dir"})


class SettingsChange:
    """From the ``running`` settings to the ``loaded`` ones."""

    def __init__(self, running: Settings, loaded: Settings) -> None:
        self.running = running
        self.loaded = loaded
        self.changed = tuple(
            sorted(f.name for f in fields(Settings) if getattr(loaded, f.name) != getattr(running, f.name))
        )

    @property
    def new_backend(self) -> bool:
        """A setting the agent does not apply itself changed: a new backend takes over."""
        return bool(set(self.changed) - _AGENT_SETTINGS)

    @property
    def serve_again(self) -> bool:
        """Where or how resources are served changed: every resource's plugin stops and is served again."""
        return bool(set(self.changed) & _SERVING_SETTINGS)

    def warn(self) -> None:
        """One warning per group of changed settings that takes effect at the next start only."""
        changed = set(self.changed)
        if changed & set(_CLUSTER_SETTINGS):
            log.warning(
                "%s changed: the cluster side takes it at the next start",
                ", ".join(sorted(changed & set(_CLUSTER_SETTINGS))),
            )
        if changed & set(_KUBELET_API_SETTINGS):
            log.warning(
                "%s changed: device plugin or DRA driver, and the driver's settings, apply at the next start",
                ", ".join(sorted(changed & set(_KUBELET_API_SETTINGS))),
            )
        if dynamic_entries(self.loaded.vnpu) != dynamic_entries(self.running.vnpu):
            log.warning(
                "vnpu: which chips are dynamic changes when a backend starts: at the next start, or now "
                "where this reload starts one (%s)",
                "it does" if self.new_backend else "it does not",
            )
        if self.loaded.hot_reset != "off" and self.running.hot_reset == "off":
            log.warning("hotReset turned on: the node annotation ResetInfo is written from the next start")
        if self.loaded.effective_plugin_dir != self.running.effective_plugin_dir:
            log.warning(
                "pluginDir changed: the instance lock and the agent's state files (handed-out.json, "
                "hot-reset-budget.json) stay in %s until the agent restarts",
                self.running.effective_plugin_dir,
            )


def log_configuration(effective: EffectiveSettings) -> None:
    """``Configuration: backend=devfs (default), ...``: every setting with where its value came from."""
    log.info("Configuration: %s", effective, extra=log_fields(settings=effective.as_fields()))
