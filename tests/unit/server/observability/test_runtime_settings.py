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
        ({"trace_level": ["TIMESTAMPS"]}, InvalidArgument),  # no trace file to write to
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
    trace = TraceSettings({"trace_count": ["2"], "trace_file": ["/tmp/t.json"]})
    assert not trace.active
    trace.update({"trace_level": ["TIMESTAMPS"]}, model="m")
    assert trace.active
    assert trace.take_one("m") and trace.take_one("m") and not trace.take_one("m")
    assert trace.current()["trace_count"] == ["0"]
    trace.update({"trace_count": None})  # back to the --trace-config value
    assert trace.current()["trace_count"] == ["2"]
    trace.update({"trace_level": None}, model="m")
    assert not trace.active


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"trace_rate": ["abc"]}, "Unable to parse 'trace_rate', got: abc"),
        ({"trace_count": ["-5"]}, "Unable to parse 'trace_count'. Expecting value >= -1, got:-5"),
        ({"log_frequency": ["x1"]}, "Unable to parse 'log_frequency', got: x1"),
        (
            {"trace_rate": ["-1"]},
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: -1",
        ),
        (
            {"trace_count": ["99999999999"]},
            "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], "
            "got: 99999999999",
        ),
        ({"trace_count": ["1", "2"]}, "expect only 1 value for 'trace_count'"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
        (
            {"trace_level": ["TIMESTAMPS"], "trace_rate": ["5"]},
            "Attempting to set invalid trace setting :trace file name is not given",
        ),
    ],
)
def test_trace_refusals_in_tritons_words(changes: dict, message: str) -> None:
    trace = TraceSettings()
    with pytest.raises(InvalidArgument) as error:
        trace.update(changes)
    assert error.value.message == message
    assert trace.current() == TRACE_DEFAULTS  # the whole request refused, as Triton refuses it


def test_tracing_on_needs_a_nonzero_rate_and_a_file_for_every_scope_it_reaches() -> None:
    trace = TraceSettings({"trace_file": ["/tmp/t.json"]})
    trace.update({"trace_rate": ["0"]})  # allowed while tracing is off (Triton's rule)
    with pytest.raises(InvalidArgument, match="sample rate must be non-zero"):
        trace.update({"trace_level": ["TIMESTAMPS"]}, model="m")
    trace.update({"trace_rate": ["2"], "trace_level": ["TIMESTAMPS"]}, model="m")
    with pytest.raises(InvalidArgument, match="sample rate must be non-zero"):
        trace.update({"trace_rate": ["0"]}, model="m")
    assert trace.current("m")["trace_rate"] == ["2"] and trace.current()["trace_rate"] == ["0"]
    otel = TraceSettings({"trace_mode": ["opentelemetry"]})
    otel.update({"trace_level": ["TIMESTAMPS"]})  # no file needed: spans go to the collector
    assert otel.active
