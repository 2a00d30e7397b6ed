"""Out of file descriptors is not "no chips": the devfs backend in a process whose fd limit is reached, with
real device files and a fake npu-smi, keeps its chips and counts failed queries, then recovers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import FIXTURES, ROOT
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi

_SCRIPT = """
import asyncio, json, os, resource, sys
from pathlib import Path
from prometheus_client import REGISTRY
from ascend_agent.backends.devfs import DevfsBackend
from ascend_agent.backends.npusmi import NpuSmiError
from ascend_agent.backends.tool import run_npu_smi
from ascend_agent.config import Settings

def failures(reason):
    return REGISTRY.get_sample_value("ascend_agent_npu_smi_failures_total", {"reason": reason}) or 0

def summary(inventory):
    return [(chip.device_id, chip.health.value, chip.reason) for chip in inventory.chips]

async def main(host, npu_smi):
    backend = DevfsBackend(Settings(host_root=Path(host), npu_smi=npu_smi, npu_smi_timeout=5))
    await backend.query()
    before = summary(await backend.discover())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    hog = []
    try:
        while True:
            hog.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    listed = summary(await backend.discover())  # /dev cannot be listed now
    try:
        await run_npu_smi(npu_smi, ["info"], 5)
        raised = None
    except NpuSmiError as exc:
        raised = [exc.reason, str(exc)]
    await backend.query()
    during = summary(await backend.discover())
    counted = {reason: failures(reason) for reason in ("resources",)}
    for fd in hog:
        os.close(fd)
    await backend.query()
    after = summary(await backend.discover())
    print(json.dumps({"before": before, "listed": listed, "raised": raised, "during": during, "after": after,
                      "counted": counted}))

asyncio.run(main(*sys.argv[1:]))
"""


def _run(short_dir: Path) -> dict[str, object]:
    host = HostTree(short_dir / "host").add_driver().add_management().add_chips(range(8))
    npu_smi = FakeNpuSmi(short_dir / "npu-smi")
    npu_smi.set_output("info", (FIXTURES / "910B4x8-25.0.rc1.1-info.txt").read_text())
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(host.root), str(npu_smi.path)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    report: dict[str, object] = json.loads(result.stdout)
    report["log"] = result.stderr
    return report


def test_out_of_descriptors_keeps_the_chips_and_counts_a_failed_query(short_dir: Path) -> None:
    report = _run(short_dir)
    healthy = [[f"Ascend910-{i}", "Healthy", ""] for i in range(8)]
    assert report["before"] == healthy
    assert report["listed"] == healthy, "an unlistable /dev keeps the last known device nodes"
    assert "Cannot list" in str(report["log"]) and "keeping the last known device nodes" in str(report["log"])
    raised = report["raised"]
    assert isinstance(raised, list) and raised[0] == "resources", "starting npu-smi is an NpuSmiError"
    assert "out of file descriptors or memory" in raised[1]
    assert report["during"] == healthy, "one failed query keeps the last known health"
    assert report["counted"] == {"resources": 1}, "the backend's query counts; the direct run raised"
    assert report["after"] == healthy
