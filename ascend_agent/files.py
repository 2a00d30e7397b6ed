"""Files and directories the agent makes in places others may write to: made with the modes it means,
whatever the umask, and never through a link someone planted; and the records it keeps there read back
bounded (``{"version": V, key: [...]}``)::

    make_dirs(Path("/var/lib/kubelet/plugins/ascend-agent"), 0o750)
    descriptor = open_no_follow(Path("/var/lib/kubelet/plugins/ascend-agent/agent.lock"), os.O_RDWR)
    data = read_regular(path, 4 * 1024 * 1024, "a record of handed-out devices")   # None: no file
    entries = parse_records(path, data, "handed", (1,), Entry.from_json, "a record of handed-out devices")
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

R = TypeVar("R")

# Characters of a refused value shown in a message.
_SHOWN = 80


class UnusableFile(ValueError):
    """A file the agent keeps is not what it should be: a link, not a regular file, too large, or contents
    that are no such record. The message names the file and says what it is instead."""


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


def read_regular(path: Path, limit: int, what: str) -> bytes | None:
    """The bytes of the regular file ``path``, None when there is none; never through a link, never more than
    ``limit`` bytes. UnusableFile (``<path> is a symbolic link, not <what>``) for anything else; OSError when
    it cannot be read. Blocking: callers on the event loop run it in a worker thread."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(found.st_mode):
        raise UnusableFile(f"{path} is {_file_kind(found.st_mode)}, not {what}")
    if found.st_size > limit:
        raise UnusableFile(f"{path} holds {found.st_size} bytes, over the {_size(limit)} {what} may hold")
    try:
        descriptor = open_no_follow(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # replaced by a link since the lstat
            raise UnusableFile(f"{path} is a symbolic link, not {what}") from None
        raise
    with os.fdopen(descriptor, "rb") as stream:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # replaced since the lstat
            raise UnusableFile(f"{path} is not a regular file, not {what}")
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise UnusableFile(f"{path} holds over the {_size(limit)} {what} may hold")
    return data


def parse_records(
    path: Path, data: bytes, key: str, versions: tuple[int, ...], record: Callable[[Any], R], what: str
) -> list[R]:
    """The entries of ``{"version": V, key: [...]}`` (V one of ``versions``), each made by ``record`` (which
    raises ValueError, KeyError or TypeError for an entry that is not one); UnusableFile saying ``path`` is
    not ``what`` for anything else::

        parse_records(path, data, "vnpus", (1,), Made.from_json, "a record of vNPUs made")
    """
    try:
        document = json.loads(data.decode("utf-8"))
        if not isinstance(document, dict):
            raise TypeError("the document is not an object")
        version = document.get("version")
        if version not in versions:
            raise ValueError(f"version {str(version)[:_SHOWN]!r}, not {' or '.join(map(str, versions))}")
        entries = document[key]
        if not isinstance(entries, list):
            raise TypeError(f"{key} is not a list")
        return [record(entry) for entry in entries]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        reason = f"{type(exc).__name__}: {exc}"[:200]
        raise UnusableFile(f"{path} is not {what} ({reason})") from None


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _size(limit: int) -> str:
    """``16 MiB``, ``256 KiB``: a limit in words."""
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
