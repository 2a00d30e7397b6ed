"""The parts of `make bench-cluster` (tests/cluster/bench.py) that need no cluster: the count of a user's API
requests in a window of the audit log, and the time of a kubelet log line."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.cluster.bench import klog_time, requests_in

AGENT = "system:serviceaccount:kube-system:ascend-device-plugin"


def event(audit_id: str, user: str, received: str, stage: str, verb: str, resource: str) -> dict[str, Any]:
    return {
        "auditID": audit_id,
        "stage": stage,
        "verb": verb,
        "user": {"username": user},
        "requestURI": f"/api/v1/{resource}",
        "objectRef": {"resource": resource},
        "requestReceivedTimestamp": received,
    }


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_requests_in_a_window_count_once_each_and_only_the_users(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    events = [
        # before the window: a watch still open in it is no request of the window
        event("w", AGENT, "2026-12-04T20:00:00.000000Z", "ResponseStarted", "watch", "pods"),
        # in the window: a request seen at two stages counts once
        event("a", AGENT, "2026-12-04T20:00:10.500000Z", "ResponseStarted", "watch", "pods"),
        event("a", AGENT, "2026-12-04T20:00:10.500000Z", "ResponseComplete", "watch", "pods"),
        event("b", AGENT, "2026-12-04T20:00:20.000000Z", "ResponseComplete", "get", "configmaps"),
        event("c", AGENT, "2026-12-04T20:00:30.000000Z", "ResponseComplete", "get", "configmaps"),
        event(
            "d", "system:node:ascend-e2e", "2026-12-04T20:00:30.000000Z", "ResponseComplete", "get", "nodes"
        ),
        # at the end: outside
        event("e", AGENT, "2026-12-04T20:01:10.000000Z", "ResponseComplete", "get", "configmaps"),
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in events))

    counted = requests_in(log, AGENT, at("2026-12-04T20:00:10"), at("2026-12-04T20:01:10"))

    assert counted == {"watch pods": 1, "get configmaps": 2}


def test_a_klog_line_gives_its_local_time() -> None:
    line = 'I1204 20:20:24.063673    5949 server.go:161] "Got registration request from device plugin"'
    stamp = datetime.fromtimestamp(klog_time(line))
    assert (stamp.month, stamp.day, stamp.hour, stamp.minute, stamp.second) == (12, 4, 20, 20, 24)
    assert stamp.microsecond == 63673
