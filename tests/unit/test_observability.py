"""Log formatting and the metrics registry, in process."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ascend_agent.observability import configure_logging, log_fields


@pytest.fixture
def json_logs() -> Iterator[Callable[[], list[dict[str, object]]]]:
    """Logging configured as ``--log-format json``, its stream kept; a function returning the entries."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging("info", "json")
    (handler,) = root.handlers
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    handler.setStream(stream)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.handlers[:] = handlers
    root.setLevel(level)


def test_fields_travel_beside_the_message(json_logs: Callable[[], list[dict[str, object]]]) -> None:
    log = logging.getLogger("ascend_agent.test")
    log.warning(
        "Allocate refused for %s: %s",
        "huawei.com/Ascend910",
        "Ascend910-3 is Unhealthy",
        extra=log_fields(
            resource="huawei.com/Ascend910",
            devices=("Ascend910-3",),
            ids={7, 3},
            path=Path("/dev/davinci3"),
            reason="Ascend910-3 is Unhealthy",
            device=None,
        ),
    )
    (entry,) = json_logs()
    assert entry["msg"] == "Allocate refused for huawei.com/Ascend910: Ascend910-3 is Unhealthy"
    assert entry["level"] == "warning"
    assert entry["logger"] == "ascend_agent.test"
    assert entry["resource"] == "huawei.com/Ascend910"
    assert entry["devices"] == ["Ascend910-3"]
    assert entry["ids"] == [3, 7]
    assert entry["path"] == "/dev/davinci3"
    assert entry["reason"] == "Ascend910-3 is Unhealthy"
    assert "device" not in entry


def test_an_exception_is_one_field(json_logs: Callable[[], list[dict[str, object]]]) -> None:
    try:
        raise OSError(24, "Too many open files")
    except OSError:
        logging.getLogger("ascend_agent.test").exception("health query failed")
    (entry,) = json_logs()
    assert entry["error"] == "OSError: [Errno 24] Too many open files"


@pytest.mark.parametrize("name", ["msg", "args", "name", "message", "levelname"])
def test_names_the_record_uses_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        log_fields(**{name: "x"})
