"""What the agent costs a node: start -> registered, resident memory, idle CPU, import time."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._common import ROOT, Row, devfs_flags, grpc_api, kubelet, quick, report, start_agent, stats
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi

B4_INFO = (ROOT / "tests/fixtures/npu-smi/910B4x8-25.0.rc1.1-info.txt").read_text()
CLOCK = 100  # USER_HZ: /proc/<pid>/stat counts CPU time in these ticks


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """(own utime+stime, waited-for children's) in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK, (int(fields[13]) + int(fields[14])) / CLOCK


def _idle(flags: list[str], standin_api: tuple[object, object], seconds: float) -> tuple[float, float]:
    with kubelet(standin_api) as standin:  # type: ignore[arg-type]
        agent = start_agent(standin.directory, *flags)
        try:
            standin.wait_registrations(1)
            standin.wait_update(lambda u: len(u.devices) > 0)
            own, children = _cpu_seconds(agent.proc.pid)
            time.sleep(seconds)  # the measurement itself: the agent left alone
            own_after, children_after = _cpu_seconds(agent.proc.pid)
        finally:
            agent.close()
    return (own_after - own) / seconds * 100, (children_after - children) / seconds * 100


def main() -> None:
    api = grpc_api()
    rows = []
    with kubelet(api) as standin:
        starts, stops = [], []
        for _ in range(5 if quick() else 10):
            count = len(standin.registrations)
            started = time.monotonic()
            agent = start_agent(standin.directory)
            try:
                standin.wait_registrations(count + 1)
                starts.append(standin.registrations[count].at - started)
                standin.wait_update(lambda u: len(u.devices) == 8, after=len(standin.updates) - 1)
                code, seconds = agent.terminate()  # with the kubelet's stream open
                assert code == 0
                stops.append(seconds)
            finally:
                agent.close()
        median, p99 = stats(starts)
        rows.append(Row("start -> registered", median * 1e3, p99 * 1e3, "ms", "< 1000", p99 < 1.0))
        median, p99 = stats(stops)
        rows.append(
            Row("SIGTERM -> exited, sockets removed", median * 1e3, p99 * 1e3, "ms", "< 1000", p99 < 1.0)
        )
    for chips in (8, 128):
        with kubelet(api) as standin:
            agent = start_agent(standin.directory, "--fake-chips", str(chips))
            try:
                standin.wait_registrations(1)
                standin.wait_update(lambda u, n=chips: len(u.devices) == n)
                rss = agent.rss_kib() / 1024
            finally:
                agent.close()
        rows.append(Row(f"RSS after registration, {chips} devices", rss, None, "MB", "< 40 (128)", rss < 40))
    seconds = 10.0 if quick() else 60.0
    own, _ = _idle([], api, seconds)
    rows.append(Row(f"idle CPU, fake backend, {seconds:.0f} s", own, None, "% of a core", "< 0.1", own < 0.1))
    scratch = Path(tempfile.mkdtemp(prefix="bench-fp-", dir="/tmp"))
    host = HostTree(scratch / "host").add_driver().add_management().add_chips(range(8))
    npu_smi = FakeNpuSmi(scratch / "npu-smi")
    npu_smi.set_output("info", B4_INFO)
    own, children = _idle(devfs_flags(host.root, npu_smi.path), api, seconds)
    rows.append(
        Row(
            f"idle CPU, devfs, health every 5 s, {seconds:.0f} s",
            own,
            None,
            "% of a core",
            "< 0.1",
            own < 0.1,
        )
    )
    rows.append(Row("  + its fake npu-smi children (a Python script here)", children, None, "% of a core"))
    imports = []
    for _ in range(5):
        result = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "import ascend_agent.reconciler"],
            capture_output=True,
            text=True,
            check=True,
        )
        imports.append(int(result.stderr.strip().splitlines()[-1].split("|")[1]) / 1000)
    rows.append(Row("import ascend_agent.reconciler", *stats(imports), "ms"))
    versions = []
    for _ in range(5):
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "ascend_agent", "version"], capture_output=True, check=True)
        versions.append((time.monotonic() - started) * 1e3)
    rows.append(Row("ascend-agent version (wall)", *stats(versions), "ms"))
    report("footprint", rows)


if __name__ == "__main__":
    main()
