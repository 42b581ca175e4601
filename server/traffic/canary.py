"""The canary's state machine: a candidate earns its share step by step, or is rolled back.

Pure and clock-free: the caller feeds outcomes (`record`) and asks `evaluate(now)` with its own
clock, so tests drive minutes of canary with a fake clock. The server's gate
(server/traffic/policy.py) calls `evaluate` from a periodic task on the event loop.

Rules (issue 15): a step passes once `step_seconds` have gone by and the candidate has answered
at least `min_requests` in it within the error-rate and p99 thresholds; after the last step the
candidate is promoted. Whenever the candidate has answered `min_requests` in the current step
and breaches a threshold, it is rolled back at once.
"""

from __future__ import annotations

import math
from collections import deque

from protocol.traffic import CanarySpec

RUNNING, PROMOTED, ROLLED_BACK = "running", "promoted", "rolled_back"
STEP = "step"  # the transition name for moving to the next step

DEFAULT_WINDOW = 10_000  # latencies kept per step for the p99 (the newest ones)


class OutcomeWindow:
    """The candidate's answers in the current step: counts, and the newest latencies."""

    __slots__ = ("served", "failed", "latencies_ms")

    def __init__(self, capacity: int = DEFAULT_WINDOW) -> None:
        self.served = 0
        self.failed = 0
        self.latencies_ms: deque[float] = deque(maxlen=capacity)

    def add(self, latency_ms: float, ok: bool) -> None:
        self.served += 1
        if not ok:
            self.failed += 1
        self.latencies_ms.append(latency_ms)

    def clear(self) -> None:
        self.served = self.failed = 0
        self.latencies_ms.clear()

    @property
    def error_rate(self) -> float:
        return self.failed / self.served if self.served else 0.0

    def p99_ms(self) -> float:
        if not self.latencies_ms:
            return 0.0
        ordered = sorted(self.latencies_ms)
        return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


class Canary:
    """One canary run between two versions (numbers as strings, as the API names them)."""

    def __init__(self, spec: CanarySpec, now: float, window: int = DEFAULT_WINDOW) -> None:
        self.spec = spec
        self.state = RUNNING
        self.step = 0
        self.reason = ""
        self.step_started = now
        self.window = OutcomeWindow(window)
        self.candidate = int(spec.candidate)
        self.baseline = int(spec.baseline)

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    def weights(self) -> dict[str, int]:
        """The split in force: the current step's share to the candidate, the rest to the
        baseline; everything to one of them once the canary has ended."""
        spec = self.spec
        if self.state == PROMOTED:
            return {spec.candidate: 100}
        if self.state == ROLLED_BACK:
            return {spec.baseline: 100}
        share = spec.steps[self.step]
        return {spec.baseline: 100 - share, spec.candidate: share}

    def record(self, latency_ms: float, ok: bool) -> None:
        """One answer of the candidate (failed ones count as served, and as errors)."""
        if self.state == RUNNING:
            self.window.add(latency_ms, ok)

    def evaluate(self, now: float) -> str | None:
        """Move the state machine; returns the transition made ("step", "promoted",
        "rolled_back") or None."""
        if self.state != RUNNING:
            return None
        window, spec = self.window, self.spec
        if window.served < spec.min_requests:
            return None
        breach = self._breach()
        if breach:
            return self.roll_back(breach)
        if now - self.step_started < spec.step_seconds:
            return None
        if self.step == len(spec.steps) - 1:
            self.state = PROMOTED
            self.reason = (
                f"passed all {len(spec.steps)} steps; last step: {window.served} "
                f"requests, error rate {window.error_rate:.4f}, p99 "
                f"{window.p99_ms():.1f} ms"
            )
            return PROMOTED
        self.step += 1
        self.step_started = now
        window.clear()
        return STEP

    def roll_back(self, reason: str) -> str:
        """End the canary with all traffic back on the baseline."""
        self.state = ROLLED_BACK
        self.reason = reason
        return ROLLED_BACK

    def _breach(self) -> str:
        window, spec = self.window, self.spec
        rate = window.error_rate
        if rate > spec.max_error_rate:
            return (
                f"error rate {rate:.4f} > max_error_rate {spec.max_error_rate} "
                f"({window.failed} of {window.served} requests failed in step {self.step})"
            )
        if spec.max_p99_ms is not None:
            p99 = window.p99_ms()
            if p99 > spec.max_p99_ms:
                return (
                    f"p99 latency {p99:.1f} ms > max_p99_ms {spec.max_p99_ms} "
                    f"({window.served} requests in step {self.step})"
                )
        return ""
