"""Reaction times: how long until the kubelet's view is true again. Against the grpcio kubelet stand-in, and
for a kubelet restart also against the grpc-go one (built by ``make interop``) in both registration modes."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from bench._common import Row, devfs_flags, grpc_api, kubelet, quick, report, start_agent, stats
from tests.support.gokubelet import BINARY, GoKubelet
from tests.support.host_tree import HostTree
from tests.support.npusmi_fake import FakeNpuSmi

B4_INFO = (
    Path(__file__).resolve().parent.parent / "tests/fixtures/npu-smi/910B4x8-25.0.rc1.1-info.txt"
).read_text()
# The kubelet's own gRPC stack waits 1 s before redialling an endpoint that was not there: 20 ms shows none.
GO_TARGET = 0.020
TARGET = 0.050


def _write_state(path: Path, state: dict[str, list[int]]) -> None:
    temporary = path.with_name(".state.tmp")
    temporary.write_text(json.dumps(state))
    temporary.rename(path)


def _row(name: str, samples: list[float], target: float = TARGET) -> Row:
    median, p99 = stats(samples)
    return Row(name, median * 1e3, p99 * 1e3, "ms", f"p99 < {target * 1e3:g}", p99 < target)


def main() -> None:
    repetitions = 20 if quick() else 60
    api = grpc_api()
    rows = []
    with kubelet(api) as standin:
        state = standin.directory.parent / "state.json"
        state.write_text("{}")
        # A fault and its recovery 60 times over is what the flap hold exists for: off, to time the events.
        agent = start_agent(standin.directory, "--fake-state", str(state), "--flap-threshold", "0")
        try:
            standin.wait_registrations(1)
            restart, listed, deleted, fault, recovery = [], [], [], [], []
            for _ in range(repetitions):
                count = len(standin.registrations)
                after = len(standin.updates)
                standin.stop()
                started = time.monotonic()
                standin.start()  # removes every socket, then kubelet.sock appears
                standin.wait_registrations(count + 1)
                restart.append(standin.registrations[count].at - started)
                update = standin.wait_update(lambda u: len(u.devices) == 8, after=after)
                listed.append(update.at - started)

                count = len(standin.registrations)
                started = time.monotonic()
                standin.plugin_socket().unlink()
                standin.wait_registrations(count + 1)
                deleted.append(standin.registrations[count].at - started)

                after = len(standin.updates)
                started = time.monotonic()
                _write_state(state, {"unhealthy": [3]})
                update = standin.wait_update(lambda u: u.health()["Ascend910-3"] == "Unhealthy", after=after)
                fault.append(update.at - started)

                after = len(standin.updates)
                started = time.monotonic()
                _write_state(state, {})
                update = standin.wait_update(lambda u: set(u.health().values()) == {"Healthy"}, after=after)
                recovery.append(update.at - started)
            rows += [
                _row("kubelet restart -> registered", restart),
                _row("kubelet restart -> full device list (grpcio)", listed),
                _row("own socket deleted -> registered", deleted),
                _row("fault in state file -> on the stream", fault),
                _row("recovery in state file -> on the stream", recovery),
            ]
        finally:
            agent.close()
    rows += _go_restarts(repetitions, watcher=False)
    rows += _go_restarts(repetitions, watcher=True)
    rows += _devfs(api, repetitions)
    report("react", rows)


def _go_restarts(repetitions: int, *, watcher: bool) -> list[Row]:
    """Kubelet restart -> the full device list at the grpc-go stand-in: kubelet.sock served again (or, with
    ``watcher``, the registry directory rescanned) until the first complete ListAndWatch message."""
    mode = "plugin-watcher" if watcher else "kubelet.sock"
    if not BINARY.exists():
        print(f"note: no grpc-go rows ({mode}): {BINARY} is not built; `make interop` builds it")
        return []
    scratch = Path(tempfile.mkdtemp(prefix="bench-go-", dir="/tmp"))
    registry = scratch / "registry" if watcher else None
    flags = ["--registration", "plugin-watcher", "--plugins-registry-dir", str(registry)] if watcher else []
    flags += ["--plugin-dir", str(scratch / "plugins")] if watcher else []
    with GoKubelet(scratch / "k", registry) as standin:
        agent = start_agent(standin.directory, *flags)
        try:
            try:
                agent.wait_log(r"Found device /dev/davinci7$")
            except AssertionError:
                said = [line.strip("│╭╰─╮╯ ") for line in agent.output.splitlines()]
                reason = next((line for line in reversed(said) if line), "no output")
                print(f"note: no grpc-go rows ({mode}): the agent did not start: {reason}")
                return []
            standin.wait_registrations(1)
            standin.wait_update(lambda u: len(u.devices) == 8)
            samples = []
            for _ in range(repetitions):
                after = len(standin.updates)
                listening = standin.restart()
                update = standin.wait_update(lambda u: len(u.devices) == 8, after=after, timeout=15)
                samples.append(update.at - listening.at)
        finally:
            agent.close()
    return [_row(f"kubelet restart -> full device list (grpc-go, {mode})", samples, GO_TARGET)]


def _devfs(api: tuple[object, object], repetitions: int) -> list[Row]:
    scratch = Path(tempfile.mkdtemp(prefix="bench-dev-", dir="/tmp"))
    host = HostTree(scratch / "host").add_driver().add_management().add_chips(range(8))
    npu_smi = FakeNpuSmi(scratch / "npu-smi")
    npu_smi.set_output("info", B4_INFO)
    with kubelet(api) as standin:  # type: ignore[arg-type]
        # Removing one chip's node again and again is what the flap hold exists for: off, to time the events.
        agent = start_agent(standin.directory, *devfs_flags(host.root, npu_smi.path), "--flap-threshold", "0")
        try:
            standin.wait_registrations(1)
            standin.wait_update(lambda u: len(u.devices) == 8)
            removed, returned = [], []
            for _ in range(repetitions):
                after = len(standin.updates)
                started = time.monotonic()
                (host.dev / "davinci3").unlink()
                update = standin.wait_update(lambda u: u.health()["Ascend910-3"] == "Unhealthy", after=after)
                removed.append(update.at - started)
                after = len(standin.updates)
                started = time.monotonic()
                (host.dev / "davinci3").write_text("")
                update = standin.wait_update(lambda u: set(u.health().values()) == {"Healthy"}, after=after)
                returned.append(update.at - started)
        finally:
            agent.close()
    return [
        _row("devfs: /dev/davinci3 removed -> on the stream", removed),
        _row("devfs: /dev/davinci3 back -> on the stream", returned),
    ]


if __name__ == "__main__":
    main()
