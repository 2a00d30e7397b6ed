"""Registration with the kubelet: ``register()`` over kubelet.sock, and the plugin-watcher registration
service that the kubelet's plugin manager calls instead::

    await register(Path("/var/lib/kubelet/device-plugins"), "Ascend910.sock", "huawei.com/Ascend910", options)
    server = BoundedServer([WatcherRegistration("huawei.com/Ascend910", endpoint, on_status)])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from grpclib.exceptions import GRPCError, StreamTerminatedError

from ascend_agent._proto.pluginregistration import (
    InfoRequest,
    PluginInfo,
    RegistrationBase,
    RegistrationStatus,
    RegistrationStatusResponse,
)
from ascend_agent._proto.v1beta1 import DevicePluginOptions, RegisterRequest, RegistrationStub
from ascend_agent.kubelet.deviceplugin.transport import LocalChannel

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
# The kubelet dials back inside Register with a 10 s timeout; give it room to answer.
REGISTER_TIMEOUT = 15.0


class RegistrationError(Exception):
    """Registration failed; the message says why in one line."""


async def register(
    kubelet_dir: Path,
    endpoint: str,
    resource: str,
    options: DevicePluginOptions,
    timeout: float = REGISTER_TIMEOUT,
) -> None:
    """Register ``resource`` served at ``kubelet_dir/endpoint`` with the kubelet; raise RegistrationError."""
    kubelet_socket = kubelet_dir / KUBELET_SOCKET
    if not kubelet_socket.exists():
        raise RegistrationError(f"the kubelet is not listening: {kubelet_socket} does not exist")
    channel = LocalChannel(kubelet_socket)
    request = RegisterRequest(version=API_VERSION, endpoint=endpoint, resource_name=resource, options=options)
    try:
        await RegistrationStub(channel).register(request, timeout=timeout)
    except GRPCError as exc:
        raise RegistrationError(
            f"the kubelet refused the registration: {exc.message or exc.status.name}"
        ) from None
    except TimeoutError:
        raise RegistrationError(f"the kubelet did not answer Register within {timeout:g} s") from None
    except (OSError, StreamTerminatedError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise RegistrationError(f"cannot reach the kubelet at {kubelet_socket}: {reason}") from None
    except Exception as exc:
        # Seen in the soak: grpclib raises AttributeError when a restarting kubelet drops the connection
        # mid-handshake. Whatever it is, the registration must be retried, not lost.
        raise RegistrationError(
            f"the connection to {kubelet_socket} broke: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        channel.close()


class WatcherRegistration(RegistrationBase):
    """``pluginregistration.Registration`` for one resource: GetInfo names the DevicePlugin endpoint (and
    ``on_info()`` runs: the kubelet dials it next), and the kubelet's verdict arrives through
    NotifyRegistrationStatus as ``on_status(registered, error)``. A DRA driver is the same with
    ``plugin_type="DRAPlugin"``, its driver name and its service versions."""

    def __init__(
        self,
        resource: str,
        endpoint: Path,
        on_info: Callable[[], None],
        on_status: Callable[[bool, str], None],
        plugin_type: str = "DevicePlugin",
        versions: Sequence[str] = (API_VERSION,),
    ) -> None:
        self._info = PluginInfo(
            type=plugin_type, name=resource, endpoint=str(endpoint), supported_versions=list(versions)
        )
        self._on_info = on_info
        self._on_status = on_status

    async def get_info(self, message: InfoRequest) -> PluginInfo:
        self._on_info()
        return self._info

    async def notify_registration_status(self, message: RegistrationStatus) -> RegistrationStatusResponse:
        self._on_status(message.plugin_registered, message.error)
        return RegistrationStatusResponse()
