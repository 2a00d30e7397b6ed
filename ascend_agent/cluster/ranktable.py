"""The part of a job's ``hccl.json`` (rank table) one pod on this node contributes, made from the pod as
ascend-operator reads it: the ``ascend-910-configuration`` annotation (the chips, their device IPs and, on
A3, their super-device ids), ``hccl/rankIndex``, the pod's IP. ``ascend-agent ranktable --pod NS/NAME``
prints it, so an operator sees what the job will get before the operator writes ``rings-config-<job>``.

    >>> pod = PlacedPod("ns", "w-1", "node-1", "10.244.1.7", {
    ...     "hccl/rankIndex": "1",
    ...     CONFIGURATION: '{"pod_name":"w-1","server_id":"uid-1","host_ip":"192.168.0.2","super_pod_id":-2,'
    ...     '"devices":[{"device_id":"0","device_ip":"10.0.0.1"},{"device_id":"1","device_ip":"10.0.0.2"}],'
    ...     '"server_index":"-2","server_ip":"192.168.0.2"}'})
    >>> table = fragment(pod)
    >>> table["version"], [device["rank_id"] for device in table["server_list"][0]["device"]]
    ('1.0', ['2', '3'])
    >>> print(render(table["server_list"][0]["device"][0]))
    {"device_id":"0","device_ip":"10.0.0.1","rank_id":"2"}

What ascend-operator does with each pod (``pkg/ranktable``), and so what this does:

- ``rank_id`` of the i-th device of the annotation = ``rankIndex * len(devices) + i``; the devices stay in
  the annotation's order (by physical id).
- ``server_id`` = the annotation's ``server_id`` (the pod's uid), or its ``host_ip`` when the pod's
  annotation ``onePodOneNode`` is ``"true"``; ``host_ip`` from the annotation; ``container_ip`` = the pod's
  IP.
- v1.2 also copies each device's ``super_device_id`` and puts the server in ``super_pod_list`` under its
  logical super pod: ``rankIndex // max(1, sp_block // devices)`` (0 without an ``sp-block``), or the pod's
  ``super-pod-rank`` annotation (soft strategy) when it has one.
- v1.0 refuses a pod with any ``device_ip`` ``-1``; so does this, for both versions (the agent never writes
  it). The whole table also has ``status``, ``server_count`` and every pod's server sorted by its first
  ``rank_id``: those need every pod, and are not part of a fragment.

Which version a job gets is the job's choice (v1.2 for the A3 super-pod schedule policies, an ``sp-block``
annotation or an ``accelerator-type`` of ``module-a3-16-super-pod``/``module-a3-8-super-pod``); the pod shows
only the node selector, so :func:`version_of` looks at that and the pod's own annotations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ascend_agent.cluster.deviceinfo import go_json
from ascend_agent.echo import cut

CONFIGURATION = "ascend.kubectl.kubernetes.io/ascend-910-configuration"
CONFIGURATION_NPU = "ascend.kubectl.kubernetes.io/ascend-npu-configuration"
RANK_INDEX = "hccl/rankIndex"
ONE_POD_ONE_NODE = "onePodOneNode"
SUPER_POD_RANK = "super-pod-rank"
SP_BLOCK = "sp-block"
SCHEDULE_POLICY = "huawei.com/schedule_policy"
ACCELERATOR_TYPE = "accelerator-type"
V1_0 = "1.0"
V1_2 = "1.2"
VERSIONS = (V1_0, V1_2)
# What makes ascend-operator write v1.2 (A3 super pods).
_V1_2_POLICIES = frozenset({"chip2-node16-sp", "chip2-node8-sp", "multilevel"})
_V1_2_ACCELERATORS = frozenset({"module-a3-16-super-pod", "module-a3-8-super-pod"})
# Huawei's device plugin writes this when it cannot read a device IP; ascend-operator's v1.0 refuses it.
ERROR_IP = "-1"
# What Go's strconv.Atoi takes, less a minus: a rank index is never negative, and Atoi refuses what is past
# Go's int (64 bits).
_RANK_INDEX = re.compile(r"\+?[0-9]+")
_MAX_INT = 2**63 - 1


class RankTableError(ValueError):
    """The pod cannot contribute to a rank table; the message is one line naming the pod and what to do."""


@dataclass(frozen=True, slots=True)
class PlacedPod:
    """What a rank table needs of a pod: where it runs, its IP and its annotations (and node selector)."""

    namespace: str
    name: str
    node: str  # spec.nodeName; "" while unscheduled
    pod_ip: str  # status.podIP; "" until the pod has one
    annotations: Mapping[str, str]
    node_selector: Mapping[str, str] = field(default_factory=dict)
    uid: str = ""  # metadata.uid
    host_ip: str = ""  # status.hostIP: the node's address as the kubelet gives it

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def configured(self) -> bool:
        """Whether the pod carries a configuration annotation (Volcano's path: the chips' device plugin wrote
        it when the pod got its chips)."""
        return CONFIGURATION in self.annotations or CONFIGURATION_NPU in self.annotations


def version_of(pod: PlacedPod) -> str:
    """The rank-table version ascend-operator picks, as far as the pod shows it.

    >>> version_of(PlacedPod("ns", "p", "n", "", {}, {"accelerator-type": "module-a3-16-super-pod"}))
    '1.2'
    >>> version_of(PlacedPod("ns", "p", "n", "", {}, {"accelerator-type": "module-910b-8"}))
    '1.0'
    """
    annotations = pod.annotations
    if SCHEDULE_POLICY in annotations:
        return V1_2 if annotations[SCHEDULE_POLICY] in _V1_2_POLICIES else V1_0
    if SP_BLOCK in annotations or pod.node_selector.get(ACCELERATOR_TYPE) in _V1_2_ACCELERATORS:
        return V1_2
    return V1_0


def fragment(pod: PlacedPod, version: str | None = None, sp_block: int | None = None) -> dict[str, Any]:
    """This pod's part of the job's ``hccl.json``: ``server_list`` with its one server, ``version`` and, for
    v1.2, ``super_pod_list`` with the server under its logical super pod. ``version`` None:
    :func:`version_of`. ``sp_block`` None: the pod's ``sp-block`` annotation, else none. Raises
    :class:`RankTableError`."""
    version = version or version_of(pod)
    if version not in VERSIONS:
        raise RankTableError(f"rank-table version {version!r} is not one of {', '.join(VERSIONS)}")
    instance = _instance(pod)
    rank_index = _rank_index(pod)
    if not pod.pod_ip:
        raise RankTableError(
            f"pod {pod.ref} has no IP yet (status.podIP), which ascend-operator needs as container_ip: "
            "wait until it is Running"
        )
    devices = instance["devices"]
    refused = [device["device_id"] for device in devices if device["device_ip"] == ERROR_IP]
    if refused:
        raise RankTableError(
            f"pod {pod.ref}'s {CONFIGURATION} gives device_ip -1 for device {', '.join(refused)}, which "
            "ascend-operator refuses: the writer could not read those IPs (check `hccn_tool -i N -ip -g`)"
        )
    server_id = instance["server_id"]
    if pod.annotations.get(ONE_POD_ONE_NODE) == "true":
        server_id = instance["host_ip"]
    entries = []
    for index, device in enumerate(devices):
        entry = {"device_id": device["device_id"], "device_ip": device["device_ip"]}
        if version == V1_2 and device.get("super_device_id"):
            entry["super_device_id"] = device["super_device_id"]
        entry["rank_id"] = str(rank_index * len(devices) + index)
        entries.append(entry)
    server = {
        "device": entries,
        "server_id": server_id,
        "host_ip": instance["host_ip"],
        "container_ip": pod.pod_ip,
    }
    table: dict[str, Any] = {"server_list": [server], "version": version}
    if version == V1_2:
        super_pod = pod.annotations.get(SUPER_POD_RANK)
        if super_pod is None:
            block = _sp_block(pod) if sp_block is None else sp_block
            super_pod = str(logical_super_pod(rank_index, block, len(devices)))
        table["super_pod_list"] = [{"super_pod_id": super_pod, "server_list": [{"server_id": server_id}]}]
    return table


def render(table: Mapping[str, Any]) -> str:
    """A rank table as ascend-operator writes it: Go's ``json.Marshal``, keys in its structs' order."""
    return go_json(table)


def logical_super_pod(rank_index: int, sp_block: int, devices: int) -> int:
    """The logical super pod of the pod of ``rank_index``: pods of ``sp_block // devices`` chips each share
    one (at least one pod each); all in 0 without an ``sp_block``.

    >>> [logical_super_pod(rank, 32, 16) for rank in range(5)], logical_super_pod(3, 0, 16)
    ([0, 0, 1, 1, 2], 0)
    """
    if sp_block <= 0 or devices <= 0:
        return 0
    return rank_index // max(1, sp_block // devices)


def gaps(table: Mapping[str, Any]) -> list[str]:
    """What a fragment lacks that the operator takes but HCCL needs, one line each: devices without a
    ``device_ip`` (unreachable over RoCE) and, in v1.2, without a ``super_device_id``.

    >>> device = {"device_id": "3", "device_ip": ""}
    >>> [line.split(":")[0] for line in gaps({"version": "1.2", "server_list": [{"device": [device]}]})]
    ['device 3 has no device_ip', 'device 3 has no super_device_id']
    """
    devices = [device for server in table["server_list"] for device in server["device"]]
    lines = []
    unreachable = [device["device_id"] for device in devices if not device["device_ip"]]
    if unreachable:
        lines.append(
            f"device {', '.join(unreachable)} has no device_ip: HCCL cannot reach it over RoCE (check "
            "`hccn_tool -i N -ip -g` on the node)"
        )
    unplaced = [device["device_id"] for device in devices if not device.get("super_device_id")]
    if table["version"] == V1_2 and unplaced:
        lines.append(
            f"device {', '.join(unplaced)} has no super_device_id: a v1.2 table needs each die's SDID (check "
            "`npu-smi info -t spod-info`)"
        )
    return lines


def _instance(pod: PlacedPod) -> dict[str, Any]:
    """The pod's configuration annotation, read as ascend-operator's ``Instance`` reads it (missing fields
    are empty, unknown ones ignored), with the types it needs checked."""
    text = pod.annotations.get(CONFIGURATION)
    if text is None and CONFIGURATION_NPU in pod.annotations:
        raise RankTableError(
            f"pod {pod.ref} has {CONFIGURATION_NPU} (Ascend 950): its rank table is v2.0, which ranktable "
            "does not make"
        )
    if text is None:
        raise RankTableError(
            f"pod {pod.ref} has no {CONFIGURATION} annotation: the chips' device plugin writes it when the "
            "pod gets its chips (ascend-agent with --volcano, or Volcano for ascend-operator jobs)"
        )
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise RankTableError(
            f"pod {pod.ref}'s {CONFIGURATION} is not JSON ({cut(str(exc))}): rewrite it"
        ) from None
    except RecursionError:
        raise RankTableError(
            f"pod {pod.ref}'s {CONFIGURATION} nests arrays or objects too deep to read (the agent writes "
            "three levels): rewrite it"
        ) from None
    if not isinstance(value, dict):
        raise RankTableError(f"pod {pod.ref}'s {CONFIGURATION} is not a JSON object: rewrite it")
    instance: dict[str, Any] = {}
    for key in ("server_id", "host_ip"):
        instance[key] = _text(value.get(key, ""), pod, key)
    devices = value.get("devices") or []
    if not isinstance(devices, list) or not devices:
        raise RankTableError(f"pod {pod.ref}'s {CONFIGURATION} lists no devices: the pod has no chips")
    instance["devices"] = []
    for device in devices:
        if not isinstance(device, dict):
            raise RankTableError(f"pod {pod.ref}'s {CONFIGURATION} has a device that is not an object")
        instance["devices"].append(
            {
                key: _text(device.get(key, ""), pod, key)
                for key in ("device_id", "device_ip", "super_device_id")
            }
        )
    return instance


def _text(value: Any, pod: PlacedPod, key: str) -> str:
    if not isinstance(value, str):
        raise RankTableError(
            f"pod {pod.ref}'s {CONFIGURATION} has {key} {cut(repr(value))}, not a string: rewrite it"
        )
    return value


def _rank_index(pod: PlacedPod) -> int:
    text = pod.annotations.get(RANK_INDEX)
    if text is None:
        raise RankTableError(
            f"pod {pod.ref} has no {RANK_INDEX} annotation: Volcano writes it for jobs with minAvailable or "
            "an ascend-operator job; without it ascend-operator leaves the pod out"
        )
    number = _go_int(text)
    if number is None:
        raise RankTableError(f"pod {pod.ref}'s {RANK_INDEX} is {cut(text)!r}, not a rank index (0, 1, ...)")
    return number


def _sp_block(pod: PlacedPod) -> int:
    return _go_int(pod.annotations.get(SP_BLOCK, "0")) or 0


def _go_int(text: str) -> int | None:
    """``text`` as Go's strconv.Atoi reads a number that is not negative; None where it fails (not digits,
    or past a 64-bit int: a 5000-digit one included, which Python's int() itself refuses).

    >>> _go_int("+007"), _go_int("9223372036854775807"), _go_int("9223372036854775808"), _go_int("9" * 5000)
    (7, 9223372036854775807, None, None)
    """
    if not _RANK_INDEX.fullmatch(text):
        return None
    digits = text.lstrip("+").lstrip("0") or "0"
    if len(digits) > len(str(_MAX_INT)):
        return None
    number = int(digits)
    return number if number <= _MAX_INT else None
