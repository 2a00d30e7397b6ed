"""What `make bench-scale` reads from the API server's audit log: each agent's requests, by the Node its token
is bound to, its densest second and its spacing after a refusal."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cluster.scale import AuditRecord, densest_second, read_audit, retry_gaps


def _event(stage: str, verb: str, at: str, node: str = "scale-0001", code: int = 200) -> str:
    return json.dumps(
        {
            "stage": stage,
            "verb": verb,
            "requestURI": f"/api/v1/nodes/{node}",
            "requestReceivedTimestamp": at,
            "objectRef": {"resource": "nodes", "name": node},
            "responseStatus": {"code": code},
            "user": {
                "username": "system:serviceaccount:kube-system:ascend-device-plugin",
                "extra": {"authentication.kubernetes.io/node-name": [node]},
            },
        }
    )


def test_a_watch_counts_when_it_starts_and_any_other_request_when_answered(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text(
        "\n".join(
            [
                _event("ResponseStarted", "watch", "2026-12-07T10:00:01.000000Z"),
                _event("ResponseComplete", "watch", "2026-12-07T10:00:01.000000Z"),
                _event("ResponseComplete", "get", "2026-12-07T10:00:02.500000Z", node="scale-0002"),
                _event("ResponseComplete", "get", "2026-12-07T10:09:00.000000Z"),  # after the window
            ]
        )
        + "\n"
    )
    since = 1796637600.0  # 2026-12-07T10:00:00Z
    records = read_audit(log, since, since + 60)
    assert [(r.node, r.verb, r.resource) for r in records] == [
        ("scale-0001", "watch", "nodes"),
        ("scale-0002", "get", "nodes"),
    ]
    assert records[1].at == since + 2.5


def _record(node: str, at: float, code: int = 200) -> AuditRecord:
    return AuditRecord(node=node, verb="get", resource="nodes", code=code, at=at, uri="/api/v1/nodes/x")


def test_the_densest_second_is_one_agents_not_the_fleets() -> None:
    records = [_record("a", 10.1), _record("a", 10.9), _record("b", 10.5), _record("a", 11.2)]
    assert densest_second(records) == 2


def test_the_gap_after_a_refusal_is_measured_per_agent_and_call() -> None:
    records = [
        _record("a", 1.0, code=429),
        _record("b", 1.1, code=500),
        _record("a", 3.5),
        _record("b", 1.6),
        _record("a", 4.0),  # after a success: not a retry
    ]
    assert sorted(retry_gaps(records)) == [0.5, 2.5]
