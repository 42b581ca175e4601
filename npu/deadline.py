"""How long one execution may take before its instance counts as hung.

`synchronize_stream` waits forever, so a device that never finishes an execution would hold
its instance (and every request queued behind it) forever. Each instance instead waits with
`acl.rt.synchronize_stream_with_timeout` for at most `timeout_ms()`: the model's
`execution_timeout_ms` parameter when it sets one, else a timeout derived from what the
instance has seen, max(TIMEOUT_FLOOR_MS, TIMEOUT_FACTOR x the slowest execution so far), and
FIRST_TIMEOUT_MS before the first one finishes (which may include lazy device set-up).
Executions that time out are counted here for the metrics endpoint.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from backends.base import BackendError, ParameterBound

if TYPE_CHECKING:  # pragma: no cover
    from protocol.proto.model_config_pb2 import ModelConfig

PARAMETER = "execution_timeout_ms"
FIRST_TIMEOUT_MS = 60_000  # before any execution of this instance finished
TIMEOUT_FLOOR_MS = 5_000  # the derived timeout never goes below this
TIMEOUT_FACTOR = 20.0  # the derived timeout: this many times the slowest execution seen
MAX_TIMEOUT_MS = 2**31 - 1  # the binding takes an int32 of milliseconds

PARAMETER_BOUNDS: Mapping[str, ParameterBound] = {
    PARAMETER: ParameterBound(0, MAX_TIMEOUT_MS, integer=True),
}


def configured_ms(config: ModelConfig) -> int:
    """The model's `execution_timeout_ms` (0: derive it), BackendError when unreadable."""
    if PARAMETER not in config.parameters:
        return 0
    raw = config.parameters[PARAMETER].string_value
    try:
        value = int(raw)
    except ValueError:
        raise BackendError(
            f"model '{config.name}': parameter '{PARAMETER}' must be a whole number of "
            f"milliseconds, got '{raw}'"
        ) from None
    if not 0 <= value <= MAX_TIMEOUT_MS:
        raise BackendError(
            f"model '{config.name}': parameter '{PARAMETER}' must be 0 (derived) to "
            f"{MAX_TIMEOUT_MS}, got {value}"
        )
    return value


class ExecutionDeadline:
    """One instance's timeout: fixed, or derived from its slowest execution so far."""

    def __init__(self, fixed_ms: int = 0) -> None:
        self.fixed_ms = fixed_ms
        self.slowest_s: float | None = None

    def timeout_ms(self) -> int:
        if self.fixed_ms > 0:
            return self.fixed_ms
        if self.slowest_s is None:
            return FIRST_TIMEOUT_MS
        derived = int(TIMEOUT_FACTOR * self.slowest_s * 1000.0)
        return min(MAX_TIMEOUT_MS, max(TIMEOUT_FLOOR_MS, derived))

    def observe(self, seconds: float) -> None:
        """An execution finished after waiting `seconds` on the stream."""
        if self.slowest_s is None or seconds > self.slowest_s:
            self.slowest_s = seconds

    def describe(self) -> str:
        """Where the current timeout comes from, for the log and the error."""
        if self.fixed_ms > 0:
            return f"{self.fixed_ms} ms (parameter {PARAMETER})"
        if self.slowest_s is None:
            return f"{FIRST_TIMEOUT_MS} ms (the first execution's timeout)"
        return (
            f"{self.timeout_ms()} ms (derived: {TIMEOUT_FACTOR:g} x the slowest execution so "
            f"far, {self.slowest_s * 1000.0:.1f} ms, at least {TIMEOUT_FLOOR_MS} ms)"
        )


_count_lock = threading.Lock()
_timeouts: dict[tuple[str, int], int] = {}  # (model, device) -> executions that timed out


def record_timeout(model: str, device_id: int) -> None:
    """An execution of `model` on the NPU did not finish within its timeout. Counted in the
    process whose metrics endpoint shows it (the server's, for instances in executors):
    ascend_npu_execution_timeouts_total (npu/telemetry.py)."""
    with _count_lock:
        _timeouts[(model, device_id)] = _timeouts.get((model, device_id), 0) + 1


def timeout_counts() -> dict[tuple[str, int], int]:
    with _count_lock:
        return dict(_timeouts)


def forget_counts() -> None:
    """Start counting from zero, as a fresh process does (for tests)."""
    with _count_lock:
        _timeouts.clear()
