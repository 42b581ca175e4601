"""The parts of pb_utils that reach the server: response senders, cancellation and custom
metrics. triton_python_backend_utils re-exports them under Triton's names.

The worker installs its WorkerBridge here at start (`install`); outside a worker (a model's
own unit tests) there is none, and using these raises TritonModelException.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Sequence
from typing import Any

_bridge: Any = None


class TritonModelException(Exception):
    """Raised by pb_utils when a model uses it wrongly; also raisable by models."""


def install(bridge: Any) -> None:
    """Called once by the worker process."""
    global _bridge
    _bridge = bridge


def bridge() -> Any:
    if _bridge is None:
        raise TritonModelException(
            "this needs the ascend-serve Python model worker (it is not "
            "available outside a served model)"
        )
    return _bridge


class InferenceResponseSender:
    """`request.get_response_sender()`: sends any number of responses for one request."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def send(self, response: Any = None, flags: int = 0) -> None:
        from backends.python.worker.bridge import SendError

        try:
            bridge().send(self._state, response, flags)
        except SendError as exc:
            raise TritonModelException(str(exc)) from None

    def is_cancelled(self) -> bool:
        return self._state.cancelled

    def is_closed(self) -> bool:
        return self._state.closed


class ResponseIterator:
    """What `exec(decoupled=True)` returns: the called model's answers, in order, the last one
    empty; `cancel()` (or dropping it unfinished) cancels the call in the server."""

    def __init__(self, answers: Any) -> None:
        self._answers = answers

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> Any:
        return next(self._answers)

    def cancel(self) -> None:
        self._answers.close()


class MetricFamily:
    """A custom metric family, exported on the server's /metrics beside Triton's own."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KINDS = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}

    def __init__(self, name: str, description: str, kind: int) -> None:
        """Declared to the server, which checks the name, kind and description and refuses
        what would break its /metrics page (server/observability/custom_metrics.py)."""
        if kind not in self._KINDS:
            raise TritonModelException(f"metric family '{name}': unknown kind {kind}")
        self.name = name
        self.description = description
        self.kind = kind
        _declare(
            {
                "action": "family",
                "family": name,
                "description": description,
                "kind": self._KINDS[kind],
            }
        )

    def Metric(self, labels: dict | None = None, buckets: Sequence[float] | None = None) -> Metric:
        if self.kind == self.HISTOGRAM and not buckets:
            raise TritonModelException("a histogram metric needs 'buckets'")
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("labels must be a dict of strings")
        return Metric(self, dict(labels or {}), list(buckets or ()))


def _declare(update: dict) -> None:
    """A family or series the server must accept first; its refusal is the model's error."""
    error = bridge().declare_metric(update)
    if error is not None:
        raise TritonModelException(error)


class Metric:
    """One labelled series of a MetricFamily; its value is kept here and mirrored to the
    server on each change."""

    def __init__(self, family: MetricFamily, labels: dict, buckets: list[float]) -> None:
        self._family = family
        self._labels = {str(k): str(v) for k, v in labels.items()}
        try:
            self._buckets = sorted(float(b) for b in buckets)
        except (TypeError, ValueError):
            raise TritonModelException("buckets must be numbers") from None
        self._value = 0.0
        self._lock = threading.Lock()
        _declare(
            {
                "action": "series",
                "family": family.name,
                "labels": self._labels,
                "buckets": self._buckets,
            }
        )

    def _update(self, action: str, value: float) -> None:
        bridge().metric(
            {
                "action": action,
                "family": self._family.name,
                "labels": self._labels,
                "value": float(value),
                "buckets": self._buckets,
            }
        )

    def increment(self, value: float) -> None:
        if self._family.kind != MetricFamily.COUNTER and self._family.kind != MetricFamily.GAUGE:
            raise TritonModelException("increment is for counters and gauges")
        if self._family.kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("a counter cannot be decremented")
        with self._lock:
            self._value += value
        self._update("increment", value)

    def set(self, value: float) -> None:
        if self._family.kind != MetricFamily.GAUGE:
            raise TritonModelException("set is only available for gauges")
        with self._lock:
            self._value = float(value)
        self._update("set", value)

    def observe(self, value: float) -> None:
        if self._family.kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("observe is only available for histograms")
        self._update("observe", value)

    def value(self) -> float:
        if self._family.kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("value is not available for histograms")
        with self._lock:
            return self._value


class LogLevel:
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


class Logger:
    """Model-side logging; lines go to the worker's stderr, which is the server's log."""

    INFO, WARNING, ERROR, VERBOSE = (
        LogLevel.INFO,
        LogLevel.WARNING,
        LogLevel.ERROR,
        LogLevel.VERBOSE,
    )
    _NAMES = {LogLevel.INFO: "I", LogLevel.WARNING: "W", LogLevel.ERROR: "E", LogLevel.VERBOSE: "V"}

    # As protocol/text.py escapes them in the server's own records (a model may log what a
    # client sent it): one message, one line.
    _CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

    @classmethod
    def log(cls, message: str, level: int = LogLevel.INFO) -> None:
        text = cls._CONTROLS.sub(lambda m: repr(m.group())[1:-1], str(message))
        sys.stderr.write(f"{cls._NAMES.get(level, 'I')} [python model] {text}\n")
        sys.stderr.flush()

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.log(message, LogLevel.INFO)

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.log(message, LogLevel.WARNING)

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.log(message, LogLevel.ERROR)

    @classmethod
    def log_verbose(cls, message: str) -> None:
        cls.log(message, LogLevel.VERBOSE)
