"""The grpc-go kubelet stand-in (``tests/interop/kubelet/``, built by ``make interop``) as a process.

It behaves as the kubelet's device manager (and, with ``registry_dir``, its plugin watcher) does, on grpc-go:
the dial and reconnect behaviour of the real kubelet. Commands go to its stdin; its events (JSON lines with a
CLOCK_MONOTONIC timestamp, the clock of ``time.monotonic()``) are read in a thread. Tests wait on what it saw,
never on time:

    with GoKubelet(short_dir / "kubelet") as kubelet:
        agent = fake_agent(kubelet.directory)
        kubelet.wait_registrations(1)
        update = kubelet.wait_update(lambda u: len(u.devices) == 8)
        answer = kubelet.allocate("huawei.com/Ascend910", ["Ascend910-0"])
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support import PATIENCE, ROOT

BINARY = Path(os.environ.get("KUBELET_STANDIN", ROOT / "build" / "interop" / "kubelet-standin"))
RESOURCE = "huawei.com/Ascend910"


@dataclass(frozen=True)
class Event:
    """One line the stand-in printed: its name, when (``time.monotonic()`` seconds) and the rest."""

    kind: str
    at: float
    fields: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


@dataclass(frozen=True)
class Registration:
    """A registration that got as far as the dial-back and GetDevicePluginOptions."""

    resource: str
    socket: str
    registry: str
    options: dict[str, bool]
    at: float


@dataclass(frozen=True)
class Update:
    """One ListAndWatch message: (id, health, NUMA nodes) for each device."""

    resource: str
    devices: list[tuple[str, str, list[int]]]
    at: float

    def health(self) -> dict[str, str]:
        return {device_id: health for device_id, health, _ in self.devices}


@dataclass(frozen=True)
class Answer:
    """An Allocate or GetPreferredAllocation answer: the response (field names as in the .proto) or the gRPC
    status code name (``InvalidArgument``) and message."""

    ok: bool
    response: dict[str, Any]
    code: str
    message: str


class GoKubelet:
    def __init__(self, directory: Path, registry_dir: Path | None = None, binary: Path = BINARY) -> None:
        self.directory = directory
        self.registry_dir = registry_dir
        self.binary = binary
        self.events: list[Event] = []
        self.registrations: list[Registration] = []
        self.updates: list[Update] = []
        self.output: list[str] = []  # what was not an event: Go's own complaints
        self._by_kind: dict[str, list[Event]] = {}
        self._cond = threading.Condition()
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._exited = False

    # lifecycle ------------------------------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> GoKubelet:
        # A kubelet makes its plugins directory beside device-plugins; the agent's own one goes in it.
        (self.directory.parent / "plugins").mkdir(parents=True, exist_ok=True)
        arguments = [str(self.binary), "--dir", str(self.directory)]
        if self.registry_dir is not None:
            arguments += ["--registry-dir", str(self.registry_dir)]
        self._proc = subprocess.Popen(
            arguments,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_event("listening", timeout=timeout)
        return self

    def close(self, timeout: float = 10.0) -> None:
        """``quit``: it closes every connection and exits; killed if it does not within ``timeout``."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            try:
                self._send("quit")
                self._proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait(timeout)
        if self._reader is not None:
            self._reader.join(timeout)
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()
        self._proc = None

    def __enter__(self) -> GoKubelet:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    @property
    def socket(self) -> Path:
        return self.directory / "kubelet.sock"

    def plugin_socket(self, resource: str = RESOURCE) -> Path:
        return self.directory / (resource.rpartition("/")[2] + ".sock")

    # commands -------------------------------------------------------------------------------------------
    def restart(self, timeout: float = 10.0) -> Event:
        """A kubelet restart: connections closed, every socket in the directory removed, kubelet.sock served
        again (and the registry directory scanned again). Returns the new ``listening`` event."""
        listening = self.count("listening")
        restarted = self.count("restarted")
        errors = self.count("error")
        self._send("restart")
        self.wait_for(
            lambda: self.count("restarted") > restarted or self.count("error") > errors, timeout, "restarted"
        )
        self._raise_new_error(errors)
        return self._by_kind["listening"][listening]

    def allocate(self, resource: str, device_ids: Iterable[str], timeout: float = 15.0) -> Answer:
        return self._call("allocate", f"allocate {resource} {_ids(device_ids)}", timeout)

    def preferred(
        self,
        resource: str,
        size: int,
        available: Iterable[str],
        must_include: Iterable[str] = (),
        timeout: float = 15.0,
    ) -> Answer:
        command = f"preferred {resource} {size} {_ids(available)} {_ids(must_include)}"
        return self._call("preferred", command, timeout)

    def end_stream(self, resource: str = RESOURCE, timeout: float = 10.0) -> None:
        """End the resource's ListAndWatch stream, as a kubelet that dropped it does (it never re-dials)."""
        ended = self.count("stream-ended")
        errors = self.count("error")
        self._send(f"end-stream {resource}")
        self.wait_for(
            lambda: self.count("stream-ended") > ended or self.count("error") > errors,
            timeout,
            "stream-ended",
        )
        self._raise_new_error(errors)

    # what it saw ----------------------------------------------------------------------------------------
    def count(self, kind: str) -> int:
        with self._cond:
            return len(self._by_kind.get(kind, []))

    def of_kind(self, kind: str, after: int = 0) -> list[Event]:
        with self._cond:
            return list(self._by_kind.get(kind, [])[after:])

    def wait_for(
        self, predicate: Callable[[], bool], timeout: float = PATIENCE, what: str = "condition"
    ) -> None:
        with self._cond:
            if self._cond.wait_for(lambda: predicate() or self._exited, timeout) and not self._exited:
                return
            if predicate():
                return
            state = "exited" if self._exited else f"timed out after {timeout} s"
            recent = [f"{e.kind} {json.dumps(e.fields)}" for e in self.events[-8:]]
            raise AssertionError(
                f"grpc-go kubelet stand-in {state} waiting for {what}; registrations="
                f"{len(self.registrations)} updates={len(self.updates)}; last events:\n  "
                + "\n  ".join(recent)
                + ("\noutput:\n" + "\n".join(self.output) if self.output else "")
            )

    def wait_event(
        self,
        kind: str,
        predicate: Callable[[Event], bool] = lambda _: True,
        after: int = 0,
        timeout: float = 10.0,
    ) -> Event:
        """The first event of ``kind``, from that kind's index ``after`` on, for which ``predicate`` holds."""
        found: list[Event] = []

        def check() -> bool:
            found[:] = [e for e in self._by_kind.get(kind, [])[after:] if predicate(e)][:1]
            return bool(found)

        self.wait_for(check, timeout, kind)
        return found[0]

    def wait_registrations(self, count: int, timeout: float = PATIENCE) -> list[Registration]:
        self.wait_for(lambda: len(self.registrations) >= count, timeout, f"{count} registration(s)")
        with self._cond:
            return list(self.registrations)

    def wait_update(
        self,
        predicate: Callable[[Update], bool],
        after: int = 0,
        timeout: float = PATIENCE,
        what: str = "update",
    ) -> Update:
        """The first update from index ``after`` on for which ``predicate`` holds."""
        found: list[Update] = []

        def check() -> bool:
            found[:] = [u for u in self.updates[after:] if predicate(u)][:1]
            return bool(found)

        self.wait_for(check, timeout, what)
        return found[0]

    def latest(self, resource: str = RESOURCE) -> Update | None:
        with self._cond:
            return next((u for u in reversed(self.updates) if u.resource == resource), None)

    # internals ------------------------------------------------------------------------------------------
    def _send(self, command: str) -> None:
        assert self._proc is not None and self._proc.stdin is not None, "the stand-in is not running"
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()

    def _call(self, kind: str, command: str, timeout: float) -> Answer:
        answers = self.count(kind)
        errors = self.count("error")
        self._send(command)
        self.wait_for(lambda: self.count(kind) > answers or self.count("error") > errors, timeout, kind)
        self._raise_new_error(errors)
        event = self._by_kind[kind][answers]
        return Answer(
            event["ok"],
            event.fields.get("response", {}),
            event.fields.get("code", ""),
            event.fields.get("message", ""),
        )

    def _raise_new_error(self, before: int) -> None:
        errors = self.of_kind("error", before)
        if errors:
            raise AssertionError(f"grpc-go kubelet stand-in: {errors[0]['message']}")

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            with self._cond:
                if isinstance(record, dict) and "event" in record:
                    self._record(record)
                else:
                    self.output.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._exited = True
            self._cond.notify_all()

    def _record(self, record: dict[str, Any]) -> None:
        kind = record.pop("event")
        event = Event(kind, record.pop("t") / 1e9, record)
        self.events.append(event)
        self._by_kind.setdefault(kind, []).append(event)
        if kind == "registered":
            self.registrations.append(
                Registration(
                    record["resource"], record["socket"], record["registry"], record["options"], event.at
                )
            )
        elif kind == "devices":
            devices = [(d["id"], d["health"], d["numa"]) for d in record["devices"]]
            self.updates.append(Update(record["resource"], devices, event.at))


def _ids(device_ids: Iterable[str]) -> str:
    return ",".join(device_ids) or "-"
