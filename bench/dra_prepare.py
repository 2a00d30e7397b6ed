"""NodePrepareResources of many DRA claims in one call: three calls of 1,000 claims each (300 with
``--quick``) against the DRA service in-process, the claims' allocations already read (what is measured is
the CDI specs and the checkpoint), the checkpoint on disk under /var/tmp and the CDI specs on a tmpfs
(/dev/shm), as /var/lib/kubelet/plugins and /var/run/cdi are on a node. The kubelet gives a call 45 s."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path

import anyio

from ascend_agent.kubelet.dra.claimread import Allocated, ClaimReader, ClaimRef
from ascend_agent.kubelet.dra.claims import Prepared, PreparedClaim
from ascend_agent.kubelet.dra.service import DraService
from ascend_agent.model import Chip, ContainerSpec
from bench._common import Row, quick, report

DRIVER = "npu.huawei.com"
CALLS = 3
KUBELET_TIMEOUT = 45.0


class _ReadBefore(ClaimReader):
    """Allocations known before the call: the API server's part is not measured."""

    def __init__(self) -> None:
        super().__init__(lambda: None, DRIVER, "node-1")
        self.results: dict[str, tuple[Allocated, ...]] = {}

    async def allocated(self, claim: ClaimRef) -> tuple[Allocated, ...]:
        return self.results[claim.uid]


async def _calls(per_call: int) -> list[float]:
    state = Path(tempfile.mkdtemp(prefix="bench-dra-", dir="/var/tmp"))
    cdi = Path(tempfile.mkdtemp(prefix="bench-dra-", dir="/dev/shm"))
    try:
        reader = _ReadBefore()
        service = DraService(DRIVER, "node-1", Prepared(state / "checkpoint.json", cdi, DRIVER), reader)
        # A device per claim: a device held by one prepared claim is refused to the others.
        chips = [Chip.make(i, "910B4") for i in range(per_call * CALLS)]
        service.publish(chips, lambda chips: ContainerSpec())
        seconds = []
        for call in range(CALLS):
            claims = [ClaimRef("default", f"c{call}-{i}", str(uuid.uuid4())) for i in range(per_call)]
            first = call * per_call
            reader.results.update(
                {c.uid: (Allocated("npus", f"npu-{first + i}"),) for i, c in enumerate(claims)}
            )
            start = time.monotonic()
            answers = await service.prepare(claims)
            seconds.append(time.monotonic() - start)
            assert all(isinstance(answer, PreparedClaim) for answer in answers.values())
        return seconds
    finally:
        shutil.rmtree(state)
        shutil.rmtree(cdi)


def main() -> None:
    per_call = 300 if quick() else 1000
    seconds = anyio.run(_calls, per_call)
    rows = [
        Row(
            f"call {n + 1}: {per_call} claims",
            took,
            None,
            "s",
            f"< {KUBELET_TIMEOUT:g}",
            took < KUBELET_TIMEOUT,
        )
        for n, took in enumerate(seconds)
    ]
    report("dra_prepare", rows)


if __name__ == "__main__":
    main()
