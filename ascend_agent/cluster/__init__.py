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
   an object deleted by hand). For a watch, ``async for kind, obj in api.stream("pods",
   api.client.watch(Pod, ...))`` inside ``run`` (failures recorded as for ``call``), catching
   ``ApiUnavailable`` and watching again after :class:`~ascend_agent.cluster.writer.Backoff`.
4. Add the feature to :func:`_features` (and its RBAC to the README's cluster section). Patches are JSON merge
   patches (``PatchType.MERGE``): ``null`` removes a key, and the test API server understands them.

Tests run against :mod:`tests.support.apiserver` (the ``apiserver`` fixture: a Kubernetes API emulator on
loopback with a kubeconfig file, which can hang or answer 403/500 per verb and resource; its docstring says
what it does not do: selectors, resourceVersion).
"""

from __future__ import annotations

import logging
import os
from functools import partial
from typing import TYPE_CHECKING

from ascend_agent.cluster.credentials import ClusterTarget, find_target, node_name

if TYPE_CHECKING:
    from ascend_agent.cluster.side import ClusterSide, Feature
    from ascend_agent.config import Settings

__all__ = ["ClusterTarget", "find_target", "node_name", "open_side"]

log = logging.getLogger("ascend_agent.cluster")


def open_side(settings: Settings) -> ClusterSide | None:
    """The cluster side for ``settings``, or None when it is off. Imports no client library and makes no
    request; raises :class:`~ascend_agent.config.ConfigError` for a kubeconfig that cannot be read."""
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
    return ClusterSide(target, node_name(settings.node_name), partial(_features, settings))


def _features(settings: Settings) -> list[Feature]:
    """Every feature of the cluster side, in the order their tasks start."""
    from ascend_agent.cluster.events import NodeEvents
    from ascend_agent.cluster.labels import NodeLabels

    features: list[Feature] = [NodeLabels(settings.replicas), NodeEvents()]
    if settings.kubelet_api == "dra":
        from ascend_agent.dra.slices import SlicePublisher

        features.append(
            SlicePublisher(settings.dra_driver_name, settings.dra_taint_effect, cleanup=settings.dra_cleanup)
        )
    return features
