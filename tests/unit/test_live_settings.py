"""What a config reload applies live, and the one line for each change that waits for a start."""

from __future__ import annotations

import logging

import pytest

from ascend_agent.config import Settings
from ascend_agent.live_settings import SettingsChange
from ascend_agent.vnpu_layout import parse_layout


def _warnings(caplog: pytest.LogCaptureFixture, running: Settings, loaded: Settings) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ascend_agent.live_settings"):
        SettingsChange(running, loaded).warn()
    return [record.getMessage() for record in caplog.records]


def test_a_change_of_the_dynamic_chips_says_whether_this_reload_starts_a_backend(
    caplog: pytest.LogCaptureFixture,
) -> None:
    static = Settings(vnpu=parse_layout({"0": ["vir02"]}))
    dynamic = Settings(vnpu=parse_layout({"dynamic": True}))
    assert SettingsChange(static, dynamic).new_backend is False
    assert _warnings(caplog, static, dynamic) == [
        "vnpu: which chips are dynamic changes when a backend starts: at the next start, or now where this "
        "reload starts one (it does not)"
    ]
    with_new_backend = Settings(vnpu=dynamic.vnpu, npu_smi_timeout=static.npu_smi_timeout + 1)
    assert SettingsChange(static, with_new_backend).new_backend is True
    assert _warnings(caplog, static, with_new_backend)[0].endswith("(it does)")
    assert _warnings(caplog, static, Settings(vnpu=parse_layout({"0": ["vir04"]}))) == []


def test_hot_reset_turned_on_by_a_reload_says_when_reset_info_is_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _warnings(caplog, Settings(), Settings(hot_reset="idle")) == [
        "hotReset turned on: the node annotation ResetInfo is written from the next start"
    ]
    assert _warnings(caplog, Settings(hot_reset="idle"), Settings(hot_reset="dry-run")) == []
