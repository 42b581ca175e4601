"""server/traffic/canary.py: the canary state machine on a fake clock."""

from __future__ import annotations

from protocol.traffic import CanarySpec
from server.traffic.canary import PROMOTED, ROLLED_BACK, RUNNING, STEP, Canary, OutcomeWindow

SPEC = CanarySpec(
    "1",
    "2",
    steps=(10, 50, 100),
    step_seconds=30.0,
    min_requests=50,
    max_error_rate=0.05,
    max_p99_ms=200.0,
)


def feed(canary: Canary, n: int, latency_ms: float = 10.0, failures: int = 0) -> None:
    for i in range(n):
        canary.record(latency_ms, ok=i >= failures)


def test_starts_with_the_first_step_on_the_candidate() -> None:
    canary = Canary(SPEC, now=0.0)
    assert canary.state == RUNNING and canary.step == 0
    assert canary.weights() == {"1": 90, "2": 10}


def test_healthy_candidate_walks_the_steps_then_is_promoted() -> None:
    canary = Canary(SPEC, now=0.0)
    feed(canary, 50)
    assert canary.evaluate(29.9) is None  # the step is not over yet
    assert canary.evaluate(30.0) == STEP and canary.weights() == {"1": 50, "2": 50}
    assert canary.window.served == 0  # a new step counts afresh
    assert canary.evaluate(61.0) is None  # too few requests in this step: it waits
    feed(canary, 50)
    assert canary.evaluate(61.0) == STEP and canary.weights() == {"1": 0, "2": 100}
    feed(canary, 60)
    assert canary.evaluate(80.0) is None
    assert canary.evaluate(91.0) == PROMOTED
    assert canary.weights() == {"2": 100} and canary.step == 2
    assert "passed all 3 steps" in canary.reason
    feed(canary, 10, failures=10)
    assert canary.evaluate(1000.0) is None and canary.state == PROMOTED  # final


def test_error_rate_breach_rolls_back_at_once_with_the_measured_value() -> None:
    canary = Canary(SPEC, now=0.0)
    feed(canary, 49, failures=49)
    assert canary.evaluate(1.0) is None  # min_requests not reached: nothing is judged
    feed(canary, 1)
    assert canary.evaluate(1.0) == ROLLED_BACK  # long before step_seconds
    assert canary.weights() == {"1": 100}
    assert canary.reason.startswith("error rate 0.9800 > max_error_rate 0.05")
    assert "49 of 50" in canary.reason


def test_failures_count_as_served() -> None:
    canary = Canary(SPEC, now=0.0)
    feed(canary, 50, failures=2)  # 4%: within 5%
    assert canary.window.served == 50 and canary.window.failed == 2
    assert canary.evaluate(30.0) == STEP


def test_p99_breach_rolls_back() -> None:
    canary = Canary(SPEC, now=0.0)
    feed(canary, 98, latency_ms=5.0)
    feed(canary, 2, latency_ms=500.0)  # the 99th percentile of 100 is the 99th value
    assert canary.evaluate(1.0) == ROLLED_BACK
    assert canary.reason.startswith("p99 latency 500.0 ms > max_p99_ms 200.0")


def test_no_latency_gate_when_max_p99_is_none() -> None:
    spec = CanarySpec("1", "2", steps=(100,), step_seconds=1.0, min_requests=5, max_p99_ms=None)
    canary = Canary(spec, now=0.0)
    feed(canary, 5, latency_ms=1e6)
    assert canary.evaluate(1.0) == PROMOTED


def test_the_window_keeps_the_newest_latencies_only() -> None:
    window = OutcomeWindow(capacity=10)
    for i in range(1000):
        window.add(float(i), ok=True)
    assert window.served == 1000 and len(window.latencies_ms) == 10
    assert window.p99_ms() == 999.0 and OutcomeWindow().p99_ms() == 0.0
