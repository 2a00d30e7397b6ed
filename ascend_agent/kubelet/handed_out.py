"""What Allocate handed over for each of the kubelet's device IDs, until the kubelet's PodResources shows that
ID freed; kept on disk so that an agent started again knows it too.

The kubelet names a pod's devices by its own IDs, in the Allocate and in PodResources alike. Under
``--volcano`` Allocate hands over other chips (Volcano's choice): ``Ascend910-6`` for the kubelet's
``Ascend910-2``. Read through this map, PodResources' pod under ``Ascend910-2`` holds chip 6, whichever pod
the marks were written on. Right after an Allocate nothing else says a device is in use either: PodResources
lists the pod only once the kubelet recorded it, and npu-smi's container column stays empty until the
container opens the device. So a device handed over counts as held until PodResources shows its kubelet ID
freed: an answer asked after the Allocate listed the ID and a later one lists it no more; or no answer listed
it for ``UNSEEN_GRACE`` after the Allocate (the kubelet dropped the pod before recording it)::

    handed = HandedOut()
    await tasks.start(handed.keep, Path("/var/lib/kubelet/plugins/ascend-agent/handed-out.json"))
    handed.record("huawei.com/Ascend910", [("Ascend910-2", "Ascend910-6")])   # after each Allocate
    handed.observe(listed, asked_at)    # each PodResources answer: the (resource, kubelet ID)s it lists
    handed.device_ids()                 # frozenset({"Ascend910-6"})
    on_chips, others = handed.through(holders)   # PodResources' holders moved to the chips handed over

The file (JSON, replaced atomically after each change, written by :meth:`HandedOut.keep` in a thread of its
own beside the Allocates, and once more as the agent stops, which waits ``FINAL_WRITE_TIMEOUT`` for it at
most) lives in the agent's own directory beside its lock, which the kubelet's start-up never wipes
(:class:`~ascend_agent.state_file.StateFile`). One entry per kubelet ID: a node advertises at most a few
hundred, and an entry goes when PodResources shows its ID freed. At most ``MAX_ENTRIES`` are kept; past that
the oldest go first (one warning), and a pod still holding such an ID is counted on the ID itself again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc

from ascend_agent.model import Holder, Holders
from ascend_agent.naming import MAX_DEVICE_ID_LENGTH
from ascend_agent.state_file import StateFile

log = logging.getLogger(__name__)

# The kubelet records an allocation as it admits the pod, well within this after Allocate answered.
UNSEEN_GRACE = 60.0
# Far above the IDs a node advertises: reached only by a kubelet sending IDs the agent never advertised.
MAX_ENTRIES = 4096
HANDED_OUT_FILE = "handed-out.json"
_VERSION = 1
_KEY = "handed"
# An entry on disk is a resource name (at most 253 characters) and two device IDs (63 each): MAX_ENTRIES of
# them are under 2 MiB.
_MAX_FILE_BYTES = 4 * 1024 * 1024
# The stop waits this long for the last write; the start this long for the read (a hung filesystem).
FINAL_WRITE_TIMEOUT = 2.0
LOAD_TIMEOUT = 5.0
_WITHOUT = "starting without what an earlier agent handed out"

Key = tuple[str, str]  # (resource, the kubelet's device ID)
_Entry = tuple[str, str, str, bool]  # on disk: resource, the kubelet's device ID, the device, seen


@dataclass(slots=True)
class _Handed:
    device: str  # what Allocate handed over for the kubelet's ID
    at: float
    seen: bool = False


class HandedOut:
    """(resource, the kubelet's device ID) -> the device Allocate handed over for it, when, and whether
    PodResources has listed the ID since; oldest first."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        grace: float = UNSEEN_GRACE,
        limit: int = MAX_ENTRIES,
    ) -> None:
        self._clock = clock
        self._grace = grace
        self._limit = limit
        self._handed: dict[Key, _Handed] = {}
        self.version = 0  # counts changes: the views made from the map, the file
        self._changed = anyio.Event()
        self._overflowed = False

    def record(self, resource: str, pairs: Iterable[tuple[str, str]]) -> None:
        """Allocate handed over, for each of the kubelet's IDs, a device: (kubelet ID, device) ``pairs`` of
        ``resource`` (again: counted from now, replacing what the ID had)."""
        now = self._clock()
        for kubelet_id, device in pairs:
            if len(kubelet_id) > MAX_DEVICE_ID_LENGTH or len(device) > MAX_DEVICE_ID_LENGTH:
                continue  # no ID the agent advertised: the kubelet never sends one
            self._handed.pop((resource, kubelet_id), None)
            self._handed[(resource, kubelet_id)] = _Handed(device, now)
        self._bound()
        self._change()

    def observe(self, listed: Collection[Key], asked_at: float) -> None:
        """A PodResources answer, asked at ``asked_at`` (this clock), listing these (resource, kubelet ID)s.
        An answer asked before a device was handed over says nothing of it."""
        changed = False
        for key, handed in list(self._handed.items()):
            if asked_at < handed.at:
                continue
            if key in listed:
                changed |= not handed.seen
                handed.seen = True
            elif handed.seen or asked_at - handed.at > self._grace:
                del self._handed[key]
                changed = True
        if changed:
            self._change()

    def device_ids(self) -> frozenset[str]:
        """The devices still counted as held."""
        return frozenset(handed.device for handed in self._handed.values())

    def pairs(self, resource: str) -> list[tuple[str, str]]:
        """(the kubelet's ID, the device handed over for it) of ``resource``, newest first."""
        return [
            (kubelet_id, handed.device)
            for (handed_resource, kubelet_id), handed in reversed(self._handed.items())
            if handed_resource == resource
        ]

    def through(self, holders: Holders) -> tuple[Holders, Holders]:
        """``holders`` (PodResources', by the kubelet's IDs) in two: those on an ID an Allocate answered,
        moved to the device it handed over for that ID; and the others as they were, with the claims'.

        >>> T = "huawei.com/Ascend910"
        >>> handed = HandedOut()
        >>> handed.record(T, [("Ascend910-2", "Ascend910-6")])
        >>> listed = Holders({(T, "Ascend910-2"): (Holder("a", "legit", "main"),), (T, "Ascend910-0"): ()})
        >>> on_chips, others = handed.through(listed)
        >>> list(on_chips.by_device), list(others.by_device)
        ([('huawei.com/Ascend910', 'Ascend910-6')], [('huawei.com/Ascend910', 'Ascend910-0')])
        """
        moved: dict[Key, set[Holder]] = {}
        others: dict[Key, tuple[Holder, ...]] = {}
        for (resource, kubelet_id), found in holders.by_device.items():
            handed = self._handed.get((resource, kubelet_id))
            if handed is None:
                others[(resource, kubelet_id)] = found
            else:
                moved.setdefault((resource, handed.device), set()).update(found)
        on_devices = {key: tuple(sorted(found)) for key, found in moved.items()}
        return Holders(on_devices), Holders(others, holders.by_claimed)

    def _bound(self) -> None:
        excess = len(self._handed) - self._limit
        if excess <= 0:
            return
        for key in list(self._handed)[:excess]:
            del self._handed[key]
        if not self._overflowed:
            self._overflowed = True
            log.warning(
                "More than %d of the kubelet's device IDs were handed devices: the oldest are forgotten, and "
                "a pod still holding one counts as holding that ID itself",
                self._limit,
            )

    def _change(self) -> None:
        self.version += 1
        self._changed.set()

    # on disk -----------------------------------------------------------------------------------------------
    async def keep(
        self, path: Path, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Read ``path`` (what an earlier agent handed out; given up after ``LOAD_TIMEOUT``), then write the
        map there after each change, until cancelled; the last change is written as the agent stops, which
        waits for it ``FINAL_WRITE_TIMEOUT`` at most. A file that cannot be read is one warning (the agent
        starts without it and replaces it); a write that fails is one warning until one succeeds, and tried
        again at the next change."""
        kept = _state_file(path)
        loaded: list[_Entry] = []
        with anyio.move_on_after(LOAD_TIMEOUT) as reading:
            loaded = await kept.read(_KEY, (_VERSION,), _entry, f"{_WITHOUT}, and replacing it")
        if reading.cancelled_caught:
            log.warning("Cannot read %s within %g s; %s", path, LOAD_TIMEOUT, _WITHOUT)
        self.record_loaded(loaded)
        if loaded:
            log.info("%d device(s) handed out by an earlier agent read from %s", len(loaded), path)
        written = self.version
        task_status.started()
        try:
            while True:
                if written == self.version:
                    self._changed = anyio.Event()
                    await self._changed.wait()
                version = self.version
                await kept.write(self._text())
                written = version
        finally:
            if written != self.version:
                with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_WRITE_TIMEOUT):
                    await kept.write(self._text())

    def record_loaded(self, loaded: Iterable[_Entry]) -> None:
        """Entries read from the file (resource, kubelet ID, device, seen), oldest first, under what was
        recorded since; each counted from now."""
        now = self._clock()
        for resource, kubelet_id, device, seen in loaded:
            self._handed.setdefault((resource, kubelet_id), _Handed(device, now, seen))
        self._bound()

    def _text(self) -> str:
        entries = [
            {"resource": resource, "kubeletId": kubelet_id, "device": handed.device, "seen": handed.seen}
            for (resource, kubelet_id), handed in self._handed.items()
        ]
        return json.dumps({"version": _VERSION, _KEY: entries}, separators=(",", ":"))


def read_handed_out(path: Path) -> HandedOut:
    """The map as the agent's file ``path`` holds it, for ``list`` and the doctor (which never write it);
    empty when there is none or it cannot be read."""
    handed = HandedOut()
    handed.record_loaded(_state_file(path).read_now(_KEY, (_VERSION,), _entry))
    return handed


def _state_file(path: Path) -> StateFile:
    lost = "what Allocate handed out is kept in memory only (lost if the agent restarts)"
    return StateFile(path, _MAX_FILE_BYTES, "a record of handed-out devices", lost)


def _entry(entry: object) -> _Entry:
    if not isinstance(entry, dict):
        raise TypeError("an entry is not an object")
    resource, kubelet_id, device, seen = (
        entry["resource"],
        entry["kubeletId"],
        entry["device"],
        entry["seen"],
    )
    names = (resource, kubelet_id, device)
    if not all(isinstance(name, str) and 0 < len(name) <= 253 for name in names) or not isinstance(
        seen, bool
    ):
        raise ValueError("an entry's names are not names")
    if len(kubelet_id) > MAX_DEVICE_ID_LENGTH or len(device) > MAX_DEVICE_ID_LENGTH:
        raise ValueError("an entry's device ID is too long")
    return resource, kubelet_id, device, seen
