"""The cluster side: what the agent writes to and reads from the Kubernetes API server.

Nothing here is on the kubelet's path. Registration, ListAndWatch and Allocate never wait on the API server:
each feature runs in its own task, writes through a :class:`~ascend_agent.cluster.writer.LatestWriter` (the
newest state wins, retries back off to 30 s with jitter) and every request is bounded by
:attr:`KubeApi.timeout <ascend_agent.cluster.client.KubeApi.timeout>`.

This package's ``__init__``, :mod:`.credentials` and :mod:`.side` import no client library; lightkube is
imported by ``side.run`` (in a worker thread, so the kubelet's registration does not wait for it) once
credentials are found, so an agent with ``--no-cluster`` (config ``cluster: false``) or without credentials
never loads it.

The agent does two things with it::

    side = open_side(settings)             # None: off (flag, or no credentials: one info line)
    tasks.start_soon(side.run)             # imports the client in a thread, then one task per feature
    side.observe(inventory)                # after each reconcile: chips, health, held chips

How a feature plugs in (node labels, Events, a ConfigMap publisher, a ResourceSlice publisher, a pod watch):

1. Write a class with the two methods of :class:`~ascend_agent.cluster.side.Feature`:
   ``observe(inventory)`` (on the event loop, never awaits: compute the desired state and hand it to a
   writer, or just remember it) and ``async run(api)`` (its task for the agent's lifetime).
2. In ``run``, make requests with ``api.client`` (lightkube's ``AsyncClient``; typed resources from
   ``lightkube.resources``, e.g. ``resource_v1.ResourceSlice``; a kind it lacks through
   ``lightkube.generic_resource``) wrapped in ``await api.call(verb, resource, request)``: that bounds the
   time, feeds ``ascend_agent_kube_api_up`` and ``/healthz``, logs each kind of failure once, and raises
   :class:`~ascend_agent.cluster.client.ApiUnavailable` when the server does not serve the request (404/409
   come back as lightkube's ``ApiError`` for the feature to handle).
3. For state the agent owns, run a ``LatestWriter(name, apply)`` in the feature's task and call
   ``writer.set(state)`` from ``observe``; ``writer.refresh()`` rewrites unchanged state (a periodic refresh,
   an object deleted by hand). For a watch, keep a ``WatchCursor``: list when its ``version`` is None, then
   ``async for kind, obj in api.watch("pods", Pod, cursor, server_timeout=...)`` inside ``run`` (failures
   recorded as for ``call``; bookmarks move the cursor and are not yielded; a 410 sets it to None), catching
   ``ApiUnavailable`` and watching again from the cursor after ``wait_before_retry(backoff, exc)``
   (:func:`~ascend_agent.backoff.wait_before_retry`, :func:`~ascend_agent.cluster.writer.api_backoff`).
4. Add the feature to :func:`_features` (and its RBAC to docs/cluster.md). Patches are JSON merge
   patches (``PatchType.MERGE``): ``null`` removes a key, and the test API server understands them.

Tests run against :mod:`tests.support.apiserver` (the ``apiserver`` fixture: a Kubernetes API emulator on
loopback with a kubeconfig file, which can hang or answer 403/500 per verb and resource; its docstring says
what it does not do: selectors, resourceVersion).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import anyio

from ascend_agent.cluster.credentials import ClusterTarget, find_target, node_name
from ascend_agent.health.separation import ManualSeparation

if TYPE_CHECKING:
    from ascend_agent.cluster.client import KubeApi
    from ascend_agent.cluster.ranktable import PlacedPod
    from ascend_agent.cluster.side import ClusterSide, Feature
    from ascend_agent.cluster.volcano import MountedView, VolcanoPods
    from ascend_agent.config import Settings
    from ascend_agent.health.grading import FaultGrading
    from ascend_agent.model import Chip, Holders

__all__ = [
    "ClusterTarget",
    "find_target",
    "node_name",
    "on_mounted_chips",
    "open_side",
    "pod_rank_table",
    "volcano_holders",
    "volcano_remapper",
]

# (resource, the kubelet's device IDs per container) -> the chips to hand over.
VolcanoRemapper = Callable[[str, Sequence[Sequence[str]]], Awaitable[list[list[str]]]]

log = logging.getLogger("ascend_agent.cluster")

# An Allocate that comes while the cluster side is still loading waits this long for it (as long as the tries
# for a pod take).
_STARTING_WAIT = 3.0


def open_side(
    settings: Settings,
    separation: ManualSeparation | None = None,
    mounted: MountedView | None = None,
    grading: FaultGrading | None = None,
    more: Sequence[Callable[[], Feature]] = (),
) -> ClusterSide | None:
    """The cluster side for ``settings``, or None when it is off. Imports no client library and makes no
    request; raises :class:`~ascend_agent.config.ConfigError` for a kubeconfig that cannot be read.
    ``separation`` receives the chips an admin separates in the device-info ConfigMap; ``mounted``, with
    ``--volcano``, the chips each pod got under the kubelet's IDs; ``grading``, with the device-info ConfigMap
    on, the fault table of ``kube-system/mindx-dl-fault-config``; ``more`` makes the features of other parts
    (the DRA driver's ResourceSlice publisher), after this package's own, once the side loads."""
    if not settings.cluster:
        return None
    target = find_target(str(settings.kubeconfig) if settings.kubeconfig else None)
    if target is None:
        log.info(
            "No Kubernetes credentials (no service account, --kubeconfig or KUBECONFIG): "
            "the cluster side (node labels, Events) is off"
        )
        return None
    from ascend_agent.cluster.side import ClusterSide

    if target.kubeconfig is not None and not os.access(target.kubeconfig, os.R_OK):
        from ascend_agent.config import ConfigError

        raise ConfigError(
            f"--kubeconfig: cannot use {target.describe()}: it does not exist or cannot be read"
        )

    def replicas() -> int:  # the agent replaces side.settings on a config reload
        return (side.settings or settings).replicas

    features = partial(
        _features, settings, separation or ManualSeparation(), replicas, mounted, grading, more
    )
    side = ClusterSide(target, node_name(settings.node_name), features, settings)
    return side


def _features(
    settings: Settings,
    separation: ManualSeparation,
    replicas: Callable[[], int],
    mounted: MountedView | None = None,
    grading: FaultGrading | None = None,
    more: Sequence[Callable[[], Feature]] = (),
) -> list[Feature]:
    """Every feature of the cluster side, in the order their tasks start. ``settings`` are those of the
    start; ``replicas`` gives the running setting (a config reload changes it)."""
    from ascend_agent.cluster.events import NodeEvents
    from ascend_agent.cluster.labels import NodeLabels

    events = NodeEvents()
    features: list[Feature] = [NodeLabels(replicas), events]
    if settings.hot_reset != "off":
        from ascend_agent.cluster.resetinfo import ResetInfoAnnotation

        features.append(ResetInfoAnnotation())
    if settings.device_info:
        from ascend_agent.cluster.deviceinfo_publisher import DeviceInfoPublisher

        features.append(DeviceInfoPublisher(separation))
        if grading is not None:
            from ascend_agent.cluster.faultconfig import FaultConfigFollow

            features.append(FaultConfigFollow(grading))
    if settings.volcano:
        from ascend_agent.cluster.volcano import VolcanoPods

        features.append(
            VolcanoPods(mounted=mounted, scheduler=settings.volcano_scheduler_name, events=events.note_pod)
        )

    features.extend(make() for make in more)
    return features


def volcano_remapper(side: ClusterSide | None, settings: Settings) -> VolcanoRemapper | None:
    """``--volcano``: the call that gives Allocate the chips Volcano chose (see :mod:`.volcano`); None when
    it is off. The features load after the agent starts: until then the call refuses (the kubelet fails the
    pod, whose controller makes it again)."""
    if side is None or not settings.volcano:
        return None

    async def remap(resource: str, containers: Sequence[Sequence[str]]) -> list[list[str]]:
        with anyio.move_on_after(_STARTING_WAIT):
            # the client and the features load in a thread after the first registration
            await side.wait_loaded()
        pods = _volcano_pods(side)
        if pods is None:
            raise LookupError(
                f"the cluster side has not started within {_STARTING_WAIT:g} s: Volcano's choice of chips is "
                "not known yet; the kubelet fails the pod"
            )
        return await pods.remap(resource, containers)

    return remap


def volcano_holders(side: ClusterSide | None, settings: Settings) -> Callable[[Holders], Holders] | None:
    """``--volcano``: the kubelet's PodResources view of which pod holds which chip, moved to the chips
    really mounted (see :mod:`.volcano`); None when it is off."""
    if side is None or not settings.volcano:
        return None

    def follow(holders: Holders) -> Holders:
        pods = _volcano_pods(side)
        return holders if pods is None else pods.follow_mounted(holders)

    return follow


async def on_mounted_chips(settings: Settings, holders: Holders, timeout: float) -> tuple[Holders, str]:
    """``--volcano``: the kubelet's holders (by its IDs) moved to the chips really mounted, from the pods'
    marks, for ``list`` and the doctor (the agent keeps its own pod cache); or why the pods cannot be read.
    Reads the node's pods once, each request bounded by ``timeout``."""
    target = find_target(str(settings.kubeconfig) if settings.kubeconfig else None)
    if target is None:
        return (
            holders,
            "with --volcano the pods' marks say which chip each holds: no Kubernetes API to read them",
        )
    from ascend_agent.cluster.bounded import MIB
    from ascend_agent.cluster.client import ApiUnavailable, ClusterConnectError, KubeApi
    from ascend_agent.cluster.podlist import node_pods
    from ascend_agent.cluster.volcano_marks import follow_mounted, mounted_from

    try:
        api = KubeApi.connect(
            target,
            node_name(settings.node_name),
            timeout=timeout,
            list_limit=settings.api_list_limit_mib * MIB,
        )
    except ClusterConnectError as exc:
        return holders, str(exc)
    try:
        return follow_mounted(holders, mounted_from(await node_pods(api))), ""
    except ApiUnavailable as exc:
        return holders, f"the pods' marks could not be read: {exc.failure}"
    finally:
        await api.close()


# The chips the kubelet says a pod (namespace, name) holds on this node; RankTableError, one line, when it
# cannot say.
HeldChips = Callable[[str, str], Awaitable[Sequence["Chip"]]]


async def pod_rank_table(
    settings: Settings,
    namespace: str,
    name: str,
    version: str | None,
    sp_block: int | None,
    timeout: float,
    held: HeldChips | None = None,
) -> dict[str, Any]:
    """``ascend-agent ranktable``: the part of the job's ``hccl.json`` the pod ``namespace/name`` on this
    node contributes (:func:`ascend_agent.cluster.ranktable.fragment`), read from the API server once, each
    request bounded by ``timeout``. A pod without the configuration annotation (placed by another scheduler,
    or holding chips through a DRA claim) gets the one the agent would write, from the chips ``held`` says
    the kubelet gave it, and the Node's address. Every reason it cannot be made is a one-line
    ``RankTableError``."""
    from ascend_agent.cluster.bounded import MIB
    from ascend_agent.cluster.client import ApiUnavailable, ClusterConnectError, KubeApi
    from ascend_agent.cluster.placed import read_placed_pod
    from ascend_agent.cluster.ranktable import RankTableError, fragment

    target = find_target(str(settings.kubeconfig) if settings.kubeconfig else None)
    if target is None:
        raise RankTableError(
            "no Kubernetes API to read the pod from: run it in the agent's pod or give --kubeconfig"
        )
    node = node_name(settings.node_name)
    try:
        api = KubeApi.connect(target, node, timeout=timeout, list_limit=settings.api_list_limit_mib * MIB)
    except ClusterConnectError as exc:
        raise RankTableError(str(exc)) from None
    try:
        pod = await read_placed_pod(api, namespace, name)
        if pod is None:
            raise RankTableError(f"there is no pod {namespace}/{name}: check the name with kubectl get pods")
        if pod.node != node:
            where = f"on node {pod.node}" if pod.node else "not scheduled yet"
            raise RankTableError(
                f"pod {namespace}/{name} is {where}, not on this node ({node}): run this on its node, or "
                "give --node-name"
            )
        if not pod.configured and held is not None:
            pod = await _configured_by_kubelet(api, pod, held)
    except ApiUnavailable as exc:
        raise RankTableError(f"pod {namespace}/{name} could not be read: {exc.failure}") from None
    finally:
        await api.close()
    return fragment(pod, version, sp_block)


async def _configured_by_kubelet(api: KubeApi, pod: PlacedPod, held: HeldChips) -> PlacedPod:
    """``pod`` with the configuration annotation the agent writes, made from the chips the kubelet gave it
    and the Node's first InternalIP (the pod's ``status.hostIP`` when the Node cannot be read)."""
    from lightkube import ApiError

    from ascend_agent.cluster.client import ApiUnavailable
    from ascend_agent.cluster.placed import node_address
    from ascend_agent.cluster.ranktable import CONFIGURATION, RankTableError
    from ascend_agent.cluster.volcano_marks import PodView, configuration

    chips = sorted(await held(pod.namespace, pod.name), key=lambda chip: chip.phys_id)
    if not chips:
        raise RankTableError(
            f"pod {pod.ref} has no {CONFIGURATION} annotation and the kubelet lists no chip of this node for "
            "it: it holds no NPU here (check its resources: limits or claims)"
        )
    try:
        host_ip = await node_address(api)
    except (ApiUnavailable, ApiError):
        host_ip = ""
    view = PodView(pod.namespace, pod.name, pod.uid, {}, {})
    text = configuration(view, chips, host_ip or pod.host_ip)
    return replace(pod, annotations={**pod.annotations, CONFIGURATION: text})


def _volcano_pods(side: ClusterSide) -> VolcanoPods | None:
    """The ``--volcano`` feature once the cluster side has loaded it (this imports nothing)."""
    found = [feature for feature in side.features if type(feature).__name__ == "VolcanoPods"]
    return cast("VolcanoPods", found[0]) if found else None
