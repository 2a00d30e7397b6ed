"""Registration with the kubelet over kubelet.sock (the plugin watcher's way is
:mod:`ascend_agent.kubelet.plugin_watcher`)::

    await register(Path("/var/lib/kubelet/device-plugins"), "Ascend910.sock", "huawei.com/Ascend910", options)
"""

from __future__ import annotations

from pathlib import Path

from grpclib.exceptions import GRPCError, StreamTerminatedError

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
