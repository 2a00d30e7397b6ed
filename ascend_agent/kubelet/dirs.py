"""The kubelet's own directories: the agent needs them, never creates them, and waits for them to appear.

A directory made by the agent on a node whose kubelet is not there (yet) would hide that from everyone: the
agent would wait forever in a directory nobody reads. Instead it waits, by inotify on the nearest parent
that exists (no polling), and says what it waits for::

    await wait_for(kubelets_own(settings), on_wait=agent.waiting_for)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from ascend_agent.config import DRA_API, PLUGIN_WATCHER_REGISTRATION, ConfigError, Settings
from ascend_agent.watch import Watcher

log = logging.getLogger(__name__)


def kubelets_own(settings: Settings) -> list[Path]:
    """The kubelet's directories these settings use: its device-plugins directory (not as a DRA driver);
    the plugins directory the agent's own one sits in, unless ``--plugin-dir`` names another place; its
    plugins registry in plugin-watcher mode and as a DRA driver (whose own directory is in the plugins
    directory)."""
    if settings.kubelet_api == DRA_API:
        return [settings.kubelet_dir.parent / "plugins", settings.effective_plugins_registry_dir]
    directories = [settings.kubelet_dir]
    if settings.plugin_dir is None:
        directories.append(settings.effective_plugin_dir.parent)
    if settings.registration == PLUGIN_WATCHER_REGISTRATION:
        directories.append(settings.effective_plugins_registry_dir)
    return list(dict.fromkeys(directories))


def waiting_reason(directory: Path) -> str:
    """What ``/readyz`` and the log say while ``directory`` is missing."""
    return (
        f"waiting for the kubelet's directory {directory} to appear: is the kubelet running on this node, "
        "and is the directory mounted into the agent?"
    )


def _missing(directory: Path) -> bool:
    """Whether ``directory`` is not there; :class:`ConfigError` when this user may not even look."""
    try:
        directory.stat()
    except FileNotFoundError:
        return True
    except PermissionError as exc:
        raise ConfigError(
            f"cannot look at the kubelet's directory {directory}: {exc.strerror or exc}; "
            "run the agent as root"
        ) from None
    except OSError:  # a plain file on the way (ENOTDIR): serving there fails and says why
        return False
    return False


async def wait_for(directories: Sequence[Path], on_wait: Callable[[Path | None], None]) -> None:
    """Return once none of ``directories`` is missing; ``on_wait`` hears each one waited for, then None.
    Something that is there but no directory is not waited for: serving there fails and says why."""
    if not any(_missing(directory) for directory in directories):
        return
    watcher = Watcher()
    try:
        for directory in directories:
            watcher.watch(directory, str(directory), lambda name: False)
        waited: Path | None = None
        while True:
            missing = next((directory for directory in directories if _missing(directory)), None)
            if missing is None:
                break
            if missing != waited:
                reason = waiting_reason(missing)
                log.warning("%s", reason[0].upper() + reason[1:])
                on_wait(missing)
                waited = missing
            await watcher.next_batch()
    finally:
        watcher.close()
    log.info("The kubelet's directories are there: %s", ", ".join(map(str, directories)))
    on_wait(None)
