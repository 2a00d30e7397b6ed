"""Strict decoders of what ascend-for-volcano reads, field for field as Huawei's Go types declare them
(``NodeDeviceInfoCache``, ``NodeDeviceInfo``, the fault entries of ``<T>-Fault`` and ``baseDeviceInfos``).
Like ``json.Decoder.DisallowUnknownFields`` with Go's type checks: an unknown field, a missing one, or a value
of the wrong type fails."""

from __future__ import annotations

import json
from typing import Any

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT32 = (0, 2**32 - 1)


class DecodeError(AssertionError):
    pass


def _fields(value: Any, required: set[str], optional: set[str], what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DecodeError(f"{what}: not an object: {value!r}")
    unknown = set(value) - required - optional
    if unknown:
        raise DecodeError(f"{what}: unknown fields {sorted(unknown)}")
    missing = required - set(value)
    if missing:
        raise DecodeError(f"{what}: missing fields {sorted(missing)}")
    return value


def _int(value: Any, bounds: tuple[int, int], what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not bounds[0] <= value <= bounds[1]:
        raise DecodeError(f"{what}: not an integer in {bounds}: {value!r}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise DecodeError(f"{what}: not a string: {value!r}")
    return value


def node_device_info_cache(text: str) -> dict[str, Any]:
    """``DeviceInfoCfg`` as ``NodeDeviceInfoCache``: ``DeviceInfo``, ``SuperPodID`` (int32), ``ServerIndex``
    (int32), ``CheckCode`` (string), optional ``RackID`` (*int32)."""
    cache = _fields(
        json.loads(text), {"DeviceInfo", "SuperPodID", "ServerIndex", "CheckCode"}, {"RackID"}, "cache"
    )
    info = _fields(cache["DeviceInfo"], {"DeviceList", "UpdateTime"}, set(), "DeviceInfo")
    _int(info["UpdateTime"], _INT64, "UpdateTime")
    if not isinstance(info["DeviceList"], dict):
        raise DecodeError("DeviceList: not a map")
    for key, value in info["DeviceList"].items():
        _str(value, f"DeviceList[{key}]")
    _int(cache["SuperPodID"], _INT32, "SuperPodID")
    _int(cache["ServerIndex"], _INT32, "ServerIndex")
    _str(cache["CheckCode"], "CheckCode")
    if cache.get("RackID") is not None:
        _int(cache["RackID"], _INT32, "RackID")
    return cache


_FAULT_FIELDS = {
    "fault_type",
    "npu_name",
    "large_model_fault_level",
    "fault_level",
    "fault_handling",
    "fault_code",
    "fault_time_and_level_map",
}


def fault_list(text: str) -> list[dict[str, Any]]:
    """A ``<T>-Fault`` value: a JSON array of Huawei's fault entries."""
    entries = json.loads(text)
    if not isinstance(entries, list):
        raise DecodeError("fault list: not an array")
    for entry in entries:
        _fields(entry, _FAULT_FIELDS, set(), "fault")
        for name in _FAULT_FIELDS - {"fault_time_and_level_map"}:
            _str(entry[name], name)
        levels = entry["fault_time_and_level_map"]
        if not isinstance(levels, dict):
            raise DecodeError("fault_time_and_level_map: not a map")
        for code, level in levels.items():
            _fields(level, {"fault_time", "fault_level"}, set(), f"fault_time_and_level_map[{code}]")
            _int(level["fault_time"], _INT64, "fault_time")
            _str(level["fault_level"], "fault_level")
    return entries


def base_device_infos(text: str) -> dict[str, Any]:
    """The ``baseDeviceInfos`` annotation: device ID -> ``{"IP": string, "SuperDeviceID": uint32}``."""
    infos = json.loads(text)
    if not isinstance(infos, dict):
        raise DecodeError("baseDeviceInfos: not a map")
    for device, info in infos.items():
        _fields(info, {"IP", "SuperDeviceID"}, set(), device)
        _str(info["IP"], "IP")
        _int(info["SuperDeviceID"], _UINT32, "SuperDeviceID")
    return infos
