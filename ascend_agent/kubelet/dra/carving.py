"""Dynamic vNPUs carved at prepare and destroyed at unprepare, and the record of the ones this driver made.

Every vNPU the driver makes is written to ``vnpus.json`` beside the checkpoint (claim UID, device, chip,
vNPU id, template) *before* npu-smi is asked to create it, with the id the driver chose (``-v``), and leaves
the record only once npu-smi destroyed it or shows it gone. So a vNPU the driver made is always known, and
one it did not make is never touched: a crash between create and checkpoint leaves a record whose claim the
checkpoint does not hold, and :meth:`Carving.sweep` destroys it at the next start. The record is a file of
its own so that a checkpoint set aside does not lose it: the claims it names are then released when the
kubelet unprepares them. The backend does the work (:class:`~ascend_agent.backends.VnpuCarver`: devfs
through npu-smi, fake in memory); this module never runs a tool::

    made, aside = MadeVnpus.open(directory / "vnpus.json")
    carving = Carving(made)
    carving.carver = backend                         # set by the agent once the backend can carve
    vnpu = await carving.carve(uid, "npu-1-vir04-0", chip, "vir04")      # ClaimError with npu-smi's words
    await carving.release(uid)                       # "" or the one line why not
    await carving.sweep(held={uid, ...})             # at start: the records no prepared claim holds
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

from ascend_agent.backends import VnpuCarver
from ascend_agent.files import replace_file
from ascend_agent.kubelet.dra.claimread import ClaimError
from ascend_agent.kubelet.dra.claims import (
    CheckpointError,
    SetAside,
    UnusableCheckpoint,
    identity,
    keep_aside,
    read_records,
    valid_uid,
)
from ascend_agent.model import CarveFailed, Chip, VNpu
from ascend_agent.observability import log_fields

log = logging.getLogger(__name__)

MADE_VNPUS = "vnpus.json"  # beside the checkpoint
# npu-smi numbers the vNPUs of chip N from N*16+100 (inference chips use the first 8, training chips all 16).
_FIRST_ID = 100
_IDS_PER_CHIP = 16


@dataclass(frozen=True, slots=True)
class Made:
    """One vNPU this driver made (or is about to make) for a claim's device."""

    claim: str
    device: str
    phys_id: int
    vnpu_id: int
    template: str

    @classmethod
    def from_json(cls, data: Any) -> Made:
        if not isinstance(data, dict):
            raise TypeError("an entry is not an object")
        claim, device, template = data["claim"], data["device"], data["template"]
        phys_id, vnpu_id = data["phys_id"], data["vnpu_id"]
        if not all(isinstance(v, str) for v in (claim, device, template)) or not valid_uid(claim):
            raise TypeError("claim, device and template are strings, claim a UID")
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31 for v in (phys_id, vnpu_id)
        ):
            raise TypeError("phys_id and vnpu_id are ids")
        return cls(claim, device, phys_id, vnpu_id, template)


class MadeVnpus:
    """The record of the vNPUs this driver made, mirrored in its file. Its methods that touch the file
    block: callers run them in a worker thread."""

    def __init__(self, path: Path, made: Collection[Made] = ()) -> None:
        self.path = path
        self._made = list(made)
        self._seen = identity(path)

    @classmethod
    def open(cls, path: Path) -> tuple[MadeVnpus, SetAside | None]:
        """The record in ``path``; one that is not a record is kept aside (the SetAside says so) and the
        record starts empty. CheckpointError when it cannot be read or moved."""
        try:
            return cls(path, _read(path)), None
        except UnusableCheckpoint as exc:
            try:
                kept = keep_aside(path)
            except OSError as error:
                raise CheckpointError(f"{exc}; cannot move it aside: {error.strerror or error}") from None
            return cls(path), SetAside(str(exc), kept)

    def reload(self) -> SetAside | None:
        """Read the file again if another instance of the driver wrote it since."""
        if identity(self.path) == self._seen:
            return None
        try:
            self._made = _read(self.path)
        except UnusableCheckpoint as exc:
            try:
                kept = keep_aside(self.path)
            except OSError as error:
                raise CheckpointError(f"{exc}; cannot move it aside: {error.strerror or error}") from None
            self._made = []
            self._seen = None
            return SetAside(str(exc), kept)
        self._seen = identity(self.path)
        return None

    def __iter__(self) -> Iterator[Made]:
        return iter(list(self._made))

    def of_claim(self, uid: str) -> list[Made]:
        return [made for made in self._made if made.claim == uid]

    def ids_on(self, phys_id: int) -> set[int]:
        return {made.vnpu_id for made in self._made if made.phys_id == phys_id}

    def add(self, made: Made) -> None:
        """Record ``made`` (flushed to disk before this returns); OSError when the file cannot be written."""
        self._made.append(made)
        try:
            self._save()
        except OSError:
            self._made.remove(made)
            raise

    def drop(self, made: Made) -> None:
        """Forget ``made``; OSError when the file cannot be written (it stays recorded)."""
        self._made.remove(made)
        try:
            self._save()
        except OSError:
            self._made.append(made)
            raise

    def _save(self) -> None:
        document = {"version": 1, "vnpus": [asdict(made) for made in self._made]}
        replace_file(self.path, json.dumps(document))
        self._seen = identity(self.path)


def _read(path: Path) -> list[Made]:
    return read_records(path, "vnpus", (1,), Made.from_json, "a record of vNPUs made")


class Carving:
    """Carves and destroys the vNPUs of claims through the backend's :class:`VnpuCarver`; callers hold the
    driver's call lock, so one carve or release runs at a time."""

    def __init__(self, made: MadeVnpus) -> None:
        self.made = made
        self.carver: VnpuCarver | None = None

    def holds(self, uid: str) -> bool:
        return bool(self.made.of_claim(uid))

    async def carve(
        self,
        uid: str,
        device: str,
        chip: Chip,
        template: str,
        vnpu_id: int | None = None,
        room: Callable[[Sequence[VNpu]], str] | None = None,
    ) -> VNpu:
        """The vNPU of ``template`` on ``chip`` for the claim's ``device``: made now, or with ``vnpu_id`` the
        one made before (made again with that id when it is gone: a reboot). ``room`` says why one more does
        not fit beside the chip's vNPUs now ("" when it does), before anything is made. ClaimError in one line
        when it cannot be made; nothing is left behind then."""
        carver = self._carver()
        where = f"chip {chip.phys_id} ({chip.model})"
        try:
            now = {vnpu.vnpu_id: vnpu for vnpu in await carver.vnpus_now(chip.phys_id)}
        except CarveFailed as exc:
            raise ClaimError(f"cannot read the vNPUs of {where}: {exc}") from None
        record = next((m for m in self.made.of_claim(uid) if m.device == device), None)
        if vnpu_id is None and record is not None and record.template == template:
            vnpu_id = record.vnpu_id  # made for this claim before its checkpoint was lost
        if vnpu_id is not None and vnpu_id in now:
            if now[vnpu_id].template != template:
                raise ClaimError(
                    f"vNPU {vnpu_id} of {where} is a {now[vnpu_id].template}, not the {template} made"
                )
            if record is None:
                await self._record(Made(uid, device, chip.phys_id, vnpu_id, template))
            return VNpu(vnpu_id, template)
        if vnpu_id is None:
            first = _FIRST_ID + chip.phys_id * _IDS_PER_CHIP
            taken = set(now) | self.made.ids_on(chip.phys_id)
            vnpu_id = next((i for i in range(first, first + _IDS_PER_CHIP) if i not in taken), None)
            if vnpu_id is None:
                raise ClaimError(f"{where} has no free vNPU id left ({first} to {first + _IDS_PER_CHIP - 1})")
            record = None
        if room is not None and (why := room(tuple(now.values()))):
            raise ClaimError(f"cannot carve a {template} vNPU on {where}: {why}")
        if record is None:
            record = Made(uid, device, chip.phys_id, vnpu_id, template)
            await self._record(record)
        try:
            await carver.create_vnpu(chip.phys_id, template, vnpu_id)
        except CarveFailed as exc:
            await self._undo(record)
            raise ClaimError(f"cannot carve a {template} vNPU on {where}: {exc}") from None
        log.info(
            "Carved vNPU %d (%s) on chip %d for %s",
            vnpu_id,
            template,
            chip.phys_id,
            device,
            extra=log_fields(uid=uid, device=device),
        )
        return VNpu(vnpu_id, template)

    async def _record(self, record: Made) -> None:
        try:
            await anyio.to_thread.run_sync(self.made.add, record)
        except OSError as exc:
            raise ClaimError(f"cannot record the vNPU in {self.made.path}: {exc.strerror or exc}") from None

    async def _undo(self, record: Made) -> None:
        """After a failed create: npu-smi may have made it all the same (a timeout); destroy it if it is
        there and forget it. When npu-smi cannot say, the record stays for the next release or sweep."""
        assert self.carver is not None
        with contextlib.suppress(CarveFailed, OSError):
            ids = {vnpu.vnpu_id for vnpu in await self.carver.vnpus_now(record.phys_id)}
            if record.vnpu_id in ids:
                await self.carver.destroy_vnpu(record.phys_id, record.vnpu_id)
            await anyio.to_thread.run_sync(self.made.drop, record)

    async def release(self, uid: str) -> str:
        """Destroy every vNPU made for the claim and forget it; "" when done, else the one line why not (the
        kubelet retries the unprepare)."""
        for record in self.made.of_claim(uid):
            problem = await self._destroy(record)
            if problem:
                return problem
        return ""

    async def _destroy(self, record: Made) -> str:
        where = f"vNPU {record.vnpu_id} ({record.template}) on chip {record.phys_id}"
        carver = self._carver_or_none()
        if carver is None:
            return (
                f"cannot destroy {where}: the backend cannot carve vNPUs (the chips not discovered yet, or a "
                "backend without dynamic vNPUs)"
            )
        try:
            ids = {vnpu.vnpu_id for vnpu in await carver.vnpus_now(record.phys_id)}
            if record.vnpu_id in ids:
                await carver.destroy_vnpu(record.phys_id, record.vnpu_id)
        except CarveFailed as exc:
            return f"cannot destroy {where}: {exc}"
        try:
            await anyio.to_thread.run_sync(self.made.drop, record)
        except OSError as exc:
            return f"destroyed {where} but cannot write {self.made.path}: {exc.strerror or exc}"
        log.info("Destroyed %s (claim uid %s)", where, record.claim, extra=log_fields(uid=record.claim))
        return ""

    async def sweep(self, held: Collection[str]) -> None:
        """Destroy the vNPUs made for claims that no prepared claim is (an agent killed between create and
        checkpoint): never one this driver did not make."""
        for record in self.made:
            if record.claim in held:
                continue
            problem = await self._destroy(record)
            if problem:
                log.warning(
                    "vNPU made for a claim that is not prepared: %s; tried again at the next start", problem
                )

    def _carver(self) -> VnpuCarver:
        carver = self._carver_or_none()
        if carver is None:
            raise ClaimError(
                "dynamic vNPUs are carved by the backend (devfs through npu-smi, or fake); the chips are not "
                "discovered yet, or the backend cannot carve (the kubelet retries)"
            )
        return carver

    def _carver_or_none(self) -> VnpuCarver | None:
        return self.carver
