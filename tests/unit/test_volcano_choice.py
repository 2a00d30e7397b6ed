"""Volcano's choice on Allocate: the pod cache's index picks what :func:`choose` picks over every pod, through
any sequence of pods arriving, changing, being taken and going."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

import anyio
import anyio.lowlevel
from hypothesis import given
from hypothesis import strategies as st
from lightkube.resources.core_v1 import Pod

from ascend_agent.cluster.volcano import TAKEN, Mounted, PodView, VolcanoPods, choose

T = "huawei.com/Ascend910"
P = "huawei.com/Ascend310P"


@st.composite
def _pods(draw: st.DrawFn) -> PodView:
    name = draw(st.sampled_from([f"pod-{i}" for i in range(6)]))
    resource = draw(st.sampled_from([T, P]))
    chips = draw(st.integers(0, 3))
    time = draw(st.one_of(st.integers(0, 5).map(str), st.just(TAKEN), st.just("x"), st.just("")))
    annotations = {resource: ",".join(f"Ascend910-{i}" for i in range(chips)), "predicate-time": time}
    limits = {resource: draw(st.integers(0, 2))}
    return PodView("ns", name, f"uid-{name}", annotations, limits, terminating=draw(st.booleans()))


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
        self._burst = burst

    def list(self, *args: Any, **kwargs: Any) -> _Listing:
        return _Listing()

    def watch(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def call(self, verb: str, resource: str, request: Awaitable[Any]) -> Any:
        return await request

    async def stream(self, resource: str, watch: None) -> AsyncIterator[tuple[str, Pod]]:
        for n in range(self._burst):
            self.delivered += 1
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
    resourceVersion = "1"

    def __aiter__(self) -> _Listing:
        return self

    async def __anext__(self) -> Pod:
        raise StopAsyncIteration


async def test_a_burst_of_watch_events_lets_other_work_run_between_them() -> None:
    """An Allocate arriving during a burst of pod events waits for one event, not for the whole burst."""
    api = _BurstApi(burst=50)
    pods = VolcanoPods()
    seen_by_other_task: list[int] = []

    async def other_task() -> None:
        while api.delivered == 0:
            await anyio.lowlevel.checkpoint()
        seen_by_other_task.append(api.delivered)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(pods._watch, api)
            await other_task()
            tasks.cancel_scope.cancel()
    assert seen_by_other_task[0] < 50
