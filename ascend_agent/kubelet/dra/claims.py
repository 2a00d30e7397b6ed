"""Prepared claims: one CDI spec per claim, and the on-disk checkpoint that says which claims were prepared.

A prepared claim is remembered by its UID with the devices the kubelet was told and the boot its CDI spec was
written in; the spec's file name follows from the UID alone (``<cdi dir>/<driver>-claim-<uid>.json``), so
nothing read from the checkpoint can steer a path. The checkpoint (JSON, replaced atomically, written once
per call) holds every prepared claim, so that after an agent restart :meth:`Prepared.remove` still removes
exactly what was written, and after a reboot (the CDI directory is a tmpfs) the specs are written again::

    prepared, aside = Prepared.open(checkpoint, cdi_dir, "npu.huawei.com", read_boot_id())
    prepared.add([(claim, spec_document)])     # writes the specs, then the checkpoint once
    prepared.fresh_claims([uid])               # those whose spec was written in this boot and is there
    prepared.remove([uid])                     # removes the specs, then the entries
    prepared.reload()                          # what another instance of the driver wrote since

A checkpoint that is not one (not a regular file, over 16 MiB, not UTF-8 JSON of prepared claims) is kept
aside under another name and the driver starts with no prepared claims: the kubelet asks again for the
claims its pods need.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from ascend_agent.cdi import CDI_VERSION, chip_edits, shared_edits
from ascend_agent.container import device_order
from ascend_agent.files import (
    UnusableFile,
    parse_records,
    read_regular,
    replace_file,
    sync_directory,
)
from ascend_agent.kube_names import is_dns_label
from ascend_agent.model import Chip, ContainerSpec

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 2  # 1: without boot ids, with each spec's path
MAX_CHECKPOINT_BYTES = 16 * 1024 * 1024
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

_SHOWN = 80  # characters of a refused value shown in a message
R = TypeVar("R")


def valid_uid(uid: str) -> bool:
    """A Kubernetes UID as it may appear in a file name: a DNS label."""
    return is_dns_label(uid)


def uid_problem(uid: str) -> str | None:
    """Why ``uid`` cannot name a claim's files, or None when it can."""
    if valid_uid(uid):
        return None
    return (
        f"claim UID {uid[:_SHOWN]!r} is not a Kubernetes UID "
        "(lower-case letters, digits and '-', at most 63 characters)"
    )


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources answers it. A device allocated with admin
    access (``adminAccess: true``) is there for monitoring: it is shared with any other claim, no vNPU is
    made or destroyed for it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    admin_access: bool = False
    # A vNPU carved for this device at prepare (a template device, or a whole chip with an NpuConfig
    # template): its id and template; carved again with the same id when a reboot took it.
    vnpu_id: int | None = None
    template: str = ""


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    boot_id: str = ""  # the boot its CDI spec was written in ("" when unknown)
    runtime: str = ""  # the NpuConfig's runtime mode ("" when it gave none)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> PreparedClaim:
        """One claim of the checkpoint; ValueError (or KeyError, TypeError) when it is not one."""
        if not isinstance(data, dict):
            raise TypeError("a claim is not an object")
        uid = _string(data, "uid")
        if (problem := uid_problem(uid)) is not None:
            raise ValueError(problem)
        devices = data["devices"]
        if not isinstance(devices, list):
            raise TypeError("devices is not a list")
        return cls(
            uid,
            _string(data, "namespace"),
            _string(data, "name"),
            tuple(
                PreparedDevice(
                    _strings(d, "request_names"),
                    _string(d, "pool_name"),
                    _string(d, "device_name"),
                    _strings(d, "cdi_device_ids"),
                    _flag(d, "admin_access"),
                    _vnpu_id(d),
                    _string(d, "template") if "template" in d else "",
                )
                for d in devices
            ),
            _string(data, "boot_id") if "boot_id" in data else "",
            _string(data, "runtime") if "runtime" in data else "",
        )


def _string(data: Any, key: str) -> str:
    if not isinstance(data, dict):
        raise TypeError("a device is not an object")
    value = data[key]
    if not isinstance(value, str):
        raise TypeError(f"{key} is not a string")
    return value


def _flag(data: Any, key: str) -> bool:
    """A boolean field; False when absent (checkpoints written before it)."""
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise TypeError(f"{key} is not a boolean")
    return value


def _vnpu_id(data: Any) -> int | None:
    value = data.get("vnpu_id") if isinstance(data, dict) else None
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 31:
        raise TypeError("vnpu_id is not a vNPU id")
    return value


def _strings(data: Any, key: str) -> tuple[str, ...]:
    if not isinstance(data, dict):
        raise TypeError("a device is not an object")
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TypeError(f"{key} is not a list of strings")
    return tuple(value)


def cdi_kind(driver: str) -> str:
    """The CDI kind of the claims' specs: ``<driver>/claim``."""
    return f"{driver}/claim"


def spec_file_name(driver: str, uid: str) -> str:
    """The claim's CDI spec file; ValueError for a UID that could make it a path."""
    if (problem := uid_problem(uid)) is not None:
        raise ValueError(problem)
    return f"{driver}-claim-{uid}.json"


def cdi_device_id(driver: str, uid: str, device: str) -> str:
    """The fully qualified CDI name of one device of one claim: ``npu.huawei.com/claim=<uid>-npu-3``."""
    return f"{cdi_kind(driver)}={uid}-{device}"


def claim_spec(driver: str, uid: str, chips: Mapping[str, Chip], spec: ContainerSpec) -> dict[str, Any]:
    """The CDI spec of one claim: a CDI device per claimed chip (its device node) and, for the claim as a
    whole, what a container with all of them gets (management devices, mounts, ``ASCEND_VISIBLE_DEVICES``):
    ``spec`` is what Allocate gives for the same chips."""
    own = {chip.device_path for chip in chips.values()}
    devices = [
        {"name": f"{uid}-{name}", "containerEdits": chip_edits(chip, spec)}
        for name, chip in sorted(chips.items(), key=lambda item: device_order(item[1]))
    ]
    edits = {
        "env": [f"{key}={value}" for key, value in sorted(spec.envs.items())],
        **shared_edits(spec, own),
    }
    return {"cdiVersion": CDI_VERSION, "kind": cdi_kind(driver), "devices": devices, "containerEdits": edits}


def read_boot_id(path: Path = BOOT_ID) -> str:
    """The kernel's boot id; "" (and a warning) when it cannot be read."""
    try:
        with path.open("rb") as stream:
            text = stream.read(128).decode("ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning(
            "Cannot read the boot id %s (%s): a reboot is noticed only by the CDI specs it removed",
            path,
            getattr(exc, "strerror", None) or exc,
        )
        return ""
    return text


class CheckpointError(Exception):
    """The checkpoint cannot be read or set aside; the message names the file."""


class UnusableCheckpoint(CheckpointError):
    """The file is not a checkpoint of prepared claims: not a regular file, too large, or other contents."""


def read_checkpoint(path: Path) -> list[PreparedClaim]:
    """The claims in the checkpoint ``path`` (none when there is no file). Never follows a link, never opens
    anything but a regular file, never reads more than 16 MiB. UnusableCheckpoint when the file is not a
    checkpoint, CheckpointError when it cannot be read."""
    what = "a checkpoint of prepared claims"
    return read_records(path, "claims", (1, CHECKPOINT_VERSION), PreparedClaim.from_json, what)


def parse_checkpoint(path: Path, data: bytes) -> list[PreparedClaim]:
    """The claims in the bytes of a checkpoint; UnusableCheckpoint (naming ``path``) for anything else."""
    what = "a checkpoint of prepared claims"
    try:
        return parse_records(path, data, "claims", (1, CHECKPOINT_VERSION), PreparedClaim.from_json, what)
    except UnusableFile as exc:
        raise UnusableCheckpoint(str(exc)) from None


def read_records(
    path: Path, key: str, versions: tuple[int, ...], record: Callable[[Any], R], what: str
) -> list[R]:
    """The entries of the driver's record ``path`` (``{"version": V, key: [...]}``, read as the checkpoint
    is; none when there is no file); UnusableCheckpoint saying ``path`` is not ``what`` for anything else,
    CheckpointError when it cannot be read::

        read_records(path, "vnpus", (1,), Made.from_json, "a record of vNPUs made")
    """
    try:
        data = read_regular(path, MAX_CHECKPOINT_BYTES, what)
        return [] if data is None else parse_records(path, data, key, versions, record, what)
    except UnusableFile as exc:
        raise UnusableCheckpoint(str(exc)) from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None


@dataclass(frozen=True, slots=True)
class SetAside:
    """An unusable checkpoint, renamed and kept for inspection."""

    reason: str
    kept_as: Path


def keep_aside(path: Path) -> Path:
    """Rename ``path`` (whatever it is; a link itself, not its target) to ``<name>.unusable-<UTC time>``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.unusable-{stamp}")
    turn = 1
    while os.path.lexists(target):
        turn += 1
        target = path.with_name(f"{path.name}.unusable-{stamp}-{turn}")
    os.rename(path, target)
    return target


class Prepared:
    """The prepared claims by UID, mirrored in the checkpoint file. Its methods that touch files block: the
    DRA service calls them in a worker thread."""

    def __init__(
        self,
        checkpoint: Path,
        cdi_dir: Path,
        driver: str,
        boot_id: str = "",
        claims: Iterable[PreparedClaim] = (),
    ) -> None:
        self.checkpoint = checkpoint
        self.cdi_dir = cdi_dir
        self.driver = driver
        self.boot_id = boot_id
        self._claims = {claim.uid: claim for claim in claims}
        self._seen = identity(checkpoint)  # the checkpoint as last read or written

    @classmethod
    def open(
        cls, checkpoint: Path, cdi_dir: Path, driver: str, boot_id: str
    ) -> tuple[Prepared, SetAside | None]:
        """The claims in ``checkpoint``. One that is not a checkpoint is kept aside under another name and
        no claims are prepared (the SetAside says so); CheckpointError when it cannot be read or moved."""
        try:
            claims = read_checkpoint(checkpoint)
        except UnusableCheckpoint as exc:
            try:
                kept = keep_aside(checkpoint)
            except OSError as error:
                raise CheckpointError(f"{exc}; cannot move it aside: {error.strerror or error}") from None
            return cls(checkpoint, cdi_dir, driver, boot_id), SetAside(str(exc), kept)
        return cls(checkpoint, cdi_dir, driver, boot_id, claims), None

    def reload(self) -> SetAside | None:
        """Read the checkpoint again if it is not the file this instance last read or wrote: the other
        instance of a rolling update wrote it. One that is not a checkpoint is kept aside and no claims are
        prepared (the SetAside says so); CheckpointError when it cannot be read or moved."""
        seen = identity(self.checkpoint)
        if seen == self._seen:
            return None
        try:
            claims = read_checkpoint(self.checkpoint)
        except UnusableCheckpoint as exc:
            try:
                kept = keep_aside(self.checkpoint)
            except OSError as error:
                raise CheckpointError(f"{exc}; cannot move it aside: {error.strerror or error}") from None
            self._claims, self._seen = {}, None
            return SetAside(str(exc), kept)
        self._claims = {claim.uid: claim for claim in claims}
        self._seen = seen
        return None

    def spec_path(self, uid: str) -> Path:
        """Where the claim's CDI spec is: always a file directly in the CDI directory."""
        return self.cdi_dir / spec_file_name(self.driver, uid)

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def __iter__(self) -> Iterator[PreparedClaim]:
        return iter(list(self._claims.values()))

    def __len__(self) -> int:
        return len(self._claims)

    def fresh_claims(self, uids: Iterable[str]) -> dict[str, PreparedClaim]:
        """Those of ``uids`` whose CDI spec was written in this boot and is still there: the others must be
        written again before the kubelet is told their CDI devices."""
        fresh = {}
        for uid in uids:
            claim = self._fresh(uid)
            if claim is not None:
                fresh[uid] = claim
        return fresh

    def _fresh(self, uid: str) -> PreparedClaim | None:
        claim = self._claims.get(uid)
        if claim is None or claim.boot_id != self.boot_id:
            return None
        try:
            return claim if stat.S_ISREG(os.lstat(self.spec_path(uid)).st_mode) else None
        except OSError:
            return None

    def add(
        self, claims: Sequence[tuple[PreparedClaim, Mapping[str, Any]]]
    ) -> dict[str, PreparedClaim | OSError]:
        """Write each claim's CDI spec, then the checkpoint once; by UID what was prepared, or the OSError
        that kept it from being prepared. A claim whose spec is already written in this boot keeps it. When
        the checkpoint cannot be written, every claim of the call fails and the specs of the new ones are
        removed again."""
        results: dict[str, PreparedClaim | OSError] = {}
        before: dict[str, PreparedClaim | None] = {}
        for claim, spec in claims:
            done = self._fresh(claim.uid)
            if done is not None:
                results[claim.uid] = done
                continue
            path = self.spec_path(claim.uid)
            try:
                replace_file(path, json.dumps(spec, indent=1), flush_directory=False)
            except OSError as exc:
                results[claim.uid] = exc
                continue
            before.setdefault(claim.uid, self._claims.get(claim.uid))
            self._claims[claim.uid] = results[claim.uid] = replace(claim, boot_id=self.boot_id)
        if not before:
            return results
        try:
            sync_directory(self.cdi_dir)  # the specs' renames, before the checkpoint names them
            self._save()
        except OSError as exc:
            for uid, old in before.items():
                results[uid] = exc
                if old is None:
                    del self._claims[uid]
                    with contextlib.suppress(OSError):
                        self.spec_path(uid).unlink()
                else:
                    self._claims[uid] = old
        return results

    def remove(self, uids: Iterable[str]) -> dict[str, OSError | None]:
        """Remove what was written for each claim (nothing for an unknown one), then write the checkpoint
        once; by UID the OSError that kept it, or None."""
        results: dict[str, OSError | None] = {}
        removed: dict[str, PreparedClaim] = {}
        for uid in uids:
            claim = self._claims.get(uid)
            results[uid] = None
            if claim is None:
                continue
            try:
                self.spec_path(uid).unlink()  # a link there is removed itself, never its target
            except FileNotFoundError:
                pass
            except OSError as exc:
                results[uid] = exc
                continue
            removed[uid] = self._claims.pop(uid)
        if removed:
            try:
                self._save()
            except OSError as exc:
                self._claims.update(removed)
                results.update(dict.fromkeys(removed, exc))
        return results

    def _save(self) -> None:
        document = {"version": CHECKPOINT_VERSION, "claims": [c.as_json() for c in self._claims.values()]}
        replace_file(self.checkpoint, json.dumps(document))
        self._seen = identity(self.checkpoint)


def identity(path: Path) -> tuple[int, int, int] | None:
    """What tells one version of a file from the next (each is a new file renamed into place): its inode,
    modification time and size; None when there is none."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return (-1, -1, -1)  # read it: the read says what is wrong
    return (found.st_ino, found.st_mtime_ns, found.st_size)
