"""vNPUs made and removed on a devfs node (a fake npu-smi answering the shared samples): time from the
``/dev/vdavinci*`` nodes appearing or disappearing to the kubelet stand-in's device lists showing it."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from bench._common import Row, devfs_flags, grpc_api, kubelet, quick, report, start_agent, stats
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi
from tests.support.vnpu_node import INFO_VNPU_NONE, INFO_VNPU_TWO, NOT_SUPPORTED, TEMPLATE_INFO, info_310p

CHIPS = "huawei.com/Ascend310P"
TWO = "huawei.com/Ascend310P-2c"
# The bound: the kubelet sees a vNPU made or removed on the node within 2 s.
TARGET = 2.0


def _row(name: str, samples: list[float]) -> Row:
    median, p99 = stats(samples)
    return Row(name, median * 1e3, p99 * 1e3, "ms", f"p99 < {TARGET * 1e3:g}", p99 < TARGET)


def main() -> None:
    repetitions = 10 if quick() else 40
    api = grpc_api()
    with kubelet(api) as standin:
        root = Path(tempfile.mkdtemp(prefix="bench-vnpu-", dir="/tmp"))
        host = HostTree(root / "host").add_driver().add_management().add_chips([0, 1, 2])
        npu_smi = FakeNpuSmi(root / "npu-smi")
        npu_smi.set_output("info", info_310p([0, 1, 2]))
        npu_smi.set_error("info -t info-vnpu -i 0 -c 0", NOT_SUPPORTED)
        npu_smi.set_output("info -t info-vnpu -i 1 -c 0", INFO_VNPU_NONE)
        npu_smi.set_output("info -t info-vnpu -i 2 -c 0", INFO_VNPU_NONE)
        npu_smi.set_output("info -t template-info -i 1", TEMPLATE_INFO)
        agent = start_agent(
            standin.directory, *devfs_flags(host.root, npu_smi.path), "--health-interval", "600"
        )
        whole = {"Ascend310P-0", "Ascend310P-1", "Ascend310P-2"}

        def chips() -> set[str] | None:
            update = standin.latest(CHIPS)
            return None if update is None else set(update.health())

        def split() -> bool:
            two = standin.latest(TWO)
            return (
                chips() == whole - {"Ascend310P-1"}
                and two is not None
                and two.health() == {"Ascend310P-2c-117-1": "Healthy"}
            )

        made, removed = [], []
        try:
            standin.wait_for(lambda: chips() == whole)
            for _ in range(repetitions):
                npu_smi.set_output("info -t info-vnpu -i 1 -c 0", INFO_VNPU_TWO)
                started = time.monotonic()
                for vnpu_id in (116, 117):
                    (host.dev / f"vdavinci{vnpu_id}").write_text("")
                standin.wait_for(split, timeout=10)
                made.append(time.monotonic() - started)
                npu_smi.set_output("info -t info-vnpu -i 1 -c 0", INFO_VNPU_NONE)
                started = time.monotonic()
                for vnpu_id in (116, 117):
                    (host.dev / f"vdavinci{vnpu_id}").unlink()
                standin.wait_for(lambda: chips() == whole, timeout=10)
                removed.append(time.monotonic() - started)
        finally:
            agent.close()
            shutil.rmtree(root, ignore_errors=True)
    report(
        "vnpu",
        [
            _row("vNPUs made on chip 1 -> split in the kubelet's lists", made),
            _row("vNPUs removed -> chip 1 whole in the kubelet's list", removed),
        ],
    )


if __name__ == "__main__":
    main()
