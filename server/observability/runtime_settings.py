"""Trace and log settings: what clients may read and change while the server runs.

Why a module of its own: both frontends serve these settings (gRPC's TraceSetting/LogSettings,
HTTP's /v2/trace/setting and /v2/logging), so the state lives in one object the core owns
(server/core/inference_core.py; frontend processes ask it through
server/multiprocess/remote_core.py): a change made over one protocol, on any connection, reads back
over the other.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from protocol.errors import InvalidArgument, Unsupported
from protocol.text import shown
from protocol.values import TRACE_NUMBER_LOW, check_trace_number

TRACE_LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
TRACE_DEFAULTS: dict[str, list[str]] = {
    "trace_level": ["OFF"],
    "trace_rate": ["1000"],
    "trace_count": ["-1"],
    "log_frequency": ["0"],
    "trace_file": [""],
    "trace_mode": ["triton"],
}


class TraceSettings:
    """Triton's trace settings, global and per model (a model's own values override the global
    ones; null clears them), starting from --trace-config. `active` says whether any level is
    on anywhere: while it is false, a request pays one attribute read for tracing."""

    def __init__(self, initial: dict[str, list[str]] | None = None) -> None:
        self.defaults = {k: list(v) for k, v in {**TRACE_DEFAULTS, **(initial or {})}.items()}
        self.global_settings = {k: list(v) for k, v in self.defaults.items()}
        self.models: dict[str, dict[str, list[str]]] = {}
        self.active = self._any_on()
        self.version = 0  # bumped by every update: readers may cache what they derived

    def current(self, model: str = "") -> dict[str, list[str]]:
        return (
            {**self.global_settings, **self.models.get(model, {})}
            if model
            else dict(self.global_settings)
        )

    def update(self, changes: dict[str, list[str] | None], model: str = "") -> None:
        """All or nothing: every change is checked, and so is every setting it would leave
        tracing on with, before any applies (Triton refuses such a request whole too)."""
        for key, values in changes.items():
            if key not in TRACE_DEFAULTS:  # also when its value is empty (a reset)
                raise InvalidArgument(f"unknown trace setting '{shown(key)}'")
            if key == "trace_file":  # a network client must not choose where the server writes
                raise Unsupported("trace file location can not be updated through network protocol")
            if (
                key == "trace_mode"
                and values is not None
                and values != self.global_settings["trace_mode"]
            ):
                raise Unsupported("trace mode can not be updated through network protocol")
            if values is not None:
                _check_trace_value(key, values)
        global_settings = {k: list(v) for k, v in self.global_settings.items()}
        models = {name: {k: list(v) for k, v in own.items()} for name, own in self.models.items()}
        target = models.setdefault(model, {}) if model else global_settings
        for key, values in changes.items():
            if values is not None:
                target[key] = list(values)
            elif model:
                target.pop(key, None)
            else:
                target[key] = list(self.defaults[key])
        # The scope changed, and with a global change every model that falls back on it.
        for name in [model] if model else ["", *models]:
            _check_tracing_on({**global_settings, **models.get(name, {})})
        self.global_settings, self.models = global_settings, models
        self.active = self._any_on()
        self.version += 1

    def take_one(self, model: str) -> bool:
        """Spend one trace of the trace_count that applies to `model` (-1: no limit); False
        when none is left."""
        own = self.models.get(model, {})
        target = own if "trace_count" in own else self.global_settings
        count = int(target["trace_count"][0])
        if count == 0:
            return False
        if count > 0:
            target["trace_count"] = [str(count - 1)]
        return True

    def _any_on(self) -> bool:
        return any(
            level != "OFF"
            for settings in (self.global_settings, *self.models.values())
            for level in settings.get("trace_level", ())
        )


def _check_trace_value(key: str, values: list[str]) -> None:
    """One setting's values, refused in Triton's words (the frontends check first, each in its
    protocol's wording: protocol/values.py)."""
    if key == "trace_level":
        unknown = [v for v in values if v not in TRACE_LEVELS]
        if unknown:
            raise InvalidArgument(f"invalid trace_level {unknown}: expected {list(TRACE_LEVELS)}")
        if "OFF" in values and len(values) > 1:
            raise InvalidArgument("Expect only one trace level 'OFF' is specified")
        return
    if len(values) != 1:
        raise InvalidArgument(f"expect only 1 value for '{shown(key)}'")
    if key in TRACE_NUMBER_LOW:
        check_trace_number(key, values[0])


def _check_tracing_on(settings: dict[str, list[str]]) -> None:
    """Triton's rule: the only invalid setting allowed is one that turns tracing off."""
    if all(level == "OFF" for level in settings.get("trace_level", ["OFF"])):
        return
    reason = ""
    if int(settings["trace_rate"][0]) == 0:
        reason = "sample rate must be non-zero"
    elif settings["trace_mode"] == ["triton"] and not settings["trace_file"][0]:
        reason = "trace file name is not given"
    if reason:
        raise InvalidArgument(f"Attempting to set invalid trace setting :{reason}")


class LogSettings:
    """Triton's log settings; a change applies to this process's Python logging at once."""

    FORMATS = ("default", "ISO8601")

    def __init__(self, verbose: int) -> None:
        self.values: dict[str, Any] = {
            "log_file": "",
            "log_info": True,
            "log_warning": True,
            "log_error": True,
            "log_verbose_level": verbose,
            "log_format": "default",
        }

    def update(self, changes: dict[str, Any]) -> None:
        """All or nothing: every change is checked before any applies."""
        for key, value in changes.items():
            self._check(key, value)
        self.values.update(changes)
        apply_log_settings(self.values)

    def _check(self, key: str, value: Any) -> None:
        if key == "log_file":  # a network client must not choose where the server writes
            raise Unsupported("log file location can not be updated through network protocol")
        if key not in self.values:
            raise InvalidArgument(f"unknown log setting '{shown(key)}'")
        if key == "log_verbose_level":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument("log_verbose_level must be a non-negative integer")
        elif key == "log_format":
            if value not in self.FORMATS:
                raise InvalidArgument(
                    f"invalid log_format '{value}': expected one of {list(self.FORMATS)}"
                )
        elif not isinstance(value, bool):
            raise InvalidArgument(f"log setting '{shown(key)}' must be a boolean")


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # as server/cli.py sets it
ISO8601_DATE = "%Y-%m-%dT%H:%M:%SZ"  # log_format ISO8601: UTC timestamps


class _LevelSwitches(logging.Filter):
    """Triton's independent switches: info, warning and error records each on or off, debug
    records only with a verbose level."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, Any] = {
            "log_info": True,
            "log_warning": True,
            "log_error": True,
            "log_verbose_level": 0,
        }

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return bool(self.values["log_error"])
        if level >= logging.WARNING:
            return bool(self.values["log_warning"])
        if level >= logging.INFO:
            return bool(self.values["log_info"])
        return self.values["log_verbose_level"] > 0


_SWITCHES = _LevelSwitches()


def apply_log_settings(values: dict[str, Any]) -> None:
    """Make this process's root logger follow `values` (a LogSettings' values)."""
    _SWITCHES.values = {k: values[k] for k in _SWITCHES.values}
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if values["log_verbose_level"] > 0 else logging.INFO)
    if values["log_format"] == "ISO8601":
        formatter = logging.Formatter(LOG_FORMAT, ISO8601_DATE)
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter(LOG_FORMAT)
    for handler in root.handlers:
        if _SWITCHES not in handler.filters:
            handler.addFilter(_SWITCHES)
        handler.setFormatter(formatter)


@dataclass(frozen=True)
class RuntimeSettings:
    """The process's one trace and one log settings object, handed to every frontend."""

    trace: TraceSettings
    log: LogSettings

    @classmethod
    def create(cls, log_verbose: int, trace: dict[str, list[str]] | None = None) -> RuntimeSettings:
        """Defaults, with the log verbosity the server was started with (--log-verbose) and
        the trace settings of --trace-config."""
        return cls(TraceSettings(trace), LogSettings(log_verbose))
