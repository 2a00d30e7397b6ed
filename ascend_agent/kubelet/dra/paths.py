"""Where the DRA driver lives on the node: ``dra.sock``, the registration socket, the checkpoint, the CDI
directory; with the pod's UID (``$POD_UID``) the sockets are the pod's own and the calls share a lock. Also
the sockets of the driver's other pods: those a killed pod left (removed), those another instance serves::

    paths = DraPaths.of(settings)          # the pod's UID from $POD_UID, if set
    remove_stale(paths, "npu.huawei.com")  # the sockets of pods gone without removing them
    others_serving(paths, "npu.huawei.com")
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from ascend_agent.config import ConfigError, Settings
from ascend_agent.kubelet.dra.claims import BOOT_ID, valid_uid
from ascend_agent.kubelet.dra.serialize import LOCK_FILE

_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True, slots=True)
class DraPaths:
    """Where the DRA plugin lives on the node."""

    socket: Path  # <kubelet plugins dir>/<driver>/dra.sock (dra-<pod uid>.sock)
    registration: Path  # <plugins registry>/<driver>-reg.sock (<driver>-<pod uid>-reg.sock)
    checkpoint: Path  # beside dra.sock
    cdi_dir: Path
    boot_id: Path  # the kernel's boot id (not per container: the container's /proc has the host's)
    lock: Path | None = None  # with a pod UID: the lock the instances of a rolling update share

    @classmethod
    def of(cls, settings: Settings, boot_id: Path = BOOT_ID, pod: str | None = None) -> DraPaths:
        """Where ``settings`` put the driver, for the pod ``pod`` (by default ``$POD_UID``; "" for none)."""
        driver = settings.dra_driver_name
        plugin_dir = settings.kubelet_dir.parent / "plugins" / driver
        uid = pod_uid() if pod is None else pod
        own = f"-{uid}" if uid else ""
        return cls(
            socket=plugin_dir / f"dra{own}.sock",
            registration=settings.effective_plugins_registry_dir / f"{driver}{own}-reg.sock",
            checkpoint=plugin_dir / "checkpoint.json",
            cdi_dir=settings.cdi_spec_dir or Path("/var/run/cdi"),
            boot_id=boot_id,
            lock=plugin_dir / LOCK_FILE if uid else None,
        )


def remove_stale(paths: DraPaths, driver: str) -> list[str]:
    """Remove the sockets another pod of the driver left behind (killed before it could remove them): each
    ``<driver>-<pod uid>-reg.sock`` but ours that nothing listens on, and its ``dra-<pod uid>.sock``, so the
    kubelet stops dialling them. The UIDs of the pods whose sockets went."""
    gone = []
    for registration, uid in other_pods(paths, driver):
        if _listened_on(registration):
            continue
        for stale in (registration, paths.socket.with_name(f"dra-{uid}.sock")):
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(os.lstat(stale).st_mode):
                    stale.unlink()
        gone.append(uid)
    return gone


def others_serving(paths: DraPaths, driver: str) -> list[Path]:
    """The registration sockets of the driver's other instances that a process listens on: the other pod of
    a rolling update, or an instance without a pod UID."""
    plain = paths.registration.with_name(f"{driver}-reg.sock")
    found = [registration for registration, _ in other_pods(paths, driver) if _listened_on(registration)]
    if plain != paths.registration and _listened_on(plain):
        found.append(plain)
    return found


def other_pods(paths: DraPaths, driver: str) -> list[tuple[Path, str]]:
    """The ``<driver>-<pod uid>-reg.sock`` files in the registry but ours, with their pod UIDs (a UUID, as
    the API server gives a pod: never the socket of a driver whose name only starts with ours)."""
    suffix = "-reg.sock"
    found = []
    with contextlib.suppress(OSError):
        for registration in paths.registration.parent.glob(f"{driver}-*{suffix}"):
            uid = registration.name[len(driver) + 1 : -len(suffix)]
            if registration != paths.registration and _POD_UID.fullmatch(uid):
                found.append((registration, uid))
    return found


def _listened_on(path: Path) -> bool:
    """Whether a process listens on the socket file ``path`` (True when that cannot be told)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True
    return True


def pod_uid(environ: dict[str, str] | None = None) -> str:
    """The agent's pod UID from ``$POD_UID`` (the downward API's ``metadata.uid``), "" when unset;
    ConfigError for a value that is no Kubernetes UID (it becomes part of socket names)."""
    uid = (os.environ if environ is None else environ).get("POD_UID", "")
    if uid and not valid_uid(uid):
        raise ConfigError(
            f"POD_UID {uid[:80]!r} is not a Kubernetes UID: set it from the pod's metadata.uid "
            "(the downward API), or leave it unset"
        )
    return uid
