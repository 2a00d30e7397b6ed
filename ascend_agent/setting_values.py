"""The checks of one setting's value, from the config file, the environment or a flag, each a :class:`Check`:
called, it returns the typed value or raises ``ValueError`` in words (``config`` names the key, variable or
flag); its ``schema`` is the JSON Schema of the values it lets through, from which the Helm chart's
values.schema.json is made (``config.file_schema``)::

    positive_int(3), seconds(1.0)(5), one_of("text", "json")("json"), optional(file_path)(None)
    plain_text(7)      # ValueError: must be a string
    one_of("text", "json").schema      # {'enum': ['text', 'json']}
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from ascend_agent.kube_names import DNS_SUBDOMAIN_PATTERN, is_dns_subdomain
from ascend_agent.model import CHIP_NAMES, UnknownModelError, chip_name

T = TypeVar("T")


class Check(Generic[T]):
    """A setting's check, called as the function it wraps, and ``schema``: the JSON Schema (draft 7) of the
    values it accepts as YAML gives them. The schema may let through what the check refuses, never the
    reverse: the chart must never refuse a file the agent would load.

    >>> positive_int(2), positive_int.schema
    (2, {'type': 'integer', 'minimum': 1})
    """

    __slots__ = ("_check", "schema")

    def __init__(self, check: Callable[[Any], T], schema: Mapping[str, Any]) -> None:
        self._check = check
        self.schema = schema

    def __call__(self, value: Any) -> T:
        return self._check(value)


def accepting(schema: Mapping[str, Any]) -> Callable[[Callable[[Any], T]], Check[T]]:
    """The decorator that makes a check function a :class:`Check` with ``schema``."""
    return lambda check: Check(check, schema)


_TEXT: dict[str, Any] = {"type": "string"}


@accepting({"type": "integer", "minimum": 1})
def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("must be a whole number of at least 1")
    return value


@accepting({"type": "number", "exclusiveMinimum": 0})
def positive_float(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError("must be a finite number above 0")
    return float(value)


@accepting({"type": "number", "minimum": 0})
def non_negative_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError("must be a finite number of at least 0 (0: off)")
    return float(value)


def seconds(minimum: float) -> Check[float]:
    def check(value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < minimum
        ):
            raise ValueError(f"must be a finite number of seconds, at least {minimum:g}")
        return float(value)

    return Check(check, {"type": "number", "minimum": minimum})


@accepting({"type": "integer", "minimum": 0})
def non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be a whole number of at least 0 (0: off)")
    return value


@accepting({"type": "boolean"})
def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


# List settings hold a handful of entries (driver paths, Health values); a long one is a mistake or worse.
MAX_LIST_ITEMS = 64
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@accepting(_TEXT)
def plain_text(value: Any) -> str:
    """A string without control characters: a newline or NUL in a setting would forge or break log lines."""
    if not isinstance(value, str):
        raise ValueError("must be a string")
    found = _CONTROL.search(value)
    if found is not None:
        raise ValueError(
            f"contains the control character U+{ord(found.group()):04X} at position {found.start()}; "
            "remove it"
        )
    return value


_CHIP_NAME_LIST = tuple(name for names in CHIP_NAMES.values() for name in names)
# What the chart's schema lets through as model: every name (bare, after "Ascend", after "Ascend "), and the
# numbers YAML makes of the names that are digits once their underscore is gone.
_CHIP_MODEL_SCHEMA = {
    "enum": [
        *(f"{prefix}{name}" for prefix in ("", "Ascend", "Ascend ") for name in _CHIP_NAME_LIST),
        *(int(name.replace("_", "")) for name in _CHIP_NAME_LIST if name.replace("_", "").isdigit()),
    ]
}


@accepting(_CHIP_MODEL_SCHEMA)
def chip_model(value: Any) -> str:
    """A chip name an Ascend family really has, as Huawei prints it (``910B4``, ``310P3``, ``910_9392``);
    YAML reads ``model: 310`` as a number, meant as the name, and ``model: 910_9392`` as 9109392 (YAML 1.1
    drops the underscore). A refusal names the nearest real name."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = next((name for name in _CHIP_NAME_LIST if name.replace("_", "") == str(value)), str(value))
    text = plain_text(value)
    try:
        return chip_name(text)
    except UnknownModelError as exc:
        raise ValueError(str(exc)) from None


@accepting(_TEXT)
def file_path(value: Any) -> Path:
    return Path(plain_text(str(value) if isinstance(value, Path) else value))


@accepting({"type": "array", "items": _TEXT, "maxItems": MAX_LIST_ITEMS})
def text_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError("must be a list of strings")
    if len(value) > MAX_LIST_ITEMS:
        raise ValueError(f"has {len(value)} entries; at most {MAX_LIST_ITEMS} are accepted")
    return tuple(plain_text(item) for item in value)


@accepting({"type": "string", "maxLength": 63, "pattern": f"^{DNS_SUBDOMAIN_PATTERN}$"})
def dns_subdomain(value: Any) -> str:
    """A Kubernetes object's name (a DNS subdomain) of at most 63 characters: a driver's, a scheduler's."""
    name = plain_text(value)
    if not is_dns_subdomain(name, most=63):
        raise ValueError("must be a lower-case DNS subdomain of at most 63 characters, e.g. npu.huawei.com")
    return name


def one_of(*choices: str) -> Check[str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return str(value)

    return Check(check, {"enum": list(choices)})


def optional(convert: Check[T]) -> Check[T | None]:
    """``convert``, or None (the setting's default: unset); the schema takes null too."""
    schema = dict(convert.schema)
    if "enum" in schema:
        schema["enum"] = [*schema["enum"], None]
    elif "type" in schema:
        kinds = schema["type"]
        schema["type"] = [*(kinds if isinstance(kinds, list) else [kinds]), "null"]
    else:
        schema = {"anyOf": [schema, {"type": "null"}]}
    return Check(lambda value: None if value is None else convert(value), schema)
