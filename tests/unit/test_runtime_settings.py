"""server/runtime_settings.py: one trace/log settings object, handed to both frontends."""
from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from protocol.errors import InvalidArgument, Unsupported
from server.runtime_settings import TRACE_DEFAULTS, LogSettings, RuntimeSettings, TraceSettings


def test_trace_defaults_and_per_model_overrides() -> None:
    trace = TraceSettings()
    assert trace.current() == TRACE_DEFAULTS
    trace.update({"trace_rate": ["5"]}, model="m")
    assert trace.current("m")["trace_rate"] == ["5"] and trace.current()["trace_rate"] == ["1000"]
    trace.update({"trace_rate": None}, model="m")  # None clears the model's own value
    assert trace.current("m")["trace_rate"] == ["1000"]


@pytest.mark.parametrize("changes, error", [
    ({"nope": ["1"]}, InvalidArgument),
    ({"log_file": None}, InvalidArgument),  # an unknown key with an empty value (was KeyError)
    ({"trace_level": ["LOUD"]}, InvalidArgument),
    ({"trace_level": ["TIMESTAMPS"]}, Unsupported),
    ({"trace_rate": ["-1"]}, InvalidArgument),
    ({"trace_file": ["a", "b"]}, InvalidArgument),
])
def test_trace_refusals(changes: dict, error: type) -> None:
    trace = TraceSettings()
    with pytest.raises(error):
        trace.update(changes)
    assert trace.current() == TRACE_DEFAULTS  # nothing applied


def test_log_settings_apply_to_python_logging() -> None:
    root = logging.getLogger()
    level = root.level
    try:
        settings = LogSettings(verbose=0)
        settings.update({"log_info": False})
        assert root.level == logging.WARNING
        with pytest.raises(Unsupported):
            settings.update({"log_file": "/tmp/x"})
        with pytest.raises(InvalidArgument):
            settings.update({"log_verbose_level": True})
    finally:
        root.setLevel(level)


def test_one_object_per_process_is_shared_by_both_frontends() -> None:
    from server.grpc import InferenceServicer
    from server.http import HttpFrontend

    runtime = RuntimeSettings.create(log_verbose=2)
    assert runtime.log.values["log_verbose_level"] == 2
    from server.settings import ServerSettings

    core: Any = SimpleNamespace(settings=ServerSettings(http_max_input_size=10))
    servicer = InferenceServicer(core, runtime)
    http = HttpFrontend(core, runtime)
    assert servicer.trace is runtime.trace and servicer.logging is runtime.log
    assert http.runtime is runtime
