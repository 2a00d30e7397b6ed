"""Files and directories the agent makes in places others may write to: made with the modes it means,
whatever the umask, and never through a link someone planted::

    make_dirs(Path("/var/lib/kubelet/plugins/ascend-agent"), 0o750)
    descriptor = open_no_follow(Path("/var/lib/kubelet/plugins/ascend-agent/agent.lock"), os.O_RDWR)
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path


def make_dirs(directory: Path, mode: int, parents: bool = True) -> None:
    """Make ``directory``, and its missing parents with ``parents``, with ``mode`` exactly (mkdir's mode is
    narrowed by the umask, and a umask of 000 would leave them writable by all); existing ones are left as
    they are. FileNotFoundError when a parent is missing and ``parents`` is False."""
    missing = []
    place = directory
    while not place.exists() and place != place.parent:
        missing.append(place)
        place = place.parent
    if not parents:
        missing = missing[:1]
    for step in reversed(missing):
        try:
            os.mkdir(step, mode)
        except FileExistsError:
            if not step.is_dir():
                raise
            continue
        os.chmod(step, mode)
    if not missing and not directory.is_dir():
        raise FileExistsError(f"{directory} exists and is not a directory")


def open_no_follow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a symbolic link at ``path`` (ELOOP) and is closed on exec."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def check_not_shared(directory: Path) -> None:
    """PermissionError unless only the agent's user can change ``directory``: what is written there (a CDI
    spec becomes a container's devices and mounts) must not be replaceable by others."""
    stat = os.stat(directory)
    if stat.st_uid != os.geteuid() or stat.st_mode & 0o022:
        raise PermissionError(
            errno.EPERM, f"{directory} can be changed by users other than {os.geteuid()}; make it 0755"
        )


def replace_file(path: Path, text: str, flush_directory: bool = True) -> None:
    """Replace ``path`` with ``text`` (mode 0644), only in a directory no other user can change (made 0755 if
    missing): a temporary file in the same directory, flushed to disk, then renamed, and the directory flushed
    too, so that after a power loss the file is either the old or the new one and the rename is not lost::

        replace_file(Path("/var/run/cdi/huawei.com-npu.yaml"), text)

    Without ``flush_directory`` the caller flushes the directory itself (``sync_directory``), once for many
    files.
    """
    make_dirs(path.parent, 0o755)
    check_not_shared(path.parent)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    if flush_directory:
        sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """Flush ``directory`` to disk: the renames done in it survive a power loss."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
