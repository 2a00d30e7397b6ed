"""The kubelet's plugin-watcher registration, for a device plugin in ``registration: plugin-watcher`` mode and
for the DRA driver: the ``pluginregistration.Registration`` service on a socket in the plugins registry, which
the kubelet's plugin manager finds and calls. Loaded only by those two, so a device plugin registering over
kubelet.sock never loads its generated API::

    registration = WatcherRegistration("huawei.com/Ascend910", endpoint, on_info, on_status,
                                       plugin_type="DevicePlugin", versions=("v1beta1",))
    server = BoundedServer([registration])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ascend_agent._proto.pluginregistration import (
    InfoRequest,
    PluginInfo,
    RegistrationBase,
    RegistrationStatus,
    RegistrationStatusResponse,
)


class WatcherRegistration(RegistrationBase):
    """``pluginregistration.Registration`` for one plugin: GetInfo names its endpoint (and ``on_info()`` runs:
    the kubelet dials it next), and the kubelet's verdict arrives through NotifyRegistrationStatus as
    ``on_status(registered, error)``. ``plugin_type`` is ``DevicePlugin`` (``name`` a resource) or
    ``DRAPlugin`` (``name`` a driver); ``versions`` are the plugin service's API versions."""

    def __init__(
        self,
        name: str,
        endpoint: Path,
        on_info: Callable[[], None],
        on_status: Callable[[bool, str], None],
        *,
        plugin_type: str,
        versions: Sequence[str],
    ) -> None:
        self._info = PluginInfo(
            type=plugin_type, name=name, endpoint=str(endpoint), supported_versions=list(versions)
        )
        self._on_info = on_info
        self._on_status = on_status

    async def get_info(self, message: InfoRequest) -> PluginInfo:
        self._on_info()
        return self._info

    async def notify_registration_status(self, message: RegistrationStatus) -> RegistrationStatusResponse:
        self._on_status(message.plugin_registered, message.error)
        return RegistrationStatusResponse()
