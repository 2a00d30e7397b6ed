"""The config file's JSON Schema (``config.file_schema``), which the Helm chart's values.schema.json carries
under ``config``: every setting and no other key, and never a refusal of a value the agent takes."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_agent.config import _CONVERTERS, Settings, camel_case, file_schema
from tests.support import ROOT

SCHEMA = file_schema()
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)
KEYS = sorted(SCHEMA["properties"])


def _as_helm_sees(value: Any) -> Any:
    """A value as Helm hands it to the schema: JSON, so every mapping key is a string."""
    return json.loads(json.dumps(value))


def _refusals(document: dict[str, Any]) -> list[str]:
    return [error.message for error in VALIDATOR.iter_errors(_as_helm_sees(document))]


def test_every_setting_and_nothing_else() -> None:
    assert set(KEYS) == {camel_case(field.name) for field in fields(Settings)}
    assert SCHEMA["additionalProperties"] is False
    jsonschema.Draft7Validator.check_schema(SCHEMA)


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ({"hotRest": "idle"}, "'hotRest' was unexpected"),
        ({"hotReset": "on"}, "'on' is not one of ['off', 'idle', 'dry-run']"),
        ({"fakeChips": "8"}, "'8' is not of type 'integer'"),
        ({"fakeChips": 0}, "0 is less than the minimum of 1"),
        ({"healthInterval": 0.5}, "0.5 is less than the minimum of 1.0"),
        ({"networkHealth": "yes"}, "'yes' is not of type 'boolean'"),
        ({"driverMounts": "/usr/local/dcmi"}, "is not of type 'array'"),
        ({"faultPolicy": {"80E3A203": "fine"}}, "'fine' is not one of ['healthy', 'unhealthy']"),
        ({"faultPolicy": {"XYZ": "healthy"}}, "'XYZ' does not match"),
        ({"draFaultTaints": {"Broken": "NoExecute"}}, "'Broken' is not one of"),
        ({"draDriverName": "NPU.huawei.com"}, "does not match"),
        ({"vnpu": {"3": "vir02"}}, "'vir02' is not of type 'array', 'object', 'boolean'"),
        ({"vnpu": {"3": {"dynamc": True}}}, "'dynamc' was unexpected"),
        ({"model": "910b4"}, "'910b4' is not one of"),
        ({"model": 9100}, "9100 is not one of"),
    ],
)
def test_typos_and_wrong_types_are_refused(document: dict[str, Any], says: str) -> None:
    refusals = _refusals(document)
    assert any(says in refusal for refusal in refusals), refusals


def test_the_defaults_and_the_example_file_are_accepted() -> None:
    defaults = {camel_case(field.name): getattr(Settings(), field.name) for field in fields(Settings)}
    plain = {key: str(value) if hasattr(value, "as_posix") else value for key, value in defaults.items()}
    plain = {key: list(value) if isinstance(value, tuple) else value for key, value in plain.items()}
    plain["faultPolicy"], plain["draFaultTaints"] = {}, {}
    assert _refusals(plain) == []
    example = yaml.safe_load((ROOT / "examples" / "config.yaml").read_text(encoding="utf-8"))
    assert _refusals(example) == []


# Values of the kinds YAML gives, with words the settings take, so that the checks accept some of them.
_WORDS = st.sampled_from(
    sorted(
        {choice for key in KEYS for choice in SCHEMA["properties"][key].get("enum", []) if choice}
        | {"vir02", "vir04_3c", "310P3", "910B4", "310", "OK", "/x", "npu.huawei.com", "80E3A203", "8C"}
        | {"SeparateNPU", "NoExecute", "dynamic", "0", "3", "0:vir02", "127.0.0.1:9410", ""},
        key=str,
    )
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 100_000)
    | st.floats(-10, 1e6, allow_nan=False)
    | st.text(max_size=6)
    | _WORDS
)
_VALUES = (
    _SCALARS
    | st.lists(_WORDS, max_size=3)
    | st.recursive(
        _SCALARS,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(_WORDS | st.integers(0, 9) | st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=8,
    )
)
_NAMES = {camel_case(field.name): field.name for field in fields(Settings)}


@pytest.mark.parametrize("key", KEYS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_the_schema_takes_every_value_the_agent_takes(key: str, data: st.DataObject) -> None:
    """The chart must never refuse a config file the agent loads: what a setting's check accepts, the schema
    accepts (a superset; the agent still refuses what the schema cannot say, such as a vNPU layout that its
    chips' templates cannot hold)."""
    choices = [choice for choice in SCHEMA["properties"][key].get("enum", []) if choice is not None]
    value = data.draw(st.sampled_from(choices) | _VALUES if choices else _VALUES)
    try:
        _CONVERTERS[_NAMES[key]](value)
    except ValueError:
        return
    assert _refusals({key: value}) == [], (key, value)
