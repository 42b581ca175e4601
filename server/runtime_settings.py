"""Trace and log settings: what clients may read and change while the server runs.

Why a module of its own: both frontends serve these settings (gRPC's TraceSetting/LogSettings
today, HTTP's /v2/trace/setting and /v2/logging later), so the state lives in one object built
once in server/app.py and handed to each frontend: a change made over one protocol reads back
over the other.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional

from protocol.errors import InvalidArgument, Unsupported

TRACE_LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
TRACE_DEFAULTS: dict[str, list[str]] = {
    "trace_level": ["OFF"], "trace_rate": ["1000"], "trace_count": ["-1"],
    "log_frequency": ["0"], "trace_file": [""], "trace_mode": ["triton"],
}


class TraceSettings:
    """Triton's trace settings, global and per model. Tracing itself is not implemented, so a
    level other than OFF is refused rather than silently accepted."""

    def __init__(self) -> None:
        self.global_settings = {k: list(v) for k, v in TRACE_DEFAULTS.items()}
        self.models: dict[str, dict[str, list[str]]] = {}

    def current(self, model: str = "") -> dict[str, list[str]]:
        return {**self.global_settings, **self.models.get(model, {})} if model else \
            dict(self.global_settings)

    def update(self, changes: dict[str, Optional[list[str]]], model: str = "") -> None:
        for key, values in changes.items():
            if key not in TRACE_DEFAULTS:  # also when its value is empty (a reset)
                raise InvalidArgument(f"unknown trace setting '{key}'")
            if values is not None:
                _check_trace_value(key, values)
        target = self.models.setdefault(model, {}) if model else self.global_settings
        for key, values in changes.items():
            if values is not None:
                target[key] = values
            elif model:
                target.pop(key, None)
            else:
                target[key] = list(TRACE_DEFAULTS[key])


def _check_trace_value(key: str, values: list[str]) -> None:
    if key not in TRACE_DEFAULTS:
        raise InvalidArgument(f"unknown trace setting '{key}'")
    if key == "trace_level":
        unknown = [v for v in values if v not in TRACE_LEVELS]
        if unknown:
            raise InvalidArgument(f"invalid trace_level {unknown}: expected {list(TRACE_LEVELS)}")
        if any(v != "OFF" for v in values):
            raise Unsupported("tracing is not supported by this server; trace_level can only "
                              "be OFF")
        return
    if len(values) != 1:
        raise InvalidArgument(f"trace setting '{key}' takes exactly one value")
    if key in ("trace_rate", "trace_count", "log_frequency"):
        text = values[0]
        if not text.lstrip("-").isdigit() or int(text) < (-1 if key == "trace_count" else 0):
            raise InvalidArgument(f"invalid value '{text}' for trace setting '{key}'")


class LogSettings:
    """Triton's log settings; changes apply to this process's Python logging."""

    FORMATS = ("default", "ISO8601")

    def __init__(self, verbose: int) -> None:
        self.values: dict[str, Any] = {
            "log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": verbose, "log_format": "default",
        }

    def update(self, changes: dict[str, Any]) -> None:
        for key, value in changes.items():
            self._check(key, value)
        self.values.update(changes)
        logging.getLogger().setLevel(self._level())

    def _check(self, key: str, value: Any) -> None:
        if key not in self.values:
            raise InvalidArgument(f"unknown log setting '{key}'")
        if key == "log_file":
            if value != self.values["log_file"]:
                raise Unsupported("log file location can not be updated through network "
                                  "protocol")
        elif key == "log_verbose_level":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument("log_verbose_level must be a non-negative integer")
        elif key == "log_format":
            if value not in self.FORMATS:
                raise InvalidArgument(f"invalid log_format '{value}': expected one of "
                                      f"{list(self.FORMATS)}")
        elif not isinstance(value, bool):
            raise InvalidArgument(f"log setting '{key}' must be a boolean")

    def _level(self) -> int:
        v = self.values
        if v["log_verbose_level"] > 0:
            return logging.DEBUG
        if v["log_info"]:
            return logging.INFO
        if v["log_warning"]:
            return logging.WARNING
        return logging.ERROR if v["log_error"] else logging.CRITICAL


@dataclass(frozen=True)
class RuntimeSettings:
    """The process's one trace and one log settings object, handed to every frontend."""

    trace: TraceSettings
    log: LogSettings

    @classmethod
    def create(cls, log_verbose: int) -> RuntimeSettings:
        """Defaults, with the log verbosity the server was started with (--log-verbose)."""
        return cls(TraceSettings(), LogSettings(log_verbose))
