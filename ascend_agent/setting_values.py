"""The checks of one setting's value, from the config file, the environment or a flag, each a function that
returns the typed value or raises ``ValueError`` in words (``config`` names the key, variable or flag)::

    positive_int(3), seconds(1.0)(5), one_of("text", "json")("json"), optional(file_path)(None)
    plain_text(7)      # ValueError: must be a string
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ascend_agent.kube_names import is_dns_subdomain
from ascend_agent.model import CHIP_NAMES, UnknownModelError, chip_name


def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("must be a whole number of at least 1")
    return value


def positive_float(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError("must be a finite number above 0")
    return float(value)


def seconds(minimum: float) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < minimum
        ):
            raise ValueError(f"must be a finite number of seconds, at least {minimum:g}")
        return float(value)

    return check


def non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("must be a whole number of at least 0 (0: off)")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


# List settings hold a handful of entries (driver paths, Health values); a long one is a mistake or worse.
MAX_LIST_ITEMS = 64
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


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


def file_path(value: Any) -> Path:
    return Path(plain_text(str(value) if isinstance(value, Path) else value))


def text_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError("must be a list of strings")
    if len(value) > MAX_LIST_ITEMS:
        raise ValueError(f"has {len(value)} entries; at most {MAX_LIST_ITEMS} are accepted")
    return tuple(plain_text(item) for item in value)


def dns_subdomain(value: str) -> str:
    if not is_dns_subdomain(value, most=63):
        raise ValueError("must be a lower-case DNS subdomain of at most 63 characters, e.g. npu.huawei.com")
    return value


def one_of(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return str(value)

    return check


def optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else convert(value)
