"""Events for chip health transitions against the Kubernetes API emulator: one per transition, repeats counted
on the same object, and a flapping chip bounded to a handful of writes."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from ascend_agent.cluster.client import KubeApi
from ascend_agent.cluster.credentials import ClusterTarget
from ascend_agent.cluster.events import NodeEvents, PodEvent
from ascend_agent.model import Chip, Fault, Health, Inventory
from tests.support.apiserver import ApiServer

HEALTHY = Chip.make(3, "910B3")
FAULTY = HEALTHY.with_health(Health.UNHEALTHY, "Health Alarm from npu-smi")
FAULTY = Chip(**{**{f: getattr(FAULTY, f) for f in FAULTY.__slots__}, "faults": (Fault("80E3A203"),)})
HELD = Chip(**{**{f: getattr(FAULTY, f) for f in FAULTY.__slots__}, "held": True})
UNKNOWN = HEALTHY.with_health(Health.UNHEALTHY, "health unknown: npu-smi failed 3 times in a row: ret -8020")
UNKNOWN = Chip(**{**{f: getattr(UNKNOWN, f) for f in UNKNOWN.__slots__}, "health_unknown": True})


def _inventory(*chips: Chip) -> Inventory:
    return Inventory(chips=(Chip.make(0, "910B3"), *chips))


async def _wait(apiserver: ApiServer, read: Callable[[], Any], ready: Callable[[Any], bool]) -> Any:
    return await anyio.to_thread.run_sync(lambda: apiserver.wait_for(read, ready, timeout=5))


@asynccontextmanager
async def _running(apiserver: ApiServer) -> AsyncIterator[NodeEvents]:
    """NodeEvents with its task (a fixture's teardown would run in another task than its task group)."""
    apiserver.put("nodes", {"metadata": {"name": "node-1"}})
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1")
    feature = NodeEvents(min_interval=0.5)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(feature.run, api)
        yield feature
        tasks.cancel_scope.cancel()
    await api.close()


def _by_reason(apiserver: ApiServer) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for event in apiserver.list("events", "default"):
        found.setdefault(event["reason"], []).append(event)
    return found


async def test_one_event_per_transition(apiserver: ApiServer) -> None:
    async with _running(apiserver) as events:
        events.observe(_inventory(HEALTHY))
        events.observe(_inventory(FAULTY))
        (unhealthy,) = (await _wait(apiserver, lambda: _by_reason(apiserver), lambda f: "NPUUnhealthy" in f))[
            "NPUUnhealthy"
        ]
        assert unhealthy["type"] == "Warning"
        assert (
            unhealthy["message"]
            == "Ascend910-3 is Unhealthy: Health Alarm from npu-smi (fault codes 80E3A203)"
        )
        assert unhealthy["involvedObject"] == {
            "kind": "Node",
            "name": "node-1",
            "uid": "node-1",
            "apiVersion": "v1",
        }
        assert unhealthy["source"] == {"component": "ascend-agent", "host": "node-1"}
        assert unhealthy["reportingComponent"] == "ascend-agent"
        assert unhealthy["count"] == 1
        events.observe(_inventory(HELD))
        events.observe(_inventory(HEALTHY))
        found = await _wait(
            apiserver, lambda: _by_reason(apiserver), lambda f: "NPUHealthy" in f and "NPUHeld" in f
        )
        assert found["NPUHeld"][0]["type"] == "Warning"
        assert found["NPUHeld"][0]["message"].startswith("Ascend910-3 is held Unhealthy: ")
        assert (found["NPUHealthy"][0]["type"], found["NPUHealthy"][0]["message"]) == (
            "Normal",
            "Ascend910-3 is Healthy again",
        )
        assert sum(map(len, found.values())) == 3


async def test_a_network_unhealthy_chip_raises_its_own_events_and_stays_healthy(apiserver: ApiServer) -> None:
    link_down = "RoCE link DOWN for 20 s or more (hccn_tool -link -g)"
    down = Chip(**{**{f: getattr(HEALTHY, f) for f in HEALTHY.__slots__}, "network_fault": link_down})
    async with _running(apiserver) as events:
        events.observe(_inventory(HEALTHY))
        events.observe(_inventory(down))
        events.observe(_inventory(down))
        (event,) = (
            await _wait(apiserver, lambda: _by_reason(apiserver), lambda f: "NPUNetworkUnhealthy" in f)
        )["NPUNetworkUnhealthy"]
        assert (event["type"], event["message"], event["count"]) == (
            "Warning",
            f"Ascend910-3 network is unhealthy: {link_down}",
            1,
        )
        events.observe(_inventory(HEALTHY))
        found = await _wait(apiserver, lambda: _by_reason(apiserver), lambda f: "NPUNetworkHealthy" in f)
        assert (found["NPUNetworkHealthy"][0]["type"], found["NPUNetworkHealthy"][0]["message"]) == (
            "Normal",
            "Ascend910-3 network is healthy again",
        )
        assert sorted(found) == ["NPUNetworkHealthy", "NPUNetworkUnhealthy"], "no NPUUnhealthy: still Healthy"


async def test_an_address_that_changes_is_a_warning_event(apiserver: ApiServer) -> None:
    fields = {f: getattr(HEALTHY, f) for f in HEALTHY.__slots__}
    first = Chip(**{**fields, "device_ip": "29.1.0.3"})
    moved = Chip(**{**fields, "device_ip": "29.1.0.9"})
    async with _running(apiserver) as events:
        events.observe(_inventory(HEALTHY))
        events.observe(_inventory(first))  # an address learnt is no change
        events.observe(_inventory(first))
        events.observe(_inventory(moved))
        (event,) = (
            await _wait(apiserver, lambda: _by_reason(apiserver), lambda f: "NPUAddressChanged" in f)
        )["NPUAddressChanged"]
        assert (event["type"], event["message"]) == (
            "Warning",
            "Ascend910-3 device IP changed from 29.1.0.3 to 29.1.0.9: pods placed on it before keep the old "
            "address in their configuration and rank tables",
        )
        assert sorted(_by_reason(apiserver)) == ["NPUAddressChanged"]


async def test_a_flapping_chip_counts_on_one_event_with_few_writes(apiserver: ApiServer) -> None:
    async with _running(apiserver) as events:
        events.observe(_inventory(HEALTHY))
        for _ in range(100):
            events.observe(_inventory(FAULTY))
            events.observe(_inventory(HEALTHY))
            await anyio.sleep(0)
        found = await _wait(
            apiserver,
            lambda: _by_reason(apiserver),
            lambda f: (
                [e["count"] for e in f.get("NPUUnhealthy", [])] == [100]
                and [e["count"] for e in f.get("NPUHealthy", [])] == [100]
            ),
        )
        unhealthy = found["NPUUnhealthy"][0]
        assert unhealthy["lastTimestamp"] >= unhealthy["firstTimestamp"]
        writes = [s for s in apiserver.seen() if s.resource == "events"]
        assert len(writes) <= 6, [(s.verb, s.data) for s in writes]
        assert {s.verb for s in writes} == {"create", "patch"}


async def test_events_wait_out_an_outage_and_keep_their_count(apiserver: ApiServer) -> None:
    async with _running(apiserver) as events:
        apiserver.fail(500, verb="create", resource="events")
        events.observe(_inventory(HEALTHY))
        events.observe(_inventory(FAULTY))
        events.observe(_inventory(HEALTHY))
        events.observe(_inventory(FAULTY))
        await _wait(apiserver, lambda: len(apiserver.seen()), lambda n: n >= 2)
        apiserver.behave()
        found = await _wait(
            apiserver,
            lambda: _by_reason(apiserver),
            lambda f: [e["count"] for e in f.get("NPUUnhealthy", [])] == [2] and "NPUHealthy" in f,
        )
        assert len(found["NPUUnhealthy"]) == 1


async def test_a_chip_flapping_between_two_faults_makes_few_writes(apiserver: ApiServer) -> None:
    """Each turn is written (or held back) before the next, as when turns are a health interval apart."""
    apiserver.put("nodes", {"metadata": {"name": "node-1"}})
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1")
    events = NodeEvents(min_interval=30)
    codes = ("80E3A203", "80CB8009")
    faults = [FAULTY.with_health(Health.UNHEALTHY, f"Health Alarm {code}") for code in codes]

    def idle() -> bool:
        now = time.monotonic()
        return all(r.written_count == r.count or r.next_write > now for r in events._records.values())

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(events.run, api)
        events.observe(_inventory(HEALTHY))
        for turn in range(10):
            events.observe(_inventory(faults[turn % 2]))
            events.observe(_inventory(HEALTHY))
            with anyio.fail_after(5):
                while not idle():
                    await anyio.sleep(0.01)
        tasks.cancel_scope.cancel()
    await api.close()
    writes = [s for s in apiserver.seen() if s.resource == "events"]
    assert len(writes) <= 2, [(s.verb, s.data) for s in writes]


async def test_an_event_of_a_long_node_name_has_a_valid_name(apiserver: ApiServer) -> None:
    node = ".".join(["n" * 62] * 4) + "-x"  # 252 characters: a valid node name
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), node)
    feature = NodeEvents(min_interval=0.5)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(feature.run, api)
        feature.observe(_inventory(HEALTHY))
        feature.observe(_inventory(FAULTY))
        found = await _wait(apiserver, lambda: _by_reason(apiserver), lambda f: "NPUUnhealthy" in f)
        tasks.cancel_scope.cancel()
    await api.close()
    name = found["NPUUnhealthy"][0]["metadata"]["name"]
    assert len(name) <= 253 and re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", name), name
    assert found["NPUUnhealthy"][0]["involvedObject"]["name"] == node


async def test_npu_smi_down_raises_no_event_for_the_chips(apiserver: ApiServer) -> None:
    async with _running(apiserver) as events:
        events.observe(_inventory(HEALTHY))
        events.observe(_inventory(UNKNOWN))
        events.observe(_inventory(HEALTHY))
        events.observe(_inventory(FAULTY))  # the one transition of the chip's own
        found = await _wait(apiserver, lambda: _by_reason(apiserver), lambda f: "NPUUnhealthy" in f)
        assert [event["message"] for events in found.values() for event in events] == [
            "Ascend910-3 is Unhealthy: Health Alarm from npu-smi (fault codes 80E3A203)"
        ]


async def test_an_event_on_a_pod_is_written_in_its_namespace_once_and_forgotten(apiserver: ApiServer) -> None:
    async with _running(apiserver) as events:
        events.note_pod(
            PodEvent(
                "Warning", "NPUChoiceSkipped", "team-b", "thief", "uid-thief", "Skipped: names Ascend910-6"
            )
        )
        (event,) = await _wait(
            apiserver, lambda: apiserver.list("events", "team-b"), lambda found: len(found) == 1
        )
        # A Node Event noted now is written by the same task after the pod's write returned, and by then the
        # pod's record is forgotten.
        events.note("Warning", "NPUUnhealthy", "Ascend910-3", "Ascend910-3 is Unhealthy")
        await _wait(apiserver, lambda: apiserver.list("events", "default"), lambda found: len(found) == 1)
        assert list(events._records) == [("Ascend910-3", "NPUUnhealthy")]
    assert event["involvedObject"] == {
        "kind": "Pod",
        "namespace": "team-b",
        "name": "thief",
        "uid": "uid-thief",
        "apiVersion": "v1",
    }
    assert (event["type"], event["reason"], event["count"]) == ("Warning", "NPUChoiceSkipped", 1)
    assert len(apiserver.list("events", "team-b")) == 1, "written once: one Event per pod skipped"


def test_events_on_pods_waiting_for_the_api_server_are_bounded() -> None:
    events = NodeEvents()
    for n in range(1000):
        events.note_pod(
            PodEvent("Warning", "NPUChoiceSkipped", "team-b", f"thief-{n}", f"uid-{n}", "Skipped")
        )
    assert len(events._records) == 256
    assert ("pod team-b/thief-999", "NPUChoiceSkipped") in events._records


async def test_an_event_on_a_pod_noted_while_the_last_is_written_is_written_too(apiserver: ApiServer) -> None:
    """A pod made again under the same name (a new UID) is skipped while the Event on the old one is being
    written: the record of the new one was dropped with the old one's once its write returned."""
    async with _running(apiserver) as events:
        apiserver.fail("hang", verb="create", resource="events")
        events.note_pod(
            PodEvent("Warning", "NPUChoiceSkipped", "team-b", "job-0", "uid-1", "Skipped: names Ascend910-3")
        )
        await _wait(
            apiserver,
            lambda: [s for s in apiserver.seen() if s.verb == "create" and s.resource == "events"],
            bool,
        )
        events.note_pod(
            PodEvent("Warning", "NPUChoiceSkipped", "team-b", "job-0", "uid-2", "Skipped: names Ascend910-5")
        )
        apiserver.behave()
        written = await _wait(apiserver, lambda: apiserver.list("events", "team-b"), lambda f: len(f) == 2)
    assert sorted((e["involvedObject"]["uid"], e["message"]) for e in written) == [
        ("uid-1", "Skipped: names Ascend910-3"),
        ("uid-2", "Skipped: names Ascend910-5"),
    ]


def _chips(unhealthy: bool) -> Inventory:
    chips = tuple(Chip.make(i, "910B3") for i in range(8))
    if unhealthy:
        chips = tuple(chip.with_health(Health.UNHEALTHY, "power lost") for chip in chips)
    return Inventory(chips=chips)


async def test_chips_that_turn_together_share_one_event(apiserver: ApiServer) -> None:
    """A node's eight chips failing and recovering together, three times: one Event per reason naming them
    all, its repeats counted on it, instead of one per chip."""
    async with _running(apiserver) as events:
        events.observe(_chips(unhealthy=False))
        for _ in range(3):
            events.observe(_chips(unhealthy=True))
            events.observe(_chips(unhealthy=False))
        found = await _wait(
            apiserver,
            lambda: _by_reason(apiserver),
            lambda f: (
                [e["count"] for e in f.get("NPUUnhealthy", [])] == [3]
                and [e["count"] for e in f.get("NPUHealthy", [])] == [3]
            ),
        )
    ids = ", ".join(f"Ascend910-{i}" for i in range(8))
    (unhealthy,) = found["NPUUnhealthy"]
    assert unhealthy["message"] == f"{ids} are Unhealthy: power lost"
    (healthy,) = found["NPUHealthy"]
    assert healthy["message"] == f"{ids} are Healthy again"
    assert sorted(found) == ["NPUHealthy", "NPUUnhealthy"]


async def test_chips_that_turn_in_changing_groups_keep_one_events_pace(apiserver: ApiServer) -> None:
    """Chips failing in ever other groups (a rack's power flapping): each new group's Event waits for the
    spacing of the Events of the same reason about its chips, and the groups already written are forgotten."""
    events = NodeEvents(min_interval=3600.0)
    groups = [(0, 1), (1, 2), (2, 3), (0, 3)]
    healthy = tuple(Chip.make(i, "910B3") for i in range(4))
    api = KubeApi.connect(ClusterTarget("kubeconfig", apiserver.kubeconfig), "node-1")
    apiserver.put("nodes", {"metadata": {"name": "node-1"}})
    try:
        events.observe(Inventory(chips=healthy))
        for group in groups:
            failing = tuple(
                chip.with_health(Health.UNHEALTHY, "power lost") if chip.phys_id in group else chip
                for chip in healthy
            )
            events.observe(Inventory(chips=failing))
            await events._write_due(api)
            events.observe(Inventory(chips=healthy))
            await events._write_due(api)
    finally:
        await api.close()
    unhealthy = _by_reason(apiserver).get("NPUUnhealthy", [])
    assert [e["message"] for e in unhealthy] == ["Ascend910-0, Ascend910-1 are Unhealthy: power lost"]
    assert len(events._records) <= 2 * len(groups)
