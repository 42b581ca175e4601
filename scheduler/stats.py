"""Per-version inference statistics (Triton's statistics extension) and the hook that feeds
Prometheus. Recorded once per request and once per batch, at scatter time."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, fields
from typing import NamedTuple, Protocol

from protocol.types import BatchStatisticsSnapshot, DurationSnapshot, StatisticsSnapshot


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def snapshot(self) -> DurationSnapshot:
        return DurationSnapshot(self.count, self.ns)


@dataclass(slots=True)
class BatchStats:
    batch_size: int
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class AnsweredBatch(NamedTuple):
    """The successes of one batch as the statistics counted them, for the metrics: each
    request's (total_ns, queue_ns), their sums, the batch's compute durations (each request's
    too), and whether each answer is also the request's first response."""

    answered: list[tuple[int, int]]
    total_ns: int
    queue_ns: int
    input_ns: int
    infer_ns: int
    output_ns: int
    first: bool


class MetricsObserver(Protocol):
    """What the metrics module implements for one model version (labelled children bound once)."""

    def requests_succeeded(self, batch: AnsweredBatch) -> None: ...

    def request_failed(self, reason: str, total_ns: int) -> None: ...

    def batch_executed(self, batch_size: int, inferences: int = -1) -> None: ...

    def pending_changed(self, delta: int) -> None: ...

    def request_rejected(self, reason: str) -> None: ...

    def failure_counted(self, reason: str) -> None: ...

    def sequences_changed(self, active: int) -> None: ...

    def sequences_idle_released(self, count: int) -> None: ...

    def ensemble_inflight_changed(self, inflight: int) -> None: ...

    def cache_enabled(self) -> None: ...

    def cache_hit(self, total_ns: int, queue_ns: int, hit_ns: int) -> None: ...

    def cache_miss(self, miss_ns: int) -> None: ...

    def first_response(self, elapsed_ns: int) -> None: ...


class FailureReason:
    REJECTED = "REJECTED"  # timed out in the queue (REJECT policy) or refused at enqueue
    CANCELED = "CANCELED"  # cancelled by the client while queued
    BACKEND = "BACKEND"  # the model's execute failed
    OTHER = "OTHER"


class RejectionReason:
    """Why a REJECTED request was refused (ascend_inference_rejected_total's `reason`)."""

    QUEUE_FULL = "queue_full"  # its queue level held max_queue_size requests: refused at once
    QUEUE_TIMEOUT = "queue_timeout"  # its queue timeout ran out under timeout_action REJECT


REJECTION_REASONS = (RejectionReason.QUEUE_FULL, RejectionReason.QUEUE_TIMEOUT)


@dataclass
class VersionStatistics:
    """Counters for one model version. Mutated on the event loop only, except via the lock."""

    name: str
    version: str
    observer: MetricsObserver | None = None
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    batch_stats: dict[int, BatchStats] = field(default_factory=dict)
    pending: int = 0
    sequences_active: int | None = None  # None: not a sequence model
    ensemble_inflight: int | None = None  # None: not an ensemble
    caching: bool = False  # answers from the response cache (server/core/response_cache.py)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_success(
        self, total_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One request answered; compute durations are those of the batch it ran in."""
        self.record_successes([(total_ns, queue_ns)], input_ns, infer_ns, output_ns, False)

    def record_successes(
        self,
        answered: list[tuple[int, int]],
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        first: bool,
    ) -> None:
        """The requests of one batch answered, (total_ns, queue_ns) each; the compute
        durations are the batch's, counted for each request. `first`: each answer is also the
        request's first response (a model that is not decoupled). One lock and one observer
        call per batch, not per request (bench/FINDINGS.md 36)."""
        count = len(answered)
        if not count:
            return
        total_ns = queue_ns = 0
        for total, queued in answered:
            total_ns += total
            queue_ns += queued
        with self._lock:
            self.success.add(total_ns, count)
            self.queue.add(queue_ns, count)
            self.compute_input.add(count * input_ns, count)
            self.compute_infer.add(count * infer_ns, count)
            self.compute_output.add(count * output_ns, count)
            self.last_inference_ms = int(time.time() * 1000)
        if self.observer is not None:
            self.observer.requests_succeeded(
                AnsweredBatch(answered, total_ns, queue_ns, input_ns, infer_ns, output_ns, first)
            )

    def record_cache_hit(self, total_ns: int, queue_ns: int, hit_ns: int) -> None:
        """A request answered from the response cache: a success (its queue time is what
        passed before the lookup, as Triton counts it), with no execution, inference or
        compute time."""
        with self._lock:
            self.success.add(total_ns)
            self.queue.add(queue_ns)
            self.cache_hit.add(hit_ns)
            self.last_inference_ms = int(time.time() * 1000)
        if self.observer is not None:
            self.observer.cache_hit(total_ns, queue_ns, hit_ns)

    def record_cache_miss(self, miss_ns: int) -> None:
        """A lookup that found nothing: `miss_ns` is the lookup and, once the request
        succeeded, the insert of its answer."""
        with self._lock:
            self.cache_miss.add(miss_ns)
        if self.observer is not None:
            self.observer.cache_miss(miss_ns)

    def record_failure(self, reason: str, total_ns: int) -> None:
        with self._lock:
            self.fail.add(total_ns)
        if self.observer is not None:
            self.observer.request_failed(reason, total_ns)

    def record_first_response(self, elapsed_ns: int) -> None:
        """A request's first answer came `elapsed_ns` after it arrived: its only answer for a
        model that is not decoupled, the first of its stream for one that is
        (nv_inference_first_response_histogram_ms)."""
        if self.observer is not None:
            self.observer.first_response(elapsed_ns)

    def record_member_failure(self) -> None:
        """An ensemble request failed in a composing model. Triton's metrics count that failure
        on the ensemble too, with reason OTHER, besides the ensemble's own failure (qa
        L0_model_queue test_policy_reject); the statistics count the request once."""
        if self.observer is not None:
            self.observer.failure_counted(FailureReason.OTHER)

    def record_rejection(self, reason: str, total_ns: int) -> None:
        """A request refused for overload: a REJECTED failure, also counted by why
        (a RejectionReason)."""
        self.record_failure(FailureReason.REJECTED, total_ns)
        if self.observer is not None:
            self.observer.request_rejected(reason)

    def record_execution(
        self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int, inferences: int = -1
    ) -> None:
        """One model execution of `batch_size` batch elements, `inferences` of them real
        requests (the rest padding a sequence batcher added; -1: all of them)."""
        if inferences < 0:
            inferences = batch_size
        with self._lock:
            self.inference_count += inferences
            self.execution_count += 1
            stats = self.batch_stats.get(batch_size)
            if stats is None:
                stats = self.batch_stats[batch_size] = BatchStats(batch_size)
            stats.compute_input.add(input_ns)
            stats.compute_infer.add(infer_ns)
            stats.compute_output.add(output_ns)
            self.last_inference_ms = int(time.time() * 1000)
        if self.observer is not None:
            self.observer.batch_executed(batch_size, inferences)

    def attach(self, observer: MetricsObserver | None) -> None:
        """Start reporting to `observer` (bound once the version has loaded), telling it what
        it missed that is a level rather than a count."""
        self.observer = observer
        if observer is not None and self.sequences_active is not None:
            observer.sequences_changed(self.sequences_active)
        if observer is not None and self.ensemble_inflight is not None:
            observer.ensemble_inflight_changed(self.ensemble_inflight)
        if observer is not None and self.caching:
            observer.cache_enabled()

    def sequences_changed(self, active: int) -> None:
        """A sequence model's live sequences (started, not yet ended or released)."""
        self.sequences_active = active
        if self.observer is not None:
            self.observer.sequences_changed(active)

    def sequences_idle_released(self, count: int) -> None:
        """Sequences whose slots were released after max_sequence_idle_microseconds."""
        if self.observer is not None:
            self.observer.sequences_idle_released(count)

    def ensemble_inflight_changed(self, inflight: int) -> None:
        """An ensemble's requests past their first step and not yet answered
        (ascend_ensemble_inflight; bounded by max_inflight_requests)."""
        self.ensemble_inflight = inflight
        if self.observer is not None:
            self.observer.ensemble_inflight_changed(inflight)

    def pending_changed(self, delta: int) -> None:
        """Requests accepted but not yet executing (nv_inference_pending_request_count)."""
        with self._lock:
            self.pending += delta
        if self.observer is not None:
            self.observer.pending_changed(delta)

    def snapshot(self) -> StatisticsSnapshot:
        """Every counter copied under the lock as one immutable value: what the statistics
        endpoints encode, so their counts agree with each other and no codec holds the lock."""
        with self._lock:
            return StatisticsSnapshot(
                name=self.name,
                version=self.version,
                last_inference_ms=self.last_inference_ms,
                inference_count=self.inference_count,
                execution_count=self.execution_count,
                success=self.success.snapshot(),
                fail=self.fail.snapshot(),
                queue=self.queue.snapshot(),
                compute_input=self.compute_input.snapshot(),
                compute_infer=self.compute_infer.snapshot(),
                compute_output=self.compute_output.snapshot(),
                cache_hit=self.cache_hit.snapshot(),
                cache_miss=self.cache_miss.snapshot(),
                batch_stats=tuple(
                    BatchStatisticsSnapshot(
                        size,
                        b.compute_input.snapshot(),
                        b.compute_infer.snapshot(),
                        b.compute_output.snapshot(),
                    )
                    for size, b in sorted(self.batch_stats.items())
                ),
                pending=self.pending,
            )

    def reset(self) -> None:
        """Counters back to their initial values, keeping name, version, observer and pending
        (requests still queued): after warm-up, statistics describe client traffic only."""
        fresh = VersionStatistics(self.name, self.version)
        with self._lock:
            for item in fields(self):
                if item.name not in _KEPT_ON_RESET:
                    setattr(self, item.name, getattr(fresh, item.name))


_KEPT_ON_RESET = frozenset(
    {
        "name",
        "version",
        "observer",
        "pending",
        "sequences_active",
        "ensemble_inflight",
        "caching",
        "_lock",
    }
)
