"""Log formatting and the metrics registry, in process."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from ascend_agent import __version__
from ascend_agent.observability import RepeatLimiter, configure_logging, log_fields
from tests.support.clock import ManualClock


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


def _suppressed(event: str) -> float:
    return REGISTRY.get_sample_value("ascend_agent_log_lines_suppressed_total", {"event": event}) or 0.0


def test_the_first_line_passes_then_one_per_interval_with_the_count() -> None:
    clock = ManualClock()
    limiter = RepeatLimiter("unit_interval", 10.0, clock=clock)
    assert limiter.admit("a") == 0
    assert [limiter.admit("a") for _ in range(1000)] == [None] * 1000
    assert limiter.admit("b") == 0, "keys are limited apart"
    clock.now += 9.999
    assert limiter.admit("a") is None
    clock.now += 0.001
    assert limiter.admit("a") == 1001
    assert limiter.admit("a") is None
    clock.now += 30
    assert limiter.admit("a") == 1
    assert limiter.admit("b") == 0
    assert _suppressed("unit_interval") == 1002


def test_log_writes_the_admitted_lines_only(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    limiter = RepeatLimiter("unit_log", 5.0, clock=clock)
    log = logging.getLogger("ascend_agent.test")
    with caplog.at_level(logging.WARNING):
        for _ in range(3000):
            limiter.log(
                log,
                logging.WARNING,
                ("huawei.com/Ascend910", "Ascend910-9"),
                "Allocate refused for %s: unknown device %s",
                "huawei.com/Ascend910",
                "Ascend910-9",
                extra=log_fields(resource="huawei.com/Ascend910"),
            )
        clock.now += 5
        limiter.log(
            log, logging.WARNING, ("huawei.com/Ascend910", "Ascend910-9"), "Allocate refused: %s", "x"
        )
    assert [r.getMessage() for r in caplog.records] == [
        "Allocate refused for huawei.com/Ascend910: unknown device Ascend910-9",
        "Allocate refused: x (2999 repeats suppressed)",
    ]
    assert caplog.records[0].resource == "huawei.com/Ascend910"  # type: ignore[attr-defined]
    assert caplog.records[1].suppressed == 2999  # type: ignore[attr-defined]
    assert _suppressed("unit_log") == 2999


def test_keys_are_bounded() -> None:
    clock = ManualClock()
    limiter = RepeatLimiter("unit_bounded", 10.0, clock=clock, max_keys=3)
    for key in range(3):
        assert limiter.admit(key) == 0
    clock.now += 10
    assert limiter.admit(3) == 0  # the three whose interval is over are forgotten
    assert [limiter.admit(key) for key in (4, 5)] == [0, 0]
    assert limiter.admit(6) == 0  # over the bound with none expired: the oldest (3) goes
    assert limiter.admit(3) == 0
    assert limiter.admit(6) is None


def test_build_info_names_the_version() -> None:
    assert REGISTRY.get_sample_value("ascend_agent_build_info", {"version": __version__}) == 1.0


def test_a_text_line_cannot_be_forged_by_a_value() -> None:
    """A model name with a newline wrote a second, forged log line; a NUL went to the log as it was."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging("info", "text")
    (handler,) = root.handlers
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    handler.setStream(stream)
    try:
        logging.getLogger("test").info("Model %s", "910\n2026-01-01T00:00:00.000Z ERROR forged\x00")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    (line,) = stream.getvalue().splitlines()
    assert line.endswith("Model 910\\n2026-01-01T00:00:00.000Z ERROR forged\\x00")
