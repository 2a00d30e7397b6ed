"""``hccl.json`` (the rank table ascend-operator writes) for tests: Huawei's documented examples read as JSON,
a strict decoder of the v1.0 and v1.2 formats, and the operator's gathering of every pod's part into the
whole table.

    example = doc_example("1.2")                  # the documented v1.2 table, comments and "..." dropped
    table = gather([fragment_0, fragment_1])      # what the operator writes for the job's pods
    hccl_json(table, "1.2")                       # raises DecodeError unless it is a valid v1.2 table

The format (``docs/en/scheduling/api/hccl.json_file_description.md`` of MindCluster, and the fields of
ascend-operator's types): every value a string; ``status`` ``initializing``/``completed``; ``server_list`` of
``{device, [hardware_type], server_id, host_ip, [container_ip]}``; each device ``{device_id, device_ip,
[super_device_id] (v1.2), rank_id}``; ``server_count``; ``version``; v1.2 adds ``super_pod_list`` of
``{super_pod_id, server_list: [{server_id}]}``.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable
from typing import Any

from tests.support.training_fixtures import read
from tests.support.volcano_types import DecodeError, _fields, _str

_EXAMPLES = {
    "1.0": "hccl.json-v1.0_doc-example-with-comments.txt",
    "1.2": "hccl.json-v1.2_doc-example-with-comments.txt",
}


def doc_example(version: str) -> dict[str, Any]:
    """Huawei's documented table of ``version``: its ``//`` comments, ``...`` lines and the empty entries they
    leave dropped, the commas it leaves out put back."""
    text = read(_EXAMPLES[version])
    text = text[text.index("{") :]
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"^\s*\.\.\.\s*$", "", text, flags=re.MULTILINE)
    text = re.sub(r",\s*\{\s*\}", "", text)  # "}, {" then "..." then "}": an empty device
    text = re.sub(r'([}\]"])(\s*\n\s*")', r"\1,\2", text)  # a line that ends a value, then a key
    text = re.sub(r",(\s*[}\]])", r"\1", text)  # trailing commas
    value = json.loads(text)
    assert isinstance(value, dict)
    return value


def gather(fragments: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The job's whole table, as ascend-operator gathers its pods' parts: servers sorted by their first
    ``rank_id``, ``server_count`` their number, ``status`` completed; v1.2 servers listed under their logical
    super pod."""
    parts = list(fragments)
    versions = {part["version"] for part in parts}
    assert len(versions) == 1, versions
    servers = sorted(
        (server for part in parts for server in part["server_list"]),
        key=lambda server: int(server["device"][0]["rank_id"]),
    )
    table: dict[str, Any] = {
        "status": "completed",
        "server_list": servers,
        "server_count": str(len(servers)),
        "version": versions.pop(),
    }
    if table["version"] == "1.2":
        super_pods: dict[str, list[dict[str, str]]] = {}
        for part in parts:
            for super_pod in part["super_pod_list"]:
                super_pods.setdefault(super_pod["super_pod_id"], []).extend(super_pod["server_list"])
        table["super_pod_list"] = [
            {"super_pod_id": key, "server_list": value} for key, value in sorted(super_pods.items())
        ]
    return table


def hccl_json(value: Any, version: str) -> dict[str, Any]:
    """``value`` checked as a whole ``hccl.json`` of ``version``: the fields and nothing else, every value a
    string of its kind, rank ids 0..n-1 once each, device IPs addresses, server ids unique; v1.2 devices with
    a ``super_device_id`` and every server in exactly one super pod."""
    extra = {"super_pod_list"} if version == "1.2" else set()
    table = _fields(value, {"status", "server_list", "server_count", "version", *extra}, set(), "hccl.json")
    if table["status"] not in ("initializing", "completed"):
        raise DecodeError(f"status: {table['status']!r}")
    if table["version"] != version:
        raise DecodeError(f"version: {table['version']!r}, not {version}")
    servers = table["server_list"]
    if not isinstance(servers, list) or not servers:
        raise DecodeError("server_list: not a list of servers")
    if table["server_count"] != str(len(servers)):
        raise DecodeError(f"server_count {table['server_count']!r} for {len(servers)} servers")
    ranks: list[int] = []
    server_ids = []
    device_fields = {"device_id", "device_ip", "rank_id", *({"super_device_id"} if version == "1.2" else ())}
    for number, server in enumerate(servers):
        what = f"server_list[{number}]"
        _fields(server, {"device", "server_id", "host_ip"}, {"container_ip", "hardware_type"}, what)
        for key in ("server_id", "host_ip", "container_ip", "hardware_type"):
            if key in server:
                _str(server[key], f"{what}.{key}")
        _address(server["host_ip"], f"{what}.host_ip")
        if "container_ip" in server:
            _address(server["container_ip"], f"{what}.container_ip")
        server_ids.append(server["server_id"])
        if not isinstance(server["device"], list) or not server["device"]:
            raise DecodeError(f"{what}.device: not a list of devices")
        for index, device in enumerate(server["device"]):
            where = f"{what}.device[{index}]"
            _fields(device, device_fields, set(), where)
            for key in device_fields:
                _str(device[key], f"{where}.{key}")
            _address(device["device_ip"], f"{where}.device_ip")
            if not device["device_id"].isdigit() or not device["rank_id"].isdigit():
                raise DecodeError(f"{where}: device_id and rank_id are numbers: {device}")
            if version == "1.2" and not device["super_device_id"].isdigit():
                raise DecodeError(f"{where}.super_device_id: {device['super_device_id']!r}")
            ranks.append(int(device["rank_id"]))
    if sorted(ranks) != list(range(len(ranks))):
        raise DecodeError(f"rank ids are not 0..{len(ranks) - 1} once each: {ranks}")
    if len(set(server_ids)) != len(server_ids):
        raise DecodeError(f"server ids repeat: {server_ids}")
    if version == "1.2":
        listed = []
        for super_pod in table["super_pod_list"]:
            _fields(super_pod, {"super_pod_id", "server_list"}, set(), "super_pod_list[]")
            _str(super_pod["super_pod_id"], "super_pod_id")
            for entry in super_pod["server_list"]:
                listed.append(
                    _str(_fields(entry, {"server_id"}, set(), "super pod server")["server_id"], "id")
                )
        if sorted(listed) != sorted(server_ids):
            raise DecodeError(f"super_pod_list names {listed}, the servers are {server_ids}")
    return table


def _address(text: str, what: str) -> None:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise DecodeError(f"{what}: not an IP address: {text!r}") from None
