"""Prepared claims: one CDI spec per claim, and the on-disk checkpoint that says what was written.

A prepared claim is remembered by its UID with the devices the kubelet was told and the CDI spec file
written for it; the checkpoint (JSON, replaced atomically) holds every prepared claim, so that after an agent
restart :meth:`Prepared.unprepare` still removes exactly what was written::

    prepared = Prepared.load(Path("/var/lib/kubelet/plugins/npu.huawei.com/checkpoint.json"))
    claim = PreparedClaim(uid, "default", "train", devices, spec_path)
    prepared.add(claim, spec_document)         # writes the spec, then the checkpoint
    prepared.unprepare(uid)                    # removes the spec, then the entry
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ascend_agent.cdi import CDI_VERSION, chip_edits, shared_edits
from ascend_agent.container import device_order
from ascend_agent.files import replace_file
from ascend_agent.model import Chip, ContainerSpec

CHECKPOINT_VERSION = 1


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources answers it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    spec_path: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PreparedClaim:
        devices = tuple(
            PreparedDevice(
                tuple(d["request_names"]), d["pool_name"], d["device_name"], tuple(d["cdi_device_ids"])
            )
            for d in data["devices"]
        )
        return cls(data["uid"], data["namespace"], data["name"], devices, data["spec_path"])


def cdi_kind(driver: str) -> str:
    """The CDI kind of the claims' specs: ``<driver>/claim``."""
    return f"{driver}/claim"


def spec_file_name(driver: str, uid: str) -> str:
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


class CheckpointError(Exception):
    """The checkpoint cannot be read or written; the message names the file."""


class Prepared:
    """The prepared claims by UID, mirrored in the checkpoint file. Its methods do blocking file I/O: the
    DRA service calls them in a worker thread."""

    def __init__(self, checkpoint: Path, claims: Mapping[str, PreparedClaim] | None = None) -> None:
        self.checkpoint = checkpoint
        self._claims = dict(claims or {})

    @classmethod
    def load(cls, checkpoint: Path) -> Prepared:
        """The claims in ``checkpoint`` (none when it does not exist); CheckpointError when it is unusable."""
        try:
            text = checkpoint.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(checkpoint)
        except OSError as exc:
            raise CheckpointError(f"cannot read {checkpoint}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
            claims = [PreparedClaim.from_json(c) for c in data["claims"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(
                f"{checkpoint} is not a checkpoint of prepared claims ({type(exc).__name__}: {exc}); "
                "move it away to start with no prepared claims"
            ) from None
        return cls(checkpoint, {claim.uid: claim for claim in claims})

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def __iter__(self) -> Iterator[PreparedClaim]:
        return iter(list(self._claims.values()))

    def __len__(self) -> int:
        return len(self._claims)

    def add(self, claim: PreparedClaim, spec: Mapping[str, Any]) -> None:
        """Write the claim's CDI spec, then record it in the checkpoint (OSError when either fails; the spec
        is removed again when the checkpoint cannot be written)."""
        path = Path(claim.spec_path)
        replace_file(path, json.dumps(spec, indent=1))
        self._claims[claim.uid] = claim
        try:
            self._save()
        except OSError:
            del self._claims[claim.uid]
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            raise

    def unprepare(self, uid: str) -> None:
        """Remove what was written for ``uid`` (nothing for an unknown claim); OSError when it cannot."""
        claim = self._claims.get(uid)
        if claim is None:
            return
        with contextlib.suppress(FileNotFoundError):
            Path(claim.spec_path).unlink()
        del self._claims[uid]
        try:
            self._save()
        except OSError:
            self._claims[uid] = claim
            raise

    def _save(self) -> None:
        document = {"version": CHECKPOINT_VERSION, "claims": [c.as_json() for c in self._claims.values()]}
        replace_file(self.checkpoint, json.dumps(document))
