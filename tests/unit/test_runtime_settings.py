"""server/observability/runtime_settings.py: trace and log settings, checked whole and applied
to logging."""

from __future__ import annotations

import logging

import pytest

from protocol.errors import InvalidArgument, Unsupported
from server.observability.runtime_settings import TRACE_DEFAULTS, LogSettings, TraceSettings


def test_trace_defaults_and_per_model_overrides() -> None:
    trace = TraceSettings()
    assert trace.current() == TRACE_DEFAULTS
    trace.update({"trace_rate": ["5"]}, model="m")
    assert trace.current("m")["trace_rate"] == ["5"] and trace.current()["trace_rate"] == ["1000"]
    trace.update({"trace_rate": None}, model="m")  # None clears the model's own value
    assert trace.current("m")["trace_rate"] == ["1000"]


@pytest.mark.parametrize(
    "changes, error",
    [
        ({"nope": ["1"]}, InvalidArgument),
        ({"log_file": None}, InvalidArgument),  # an unknown key with an empty value (was KeyError)
        ({"trace_level": ["LOUD"]}, InvalidArgument),
        ({"trace_file": ["/tmp/x"]}, Unsupported),
        ({"trace_level": ["TIMESTAMPS"], "trace_file": ["/tmp/x"]}, Unsupported),  # all or nothing
        ({"trace_rate": ["-1"]}, InvalidArgument),
        ({"trace_count": ["1", "2"]}, InvalidArgument),
        ({"trace_rate": ["0"]}, InvalidArgument),
    ],
)
def test_trace_refusals(changes: dict, error: type) -> None:
    trace = TraceSettings()
    with pytest.raises(error):
        trace.update(changes)
    assert trace.current() == TRACE_DEFAULTS  # nothing applied


def test_log_switches_filter_each_level_and_log_file_is_refused_whole() -> None:
    root = logging.getLogger()
    level = root.level
    handler = logging.Handler()
    records: list[logging.LogRecord] = []
    handler.emit = records.append  # type: ignore[method-assign]
    root.addHandler(handler)
    try:
        settings = LogSettings(verbose=0)
        settings.update({"log_warning": False})
        log = logging.getLogger("probe")
        log.error("e")
        log.warning("w")
        log.info("i")
        assert [r.getMessage() for r in records] == ["e", "i"]
        with pytest.raises(Unsupported, match="log file location can not be updated"):
            settings.update({"log_info": False, "log_file": ""})
        assert settings.values["log_info"] is True  # nothing in that request applied
    finally:
        settings.update({"log_warning": True})
        root.removeHandler(handler)
        root.setLevel(level)


def test_trace_count_is_spent_and_active_follows_the_levels() -> None:
    trace = TraceSettings({"trace_count": ["2"]})
    assert not trace.active
    trace.update({"trace_level": ["TIMESTAMPS"]}, model="m")
    assert trace.active
    assert trace.take_one("m") and trace.take_one("m") and not trace.take_one("m")
    assert trace.current()["trace_count"] == ["0"]
    trace.update({"trace_count": None})  # back to the --trace-config value
    assert trace.current()["trace_count"] == ["2"]
    trace.update({"trace_level": None}, model="m")
    assert not trace.active
