"""Huawei's fault table: which class each fault code is in (``faultCode.json``) and when a code's class is
raised for happening often or lasting long (``faultCustomization.json``: ``FaultFrequency``,
``FaultDuration``). Huawei's files ship in the package (``ascend_agent/health/faultdata``); the ConfigMap
``kube-system/mindx-dl-fault-config`` may replace either with its key of the same name. Pure parsing, no I/O
beyond the package's own files::

    table = FaultTable.builtin()
    table.class_of(0x8C03A000)          # FaultClass.RESTART_NPU; None for a code in no class
    table = table.replaced(fault_code=text)     # FaultConfigError: one line naming the key, when bad

Codes are hex as ``npu-smi info -t health`` prints them (``8C03A000``; 9 digits for some network codes) and
are compared as numbers, as Huawei does: ``020001002`` and ``20001002`` are one code.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from ascend_agent.echo import cut
from ascend_agent.faultclass import FaultClass

FAULT_CODE_KEY = "faultCode.json"
CUSTOMIZATION_KEY = "faultCustomization.json"
# Keys of mindx-dl-fault-config the agent does not use but Huawei's plugin reads: accepted, ignored.
IGNORED_KEYS = frozenset({"SwitchFaultCode.json", "PollInterval"})

# faultCode.json's keys, each a list of codes of one class. The *Network* lists are Huawei's network codes.
CLASS_KEYS: Mapping[str, FaultClass] = {
    "NotHandleFaultCodes": FaultClass.NOT_HANDLE,
    "NotHandleFaultNetworkCodes": FaultClass.NOT_HANDLE,
    "SubHealthFaultCodes": FaultClass.SUB_HEALTH,
    "SubHealthFaultNetworkCodes": FaultClass.SUB_HEALTH,
    "RestartRequestCodes": FaultClass.RESTART_REQUEST,
    "RestartBusinessCodes": FaultClass.RESTART_BUSINESS,
    "FreeRestartNPUCodes": FaultClass.FREE_RESTART_NPU,
    "RestartNPUCodes": FaultClass.RESTART_NPU,
    "PreSeparateNPUCodes": FaultClass.PRE_SEPARATE_NPU,
    "PreSeparateNPUNetworkCodes": FaultClass.PRE_SEPARATE_NPU,
    "SeparateNPUCodes": FaultClass.SEPARATE_NPU,
    "SeparateNPUNetworkCodes": FaultClass.SEPARATE_NPU,
}
# Huawei's handling above SeparateNPU: the chip is separated until an admin frees it. Here: SeparateNPU.
MANUALLY_SEPARATE = "ManuallySeparateNPU"
# Huawei's ranges (seconds, times); ReleaseTimeWindow absent means never released.
_RANGES = {
    "TimeWindow": (60, 864000),
    "Times": (1, 100),
    "ReleaseTimeWindow": (60, 2**32),
    "FaultTimeout": (0, 600),
    "RecoverTimeout": (0, 86400),
}
_CUSTOMIZATION_KEYS = frozenset({"GraceTolerance", "FaultFrequency", "FaultDuration"})
_FREQUENCY_KEYS = frozenset({"EventId", "TimeWindow", "Times", "FaultHandling", "ReleaseTimeWindow"})
_DURATION_KEYS = frozenset({"EventId", "FaultTimeout", "RecoverTimeout", "FaultHandling"})
_HEX = re.compile(r"(?:0[xX])?[0-9A-Fa-f]{1,16}")


class FaultConfigError(ValueError):
    """A fault-config file that cannot be used; the message is one line naming the key."""


def parse_code(text: str) -> int:
    """A fault code as a number: hex, ``0x`` optional. ``ValueError`` for anything else.

    >>> hex(parse_code("8C03A000")), parse_code("020001002") == parse_code("20001002")
    ('0x8c03a000', True)
    """
    if not isinstance(text, str) or not _HEX.fullmatch(text.strip()):
        shown = repr(cut(text)) if isinstance(text, str) else cut(repr(text))
        raise ValueError(f"{shown} is not a hex fault code")
    return int(text.strip(), 16)


def code_text(code: int) -> str:
    """A code as npu-smi prints it: uppercase hex, at least 8 digits.

    >>> code_text(0x8C03A000), code_text(0x110001024)
    ('8C03A000', '110001024')
    """
    return f"{code:08X}"


@dataclass(frozen=True, slots=True)
class FrequencyRule:
    """``FaultFrequency``: ``times`` occurrences within ``window`` seconds raise the chip to ``handling``;
    it comes down ``release`` seconds after the code went, while it happens less often (None: never)."""

    window: float
    times: int
    handling: FaultClass
    release: float | None


@dataclass(frozen=True, slots=True)
class DurationRule:
    """``FaultDuration``: a code present over ``timeout`` seconds raises the chip to ``handling`` until it
    has been gone for ``recover`` seconds."""

    timeout: float
    recover: float
    handling: FaultClass


@dataclass(frozen=True, slots=True)
class FaultTable:
    """Code -> class, and the escalation rules by code; ``source`` says where it came from, for logs."""

    classes: Mapping[int, FaultClass]
    frequency: Mapping[int, FrequencyRule] = field(default_factory=dict)
    duration: Mapping[int, DurationRule] = field(default_factory=dict)
    source: str = "built in"

    def class_of(self, code: int) -> FaultClass | None:
        """The code's class; None for a code the table does not name."""
        return self.classes.get(code)

    @classmethod
    @functools.cache
    def builtin(cls) -> FaultTable:
        """Huawei's shipped ``faultCode.json`` and ``faultCustomization.json`` (read once)."""
        folder = resources.files("ascend_agent.health") / "faultdata"
        classes = parse_fault_code((folder / FAULT_CODE_KEY).read_text(), FAULT_CODE_KEY)
        frequency, duration = parse_customization((folder / CUSTOMIZATION_KEY).read_text(), CUSTOMIZATION_KEY)
        return cls(classes, frequency, duration)

    def replaced(
        self, fault_code: str | None = None, customization: str | None = None, source: str = ""
    ) -> FaultTable:
        """This table with the files given replaced whole (as Huawei's plugin takes them); raises
        :class:`FaultConfigError` when one cannot be used."""
        table = self
        if fault_code is not None:
            table = replace(table, classes=parse_fault_code(fault_code, FAULT_CODE_KEY))
        if customization is not None:
            frequency, duration = parse_customization(customization, CUSTOMIZATION_KEY)
            table = replace(table, frequency=frequency, duration=duration)
        return replace(table, source=source or table.source)


def _document(text: str, where: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise FaultConfigError(f"{where}: not JSON ({cut(str(exc))})") from None
    except RecursionError:
        raise FaultConfigError(
            f"{where}: its arrays or objects nest too deep to read (Huawei's file nests three levels)"
        ) from None
    if not isinstance(document, dict):
        raise FaultConfigError(f"{where}: must be a JSON object")
    return document


def _unknown(document: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    unknown = sorted(set(document) - set(known))
    if unknown:
        raise FaultConfigError(
            f"{where}: unknown key {cut(unknown[0])!r}; the keys are {', '.join(sorted(known))}"
        )


def _codes(value: Any, where: str) -> list[int]:
    if not isinstance(value, list):
        raise FaultConfigError(f"{where}: must be a list of hex codes")
    try:
        return [parse_code(item) for item in value]
    except ValueError as exc:
        raise FaultConfigError(f"{where}: {exc}") from None


def parse_fault_code(text: str, where: str = FAULT_CODE_KEY) -> dict[int, FaultClass]:
    """``faultCode.json``: code -> class; a code in two classes takes the more severe.

    >>> classes = parse_fault_code('{"NotHandleFaultCodes": ["8C03A000"], "RestartNPUCodes": ["8c03a000"]}')
    >>> classes[0x8C03A000]
    <FaultClass.RESTART_NPU: 5>
    """
    document = _document(text, where)
    _unknown(document, CLASS_KEYS, where)
    classes: dict[int, FaultClass] = {}
    for key, fault_class in CLASS_KEYS.items():
        for code in _codes(document.get(key, []), f"{where}: {key}"):
            classes[code] = max(fault_class, classes.get(code, fault_class))
    return classes


def _handling(value: Any, where: str, manual: bool) -> FaultClass:
    if manual and value == MANUALLY_SEPARATE:
        return FaultClass.SEPARATE_NPU
    try:
        return FaultClass.from_huawei(cut(value if isinstance(value, str) else repr(value)))
    except ValueError as exc:
        raise FaultConfigError(f"{where}: FaultHandling {exc}") from None


def _number(entry: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = entry.get(key, default)
    low, high = _RANGES[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise FaultConfigError(
            f"{where}: {key} must be a number from {low} to {high}, not {cut(repr(value))}"
        )
    return float(value)


def _entries(document: Mapping[str, Any], key: str, where: str) -> list[tuple[str, dict[str, Any]]]:
    value = document.get(key, [])
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise FaultConfigError(f"{where}: {key} must be a list of objects")
    return [(f"{where}: {key}[{index}]", entry) for index, entry in enumerate(value)]


def parse_customization(
    text: str, where: str = CUSTOMIZATION_KEY
) -> tuple[dict[int, FrequencyRule], dict[int, DurationRule]]:
    """``faultCustomization.json``: the ``FaultFrequency`` and ``FaultDuration`` rules by code (the first
    entry naming a code wins, as in Huawei's plugin). ``GraceTolerance`` is accepted and not used here."""
    document = _document(text, where)
    _unknown(document, _CUSTOMIZATION_KEYS, where)
    frequency: dict[int, FrequencyRule] = {}
    for place, entry in _entries(document, "FaultFrequency", where):
        _unknown(entry, _FREQUENCY_KEYS, place)
        handling = _handling(entry.get("FaultHandling"), place, manual=True)
        release = _number(entry, "ReleaseTimeWindow", place) if "ReleaseTimeWindow" in entry else None
        if release is None and entry.get("FaultHandling") != MANUALLY_SEPARATE:
            raise FaultConfigError(
                f"{place}: ReleaseTimeWindow is required unless FaultHandling is {MANUALLY_SEPARATE}"
            )
        rule = FrequencyRule(
            _number(entry, "TimeWindow", place), int(_number(entry, "Times", place)), handling, release
        )
        for code in _codes(entry.get("EventId"), f"{place}: EventId"):
            frequency.setdefault(code, rule)
    duration: dict[int, DurationRule] = {}
    for place, entry in _entries(document, "FaultDuration", where):
        _unknown(entry, _DURATION_KEYS, place)
        handling = _handling(entry.get("FaultHandling"), place, manual=False)
        rule_d = DurationRule(
            _number(entry, "FaultTimeout", place, 0), _number(entry, "RecoverTimeout", place, 0), handling
        )
        for code in _codes(entry.get("EventId"), f"{place}: EventId"):
            duration.setdefault(code, rule_d)
    return frequency, duration
