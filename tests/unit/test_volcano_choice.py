"""Volcano's choice on Allocate: the pod cache's index picks what :func:`choose` picks over every pod, through
any sequence of pods arriving, changing, being taken and going."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from lightkube.resources.core_v1 import Node, Pod
from prometheus_client import REGISTRY

from ascend_agent.cluster.client import ApiUnavailable
from ascend_agent.cluster.events import PodEvent
from ascend_agent.cluster.health import Failure
from ascend_agent.cluster.podlist import MAX_PODS, _list_in_thread, view_of
from ascend_agent.cluster.volcano import VolcanoPods
from ascend_agent.cluster.volcano_marks import MAX_VALUE, TAKEN, Mounted, PodView, choose, predicate_time
from ascend_agent.kubelet.mounted import MountedChips
from ascend_agent.model import Chip, Holder, Holders, Inventory

T = "huawei.com/Ascend910"
P = "huawei.com/Ascend310P"
PT = "predicate-time"


@st.composite
def _pods(draw: st.DrawFn) -> PodView:
    name = draw(st.sampled_from([f"pod-{i}" for i in range(6)]))
    resource = draw(st.sampled_from([T, P]))
    chips = draw(st.integers(0, 3))
    time = draw(st.one_of(st.integers(0, 5).map(str), st.just(TAKEN), st.just("x"), st.just("")))
    annotations = {resource: ",".join(f"Ascend910-{i}" for i in range(chips)), "predicate-time": time}
    limits = {resource: draw(st.integers(0, 3))}
    scheduler = draw(st.sampled_from(["volcano", "default-scheduler"]))
    return PodView(
        "ns", name, f"uid-{name}", annotations, limits, terminating=draw(st.booleans()), scheduler=scheduler
    )


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("store"), _pods()),
        st.tuples(st.just("forget"), st.sampled_from([f"uid-pod-{i}" for i in range(6)])),
        st.tuples(st.just("take"), st.tuples(st.sampled_from([T, P]), st.integers(1, 3))),
    ),
    max_size=40,
)


@given(_STEPS)
def test_the_index_chooses_as_choose_does(steps: list[tuple[str, object]]) -> None:
    pods = VolcanoPods()
    for kind, value in steps:
        if kind == "store":
            assert isinstance(value, PodView)
            pods._store(value)
        elif kind == "forget":
            assert isinstance(value, str)
            pods._forget(value)
        else:
            resource, count = value  # type: ignore[misc]
            expected = choose(pods._pods.values(), resource, count, pods._taken.keys())
            got = pods._choose(resource, count)
            assert got == expected
            if got is not None:
                pods._taken[got.uid] = Mounted(
                    got.namespace, got.name, resource, (), tuple(got.chosen(resource))
                )


def test_smallest_predicate_time_first_and_taken_pods_skipped() -> None:
    pods = VolcanoPods()
    for name, time in (("c", "30"), ("a", "10"), ("b", "20"), ("done", TAKEN)):
        pods._store(PodView("ns", name, name, {T: "Ascend910-1,Ascend910-2", "predicate-time": time}, {T: 2}))
    order = []
    while (pod := pods._choose(T, 2)) is not None:
        order.append(pod.name)
        pods._taken[pod.uid] = Mounted(pod.namespace, pod.name, T, (), ())
    assert order == ["a", "b", "c"]


class _BurstApi:
    """The client side of a pod watch that delivers ``burst`` events at once (one read of the socket's
    buffer: the stream hands them over without suspending), then nothing more."""

    node = "node-1"

    def __init__(self, burst: int) -> None:
        self.client = self
        self.delivered = 0
        self.first_delivered = anyio.Event()
        self._burst = burst

    def list(self, *args: Any, **kwargs: Any) -> _Listing:
        return _Listing()

    async def call(self, verb: str, resource: str, request: Awaitable[Any], limited: bool = True) -> Any:
        return await request

    async def call_blocking(self, verb: str, resource: str, request: Any, limited: bool = True) -> Any:
        return await anyio.to_thread.run_sync(request, self)

    def patch(self, *args: Any, **kwargs: Any) -> None:
        return None

    def get(self, *args: Any, **kwargs: Any) -> Node:
        """The agent's Node, for the pods' configuration (its address)."""
        return Node.from_dict(
            {
                "metadata": {"name": self.node},
                "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.1"}]},
            }
        )

    async def watch(self, resource: str, *args: Any, **kwargs: Any) -> AsyncIterator[tuple[str, Pod]]:
        for n in range(self._burst):
            self.delivered += 1
            self.first_delivered.set()
            yield (
                "ADDED",
                Pod.from_dict(
                    {
                        "metadata": {"name": f"p{n}", "namespace": "ns", "uid": f"u{n}"},
                        "spec": {"nodeName": self.node, "containers": []},
                    }
                ),
            )
        await anyio.sleep_forever()


class _Listing:
    """lightkube's list iterator (of its blocking client, read in a worker thread): ``pods``, once
    ``answer`` is set; ``refused`` raises the API server's refusal instead."""

    resourceVersion = "1"

    def __init__(
        self, pods: list[Any] | None = None, answer: anyio.Event | None = None, refused: bool = False
    ) -> None:
        self._pods = list(pods or [])
        self._answer = answer
        self._refused = refused

    def __iter__(self) -> Iterator[Any]:
        if self._answer is not None:
            anyio.from_thread.run(self._answer.wait)
        if self._refused:
            raise ApiUnavailable("list pods", Failure(503, "503 ServiceUnavailable"))
        yield from self._pods


async def test_a_burst_of_watch_events_lets_other_work_run_between_them() -> None:
    """An Allocate arriving during a burst of pod events waits for one event, not for the whole burst."""
    api = _BurstApi(burst=50)
    pods = VolcanoPods()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(pods._watch, api)
            await api.first_delivered.wait()
            seen_by_other_task = api.delivered
            tasks.cancel_scope.cancel()
    assert seen_by_other_task < 50


class _SlowListApi(_BurstApi):
    """An API server whose pod list answers only once ``answer`` is set, with one pod Volcano placed; or,
    with ``refused``, refuses every list at once."""

    def __init__(self, refused: bool = False) -> None:
        super().__init__(burst=0)
        self.answer = anyio.Event()
        self.lists = 0
        self._refused = refused

    def list(self, resource: type[Any], *args: Any, **kwargs: Any) -> _Listing:
        """The list's pods decoded into ``resource``, as lightkube's client does."""
        self.lists += 1
        if self._refused:
            return _Listing(refused=True)
        pod = msgspec.json.encode(
            {
                "metadata": {
                    "name": "train",
                    "namespace": "ns",
                    "uid": "u1",
                    "annotations": {T: "Ascend910-3,Ascend910-5", "predicate-time": "100"},
                },
                "spec": {
                    "nodeName": self.node,
                    "schedulerName": "volcano",
                    "containers": [{"name": "main", "resources": {"limits": {T: "2"}}}],
                },
                "status": BOUND,
            }
        )
        return _Listing([msgspec.json.decode(pod, type=resource)], self.answer)


# What a pod Volcano bound shows before the kubelet starts it: the API server set PodScheduled as it took the
# Binding.
BOUND = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}


def _eight_chips() -> Inventory:
    return Inventory(tuple(Chip.make(n, "910B3") for n in range(8)))


@pytest.mark.parametrize("watch_started", [False, True], ids=["before the watch", "during its first list"])
async def test_an_allocate_before_the_first_read_of_the_pods_waits_for_it(watch_started: bool) -> None:
    """Right after the agent starts, the cache is empty because the pods were not read yet: the Allocate
    takes the pod from that first read, and does not wait out a try interval (here 1,000 s)."""
    api = _SlowListApi()
    pods = VolcanoPods(try_interval=1000)
    pods.observe(_eight_chips())
    done = anyio.Event()
    chosen: list[list[str]] = []

    async def allocate() -> None:
        chosen.extend(await pods.remap(T, [["Ascend910-0", "Ascend910-1"]]))
        done.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            if watch_started:
                tasks.start_soon(pods.run, api)
                await anyio.lowlevel.checkpoint()  # the watch's list is under way
            tasks.start_soon(allocate)
            await anyio.lowlevel.checkpoint()  # the Allocate missed the cache and waits
            if not watch_started:
                tasks.start_soon(pods.run, api)
            api.answer.set()
            await done.wait()
            tasks.cancel_scope.cancel()
    assert chosen == [["Ascend910-3", "Ascend910-5"]]
    assert api.lists == 1, "the Allocate waited for the watch's list instead of reading the pods again"


async def test_an_api_server_down_since_start_refuses_the_allocate_after_the_tries_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch's first read was refused: a miss does not wait for a read that is not coming (here up to
    60 s) before its tries."""
    monkeypatch.setattr("ascend_agent.cluster.volcano.MISS_READ_TIMEOUT", 60.0)
    api = _SlowListApi(refused=True)
    pods = VolcanoPods(tries=1)
    pods.observe(_eight_chips())
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(pods.run, api)
            await anyio.lowlevel.checkpoint()  # the watch's first list, refused
            with pytest.raises(LookupError, match="no pod on this node placed by Volcano"):
                await pods.remap(T, [["Ascend910-0", "Ascend910-1"]])
            tasks.cancel_scope.cancel()


def _placed(
    name: str, chips: str, time: str, asked: int | None = None, scheduler: str = "volcano"
) -> PodView:
    count = len(chips.split(","))
    return PodView(
        "team-a",
        name,
        f"uid-{name}",
        {T: chips, "predicate-time": time},
        {T: count if asked is None else asked},
        scheduler=scheduler,
    )


def test_a_pod_another_scheduler_placed_is_never_chosen() -> None:
    """A pod bound to the node by hand (no scheduler, or another one) names any chip and the smallest
    predicate-time: only the pods Volcano placed count."""
    for scheduler in ("default-scheduler", "my-scheduler"):
        pods = VolcanoPods()
        pods._store(_placed("by-hand", "Ascend910-3", "0", scheduler=scheduler))
        pods._store(_placed("placed", "Ascend910-6", "100"))
        chosen = pods._choose(T, 1)
        assert chosen is not None and chosen.name == "placed"
    named = VolcanoPods(scheduler="volcano-npu")
    named._store(_placed("placed", "Ascend910-6", "100"))
    assert named._choose(T, 1) is None, "--volcano-scheduler-name volcano-npu: a pod of volcano is not its"


def test_the_chips_named_must_be_as_many_as_the_pod_asks_for() -> None:
    """A pod asking for one chip whose annotation names two is not the pod of an Allocate of two."""
    pods = VolcanoPods()
    pods._store(_placed("greedy", "Ascend910-3,Ascend910-4", "0", asked=1))
    pods._store(_placed("placed", "Ascend910-6,Ascend910-7", "100"))
    chosen = pods._choose(T, 2)
    assert chosen is not None and chosen.name == "placed"


async def test_a_choice_naming_a_chip_another_pod_holds_is_skipped_naming_the_pod() -> None:
    """Chip 3 went to train-0 by an earlier Allocate; chip 4 is held, the kubelet says, by a pod without
    Volcano's choice: a later choice naming either is skipped, naming the pod that has it; with no other pod
    the Allocate is refused, saying so."""
    mounted = MountedChips()
    mounted.kubelet_holders = lambda: Holders({(T, "Ascend910-4"): (Holder("team-b", "plain", "main"),)})
    pods = VolcanoPods(mounted=mounted, tries=1)
    pods.observe(_eight_chips())
    pods._first_read.set()  # no API server: reading the pods again finds nothing new
    pods._store(_placed("train-0", "Ascend910-3", "100"))
    pods._store(PodView("team-b", "plain", "uid-plain", {}, {T: 1}, scheduler="default-scheduler"))
    assert await pods.remap(T, [["Ascend910-0"]]) == [["Ascend910-3"]]

    pods._store(_placed("intruder", "Ascend910-3", "0"))
    with pytest.raises(
        LookupError, match=r"skipped: pod team-a/intruder names Ascend910-3 .* which pod team-a/train-0 has"
    ):
        await pods.remap(T, [["Ascend910-1"]])
    pods._store(_placed("intruder-2", "Ascend910-4", "1"))
    pods._store(_placed("next", "Ascend910-5", "200"))
    assert await pods.remap(T, [["Ascend910-1"]]) == [["Ascend910-5"]], "intruder-2 skipped in the Allocate"
    assert {"uid-intruder", "uid-intruder-2"} <= pods._refused


async def test_five_pods_naming_a_held_chip_cost_a_volcano_pod_no_refused_allocate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Five pods of team-b name chip 6, which ``legit-0`` has, with predicate-times smaller than
    ``legit-1``'s: ``legit-1``'s one Allocate skips them (a log line and an Event on each) and gets its chip
    7; a kubelet never retries an Allocate, so each refusal would have failed ``legit-1``."""
    events: list[PodEvent] = []
    pods = VolcanoPods(events=events.append)
    pods.observe(_eight_chips())
    pods._first_read.set()
    pods._store(_placed("legit-0", "Ascend910-6", "100"))
    assert await pods.remap(T, [["Ascend910-0"]]) == [["Ascend910-6"]]
    for n in range(1, 6):
        pods._store(PodView("team-b", f"thief-{n}", f"uid-thief-{n}", {T: "Ascend910-6", PT: str(n)}, {T: 1}))
    pods._store(_placed("legit-1", "Ascend910-7", "200"))

    assert await pods.remap(T, [["Ascend910-1"]]) == [["Ascend910-7"]], "the first Allocate is legit-1's"
    lines = [r.getMessage() for r in caplog.records if " is skipped: " in r.getMessage()]
    assert [line.split()[1] for line in lines] == [f"team-b/thief-{n}" for n in range(1, 6)]
    assert all("which pod team-a/legit-0 has" in line for line in lines)
    assert [(e.kind, e.reason, e.namespace, e.name, e.uid) for e in events] == [
        ("Warning", "NPUChoiceSkipped", "team-b", f"thief-{n}", f"uid-thief-{n}") for n in range(1, 6)
    ]
    assert pods._taken["uid-legit-1"].real == ("Ascend910-7",)


async def test_a_pod_created_on_the_node_is_never_chosen(caplog: pytest.LogCaptureFixture) -> None:
    """A pod of team-b created with its node named and Volcano's annotation (no scheduler bound it: no
    PodScheduled condition) has the smallest predicate-time: ``legit``, which Volcano bound, gets the Allocate
    and the marks; the other is left out with one line."""
    pods = VolcanoPods(tries=1)
    pods.observe(_eight_chips())
    pods._first_read.set()
    thief = {T: "Ascend910-6,Ascend910-7", PT: "1"}
    for _ in range(2):
        pods._store(PodView("team-b", "thief", "uid-thief", thief, {T: 2}, bound=False))
    pods._store(_placed("legit", "Ascend910-6,Ascend910-7", "1700000000000"))
    assert await pods.remap(T, [["Ascend910-2", "Ascend910-3"]]) == [["Ascend910-6", "Ascend910-7"]]
    assert list(pods._taken) == ["uid-legit"]
    lines = [r.getMessage() for r in caplog.records if "no scheduler bound it" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("Pod team-b/thief is ignored"), lines
    started = PodView("team-b", "running", "uid-running", {T: "Ascend910-5", PT: "1"}, {T: 1}, pending=False)
    pods._store(started)
    assert pods._choose(T, 1) is None, "a pod that runs was admitted before: no Allocate is for it"


async def test_a_pod_created_on_the_node_stays_out_once_the_kubelet_admitted_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The kubelet writes ``PodScheduled: True`` on every pod it syncs, a pod created with its node named too:
    once admitted, such a pod still waiting (its image not pulled: phase Pending) would pass as one a
    scheduler bound. Its ``startTime``, which the kubelet writes in the same first status, keeps it out:
    ``legit``, which Volcano bound, gets the Allocate."""
    admitted = {
        "phase": "Pending",
        "startTime": "2026-01-02T03:04:05Z",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            {
                "name": "main",
                "image": "x",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff"}},
            }
        ],
    }
    thief = _volcano_pod("thief", "Ascend910-6", "1")
    thief["metadata"]["namespace"] = "team-b"
    thief["status"] = admitted
    pods = VolcanoPods(tries=1)
    pods.observe(_eight_chips())
    pods._first_read.set()
    view = PodView.of(Pod.from_dict(thief))
    assert view.bound and view.pending and view.admitted
    pods._store(view)
    pods._store(PodView.of(Pod.from_dict(_volcano_pod("legit", "Ascend910-6", "1700000000000"))))
    assert await pods.remap(T, [["Ascend910-2"]]) == [["Ascend910-6"]]
    assert list(pods._taken) == ["uid-legit"], "the marks go to legit"


async def test_a_miss_then_a_held_chip_asks_podresources_again_before_the_skip() -> None:
    """``job-0`` went and Volcano made it again under that name (a new UID) on chip 3; the watch has not
    delivered it yet, so the Allocate misses and reads the pods. PodResources' last answer still lists the
    old ``job-0`` on chip 3: asked again, it lists it no more, and the new ``job-0`` gets chip 3 (the kubelet
    fails a pod whose Allocate is refused)."""
    stale = Holders({(T, "Ascend910-3"): (Holder("team-a", "job-0", "main"),)})
    mounted = MountedChips()
    listed = [stale]
    mounted.kubelet_holders = lambda: listed[-1]
    asked = []

    async def ask_again() -> None:
        asked.append(True)
        listed.append(Holders())

    mounted.refresh_kubelet_holders = ask_again
    api = _PodsApi([])
    pods = VolcanoPods(mounted=mounted, tries=1)
    pods.observe(_eight_chips())
    await pods._list(api)  # type: ignore[arg-type]
    pods._api = api  # type: ignore[assignment]
    api.pods = [_volcano_pod("job-0", "Ascend910-3", "100")]  # not delivered by the watch
    with anyio.fail_after(5):
        assert await pods.remap(T, [["Ascend910-1"]]) == [["Ascend910-3"]]
    assert (api.lists, len(asked)) == (2, 1), "the pods read and PodResources asked, once each"


async def test_a_pod_whose_chip_a_going_pod_holds_is_passed_over_for_that_allocate_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``old`` has chip 3 and is being deleted; Volcano placed ``next`` on chip 3 already (it acts on the
    deletion), with a smaller ``predicate-time`` than ``other``'s. ``other``'s Allocate passes ``next`` over,
    and once ``old`` went, ``next``'s own Allocate gets chip 3 (the kubelet fails a pod whose Allocate is
    refused). Said once, in the log and an Event."""
    events: list[PodEvent] = []
    pods = VolcanoPods(tries=1, events=events.append)
    pods.observe(_eight_chips())
    pods._first_read.set()
    pods._store(_placed("old", "Ascend910-3", "50"))
    assert await pods.remap(T, [["Ascend910-0"]]) == [["Ascend910-3"]]
    old = _placed("old", "Ascend910-3", TAKEN)
    pods._store(PodView(old.namespace, old.name, old.uid, old.annotations, old.limits, terminating=True))
    pods._store(_placed("next", "Ascend910-3", "100"))
    pods._store(_placed("other", "Ascend910-5", "200"))

    assert await pods.remap(T, [["Ascend910-1"]]) == [["Ascend910-5"]]
    with pytest.raises(LookupError, match=r"skipped: pod team-a/next names Ascend910-3 .* until it stops"):
        await pods.remap(T, [["Ascend910-2"]])  # old has not gone yet
    pods._forget("uid-old")
    assert await pods.remap(T, [["Ascend910-2"]]) == [["Ascend910-3"]], "next's own Allocate"
    lines = [r.getMessage() for r in caplog.records if " is skipped: " in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("Pod team-a/next is skipped"), lines
    assert [(e.reason, e.name) for e in events] == [("NPUChoiceSkipped", "next")]


@pytest.mark.parametrize(
    "still_listed", [True, False], ids=["admitted before", "a pod of that name that went"]
)
async def test_a_pod_the_kubelet_lists_on_its_own_chips_is_asked_about_again_then_skipped(
    still_listed: bool,
) -> None:
    """PodResources lists ``job-0`` on chip 3 (the Allocate for its kubelet's ID handed chip 3 over, the marks
    went elsewhere): such a pod was admitted before, and the next Allocate is not its own. Or the answer is
    older than the pod: a ``job-0`` that went, and Volcano made again under that name. PodResources is asked
    again before the pod is skipped."""
    listed = Holders({(T, "Ascend910-3"): (Holder("team-a", "job-0", "main"),)})
    answers = [listed if still_listed else Holders()]
    mounted = MountedChips()
    mounted.kubelet_holders = lambda: listed

    async def ask_again() -> None:
        nonlocal listed
        listed = answers.pop()

    mounted.refresh_kubelet_holders = ask_again
    pods = VolcanoPods(mounted=mounted, tries=1)
    pods.observe(_eight_chips())
    pods._first_read.set()
    pods._store(_placed("job-0", "Ascend910-3", "100"))
    pods._store(_placed("later", "Ascend910-4", "200"))
    got = await pods.remap(T, [["Ascend910-1"]])
    assert answers == [], "PodResources asked again"
    assert got == ([["Ascend910-4"]] if still_listed else [["Ascend910-3"]])


async def test_a_held_chip_is_free_again_once_its_pod_ended_or_went() -> None:
    pods = VolcanoPods()
    pods.observe(_eight_chips())
    pods._store(_placed("first", "Ascend910-3", "100"))
    assert await pods.remap(T, [["Ascend910-0"]]) == [["Ascend910-3"]]
    assert REGISTRY.get_sample_value("ascend_agent_volcano_chips_taken") == 1
    ended = _placed("first", "Ascend910-3", TAKEN)
    pods._store(
        PodView(ended.namespace, ended.name, ended.uid, ended.annotations, ended.limits, True, ended=True)
    )
    assert "uid-first" not in pods._pods, "a pod that ended is not kept"
    assert REGISTRY.get_sample_value("ascend_agent_volcano_chips_taken") == 0
    pods._store(_placed("second", "Ascend910-3", "200"))
    assert await pods.remap(T, [["Ascend910-1"]]) == [["Ascend910-3"]]
    pods._forget("uid-second")
    pods._store(_placed("third", "Ascend910-3", "300"))
    assert await pods.remap(T, [["Ascend910-2"]]) == [["Ascend910-3"]]


async def test_a_pod_naming_an_unknown_chip_is_refused_once_then_skipped() -> None:
    pods = VolcanoPods()
    pods.observe(_eight_chips())
    pods._store(_placed("bad", "Ascend910-99", "1"))
    pods._store(_placed("good", "Ascend910-6", "100"))
    with pytest.raises(LookupError, match="Ascend910-99 for pod team-a/bad"):
        await pods.remap(T, [["Ascend910-0"]])
    assert await pods.remap(T, [["Ascend910-0"]]) == [["Ascend910-6"]]


@given(
    st.text(max_size=30)
    | st.sampled_from(["\u00b2", "9" * 5000, "0" * 40 + "7", TAKEN, "18446744073709551616"])
)
def test_a_predicate_time_is_ascii_digits_within_uint64(value: str) -> None:
    got = predicate_time(value)
    digits = value.isascii() and value.isdigit()
    significant = value.lstrip("0") or "0"
    if not digits or len(significant) > 20 or int(significant) >= 2**64 - 1:
        assert got is None
    else:
        assert got == int(significant)


async def test_a_pod_with_a_predicate_time_that_is_none_is_ignored_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``isdigit()`` accepts a superscript two, and 5,000 digits are digits: neither stops the choice."""
    pods = VolcanoPods()
    pods.observe(_eight_chips())
    for time in ("\u00b2", "9" * 5000):
        pods._store(_placed(f"odd-{len(time)}", "Ascend910-3", time))
        pods._store(_placed(f"odd-{len(time)}", "Ascend910-3", time))  # changed again: no second line
    pods._store(_placed("placed", "Ascend910-6", "100"))
    assert await pods.remap(T, [["Ascend910-0"]]) == [["Ascend910-6"]]
    lines = [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]
    assert len(lines) == 2 and all(len(line) < 200 for line in lines), lines


def test_a_list_keeps_only_this_nodes_pods_that_have_not_ended() -> None:
    """An API server that ignores the field selector sends every pod: those of other nodes, and those that
    ended, are never kept; this node's are decoded whole."""

    def pod(name: str, node: str | None, phase: str = "Running") -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": {T: "1"}}}]}
        if node is not None:
            spec["nodeName"] = node
        return {
            "metadata": {"name": name, "namespace": "ns", "uid": name},
            "spec": spec,
            "status": {"phase": phase},
        }

    listing = {
        "items": [
            pod("mine", "node-1"),
            pod("other", "node-2"),
            pod("unbound", None),
            pod("done", "node-1", "Succeeded"),
            {"metadata": {"name": "bare", "uid": "bare"}},
        ]
    }

    class _Client:
        def list(self, resource: type[Any], **kwargs: Any) -> _Listing:
            assert kwargs["fields"] == {"spec.nodeName": "node-1"}
            items = msgspec.json.decode(msgspec.json.encode(listing), type=dict[str, list[resource]])  # type: ignore[valid-type]
            return _Listing(items["items"])

    pods, version, unreadable, _ = _list_in_thread("node-1", _Client())  # type: ignore[arg-type]
    assert [(p.name, p.limits) for p in pods] == [("mine", {T: 1})]
    assert version == "1"
    assert unreadable == {}


async def test_a_pod_that_cannot_be_decoded_is_left_out_of_the_list_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pod whose spec does not decode as a pod's (here ``containers`` is not a list) is left out with one
    line, once however many lists find it: the other pods are still listed and chosen."""
    broken = _volcano_pod("broken", "Ascend910-2", "1")
    broken["spec"]["containers"] = "main"
    api = _PodsApi([broken, _volcano_pod("fine", "Ascend910-3", "100")])
    pods = VolcanoPods(tries=1)
    pods.observe(_eight_chips())
    with caplog.at_level("WARNING", logger="ascend_agent.cluster"):
        await pods._list(api)  # type: ignore[arg-type]
        await pods._list(api)  # type: ignore[arg-type]
    assert list(pods._names) == [("team-a", "fine")]
    lines = [r.getMessage() for r in caplog.records if "team-a/broken" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("Pod team-a/broken is ignored: ValidationError"), lines
    assert await pods.remap(T, [["Ascend910-0"]]) == [["Ascend910-3"]]


@given(
    time=st.integers(0, 2**64).map(str) | st.text(max_size=40),
    chips=st.sampled_from(["Ascend910-3", "Ascend910-3,Ascend910-4", "Ascend910-9"]) | st.text(max_size=40),
    quantity=st.sampled_from(["1", "2"]) | st.text(max_size=12),
    scheduler=st.sampled_from([None, "volcano"]) | st.text(max_size=12),
)
@example(time="5", chips="Ascend910-3,Ascend910-4", quantity="2", scheduler="volcano")
async def test_no_pod_data_makes_an_allocate_fail_but_with_its_refusal(
    time: str, chips: str, quantity: str, scheduler: str | None
) -> None:
    """Whatever a pod's annotations and limits say, the pod is read, and an Allocate either gets chips or is
    refused (LookupError: FAILED_PRECONDITION), never another error (UNKNOWN)."""
    spec: dict[str, Any] = {
        "nodeName": "node-1",
        "containers": [{"name": "main", "resources": {"limits": {T: quantity}}}],
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    pod = Pod.from_dict(
        {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "uid": "u",
                "annotations": {T: chips, "predicate-time": time},
            },
            "spec": spec,
            "status": BOUND,
        }
    )
    pods = VolcanoPods(tries=1)
    pods.observe(_eight_chips())
    pods._first_read.set()  # no API server: a miss reads nothing
    view = view_of(pod)
    assert view is not None
    pods._store(view)
    count = max(1, min(len(view.chosen(T)), 8))
    try:
        got = await pods.remap(T, [[f"Ascend910-{i}" for i in range(count)]])
    except LookupError:
        return
    assert got == [view.chosen(T)]


class _PodsApi(_BurstApi):
    """An API server whose pod list answers ``pods`` at once."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        super().__init__(burst=0)
        self.pods = pods
        self.lists = 0

    def list(self, resource: type[Any], *args: Any, **kwargs: Any) -> _Listing:
        self.lists += 1
        return _Listing([msgspec.json.decode(msgspec.json.encode(pod), type=resource) for pod in self.pods])


def _marked(name: str, real: str, kubelet_ids: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "annotations": {
                T: real,
                "predicate-time": TAKEN,
                "huawei.com/AscendReal": real,
                "huawei.com/kltDev": kubelet_ids,
            },
        },
        "spec": {
            "nodeName": "node-1",
            "schedulerName": "volcano",
            "containers": [{"name": "main", "resources": {"limits": {T: "1"}}}],
        },
        "status": {"phase": "Running"},
    }


async def test_only_the_marks_a_pod_had_when_the_agent_started_are_believed() -> None:
    """An earlier agent gave ``earlier`` chip 5 under the kubelet's ``Ascend910-0``: its marks say so. A user
    who writes marks on a pod later (their own, or rewriting those) cannot move what it is counted as having:
    ``late`` holds its kubelet's ID, chip 2, whatever its marks say, and ``earlier`` keeps chip 5."""
    mounted = MountedChips()
    mounted.kubelet_holders = lambda: Holders(
        {
            (T, "Ascend910-0"): (Holder("team-a", "earlier", "main"),),
            (T, "Ascend910-2"): (Holder("team-a", "late", "main"),),
        }
    )
    pods = VolcanoPods(mounted=mounted)
    pods.observe(_eight_chips())
    await pods._list(_PodsApi([_marked("earlier", "Ascend910-5", "Ascend910-0")]))  # type: ignore[arg-type]
    pods._store(PodView.of(Pod.from_dict(_marked("late", "Ascend910-6", "Ascend910-2"))))
    pods._store(PodView.of(Pod.from_dict(_marked("earlier", "Ascend910-7", "Ascend910-0"))))

    pods._store(_placed("wants-2", "Ascend910-2", "1"))
    with pytest.raises(LookupError, match="which pod team-a/late has"):
        await pods.remap(T, [["Ascend910-1"]])
    pods._store(_placed("wants-5", "Ascend910-5", "2"))
    with pytest.raises(LookupError, match="which pod team-a/earlier has"):
        await pods.remap(T, [["Ascend910-1"]])
    pods._store(_placed("wants-7", "Ascend910-7", "3"))
    assert await pods.remap(T, [["Ascend910-1"]]) == [["Ascend910-7"]]


def _volcano_pod(name: str, chips: str, time: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "annotations": {T: chips, "predicate-time": time},
        },
        "spec": {
            "nodeName": "node-1",
            "schedulerName": "volcano",
            "containers": [{"name": "main", "resources": {"limits": {T: "1"}}}],
        },
        "status": BOUND,
    }


async def test_a_chip_held_by_a_pod_the_watch_has_not_seen_go_is_checked_again_after_a_read() -> None:
    """This agent gave chip 3 to ``first``; ``first`` went, and Volcano placed ``second`` on chip 3 before
    the watch said so (an outage of the watch, its back-off). The Allocate reads the pods once more and
    ``second`` gets chip 3, instead of being refused for good. A chip still held after the read is
    refused."""
    api = _PodsApi([_volcano_pod("first", "Ascend910-3", "100")])
    pods = VolcanoPods(tries=1)
    pods.observe(_eight_chips())
    await pods._list(api)  # type: ignore[arg-type]
    pods._api = api  # type: ignore[assignment]
    assert await pods.remap(T, [["Ascend910-0"]]) == [["Ascend910-3"]]

    second = _volcano_pod("second", "Ascend910-3", "200")
    api.pods = [second]  # the API server's pods; the watch has not delivered the change
    pods._store(PodView.of(Pod.from_dict(second)))
    with anyio.fail_after(5):
        assert await pods.remap(T, [["Ascend910-1"]]) == [["Ascend910-3"]]

    third = _volcano_pod("third", "Ascend910-3", "300")
    api.pods = [second, third]
    pods._store(PodView.of(Pod.from_dict(third)))
    with anyio.fail_after(5), pytest.raises(LookupError, match="which pod team-a/second has"):
        await pods.remap(T, [["Ascend910-2"]])
    assert "uid-third" in pods._refused

    lists = api.lists
    unknown = _volcano_pod("unknown", "Ascend910-99", "400")
    api.pods = [second, unknown]
    pods._store(PodView.of(Pod.from_dict(unknown)))
    with pytest.raises(LookupError, match="which this node does not have"):
        await pods.remap(T, [["Ascend910-2"]])
    assert api.lists == lists, "a chip the node does not have is refused without reading the pods again"


async def test_a_watch_streaming_new_pods_without_end_keeps_at_most_max_pods(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An API server that streams new pods for this node without end (492 MB in 30 s were measured) fills the
    cache to MAX_PODS and no further, with one line; the pods it holds are still chosen, and once a pod goes
    a new one is kept again."""
    api = _BurstApi(burst=MAX_PODS + 300)
    pods = VolcanoPods()
    caplog.set_level("INFO", logger="ascend_agent.cluster")
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(pods._watch, api)
            while api.delivered < MAX_PODS + 300:
                await anyio.sleep(0.01)
            tasks.cancel_scope.cancel()
    assert len(pods._pods) == MAX_PODS
    lines = [r.getMessage() for r in caplog.records if f"more than {MAX_PODS} pods" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "the pods past them are not kept" in lines[0]
    pods._forget("u0")
    pods._store(PodView("ns", "new", "u-new", {T: "Ascend910-3", "predicate-time": "5"}, {T: 1}))
    assert pods._choose(T, 1) is not None and pods._choose(T, 1).name == "new"  # type: ignore[union-attr]
    assert any("under 1000 again" in r.getMessage() for r in caplog.records)


def test_a_list_keeps_at_most_max_pods_of_the_node() -> None:
    def pod(n: int) -> dict[str, Any]:
        return {
            "metadata": {"name": f"p{n}", "namespace": "ns", "uid": f"u{n}"},
            "spec": {"nodeName": "node-1", "containers": []},
        }

    class _Client:
        def list(self, resource: type[Any], **kwargs: Any) -> _Listing:
            return _Listing(
                [msgspec.json.decode(msgspec.json.encode(pod(n)), type=resource) for n in range(MAX_PODS + 5)]
            )

    listed = _list_in_thread("node-1", _Client())  # type: ignore[arg-type]
    assert (len(listed.pods), listed.past) == (MAX_PODS, 5)


def test_a_pod_is_kept_as_what_the_choice_reads_and_no_more() -> None:
    """A pod's view keeps the annotations the choice reads (predicate-time, the huawei.com domain's), each cut
    to MAX_VALUE characters (a cut names no chip), and the huawei.com limits: a megabyte of other annotations
    costs nothing."""
    pod = _volcano_pod("big", "Ascend910-" + "9" * 200_000, "100")
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "x" * (1 << 20)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    view = PodView.of(Pod.from_dict(pod))
    assert set(view.annotations) == {T, "predicate-time"}
    assert view.limits == {T: 1}
    assert len(view.annotations[T]) == MAX_VALUE + 1 and view.annotations[T].endswith("\u2026")
    assert view.chosen(T)[0] not in {f"Ascend910-{n}" for n in range(8)}
    too_long = _volcano_pod("n" * 300, "Ascend910-3", "100")
    with pytest.raises(ValueError, match=r"its name 'nnnn.*' is longer than a Kubernetes name"):
        PodView.of(Pod.from_dict(too_long))
