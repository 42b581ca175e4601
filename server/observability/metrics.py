"""Prometheus metrics with Triton's names, types, labels and meanings, plus our histograms.

Triton's counters are exposed under their bare names (`nv_inference_count`, no `_total`), which
prometheus_client's own text writer would rename, so families are rendered here in the 0.0.4
text format. Per-version series are bound once when a version loads (at 0) and removed when it
unloads; updates happen once per request and once per batch.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from scheduler.stats import REJECTION_REASONS, AnsweredBatch, FailureReason
from server.observability.quantiles import DEFAULT_CAPACITY, DEFAULT_QUANTILES, WindowedQuantiles
from server.observability.remote_reads import RemoteReads

if TYPE_CHECKING:  # pragma: no cover
    from repository.registry import ModelRegistry

FAILURE_REASONS = (
    FailureReason.REJECTED,
    FailureReason.CANCELED,
    FailureReason.BACKEND,
    FailureReason.OTHER,
)
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FIRST_RESPONSE_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)  # ms, Triton's defaults
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
# Observations a version buffers for its summaries before the request that adds one more
# merges them itself; the metrics poller merges them every --metrics-interval-ms before that.
SUMMARY_BUFFER = 4096


@dataclass(frozen=True)
class MetricsOptions:
    """What --metrics-config, --allow-cpu-metrics and --metrics-interval-ms chose (Triton's
    keys and defaults): which latency families exist, the summaries' quantiles, and how often
    the per-interval metrics (CPU) are read."""

    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    summary_samples: int = DEFAULT_CAPACITY  # kept per 12 s slice of the 60 s window
    cpu_metrics: bool = True
    interval_ms: int = 2000


METRICS_CONFIG_KEYS = (
    "counter_latencies",
    "histogram_latencies",
    "summary_latencies",
    "summary_quantiles",
)


def parse_metrics_config(specs: Iterable[str]) -> dict[str, object]:
    """Triton's `--metrics-config <setting>=<value>` values -> MetricsOptions fields.
    ValueError (a startup error) for a malformed one, an unknown setting, a value that is not
    true/false, or a quantile pair outside 0 < quantile < 1, 0 < error < 1 (Triton logs and
    skips a bad pair; a typo here should not silently keep the defaults)."""
    fields: dict[str, object] = {}
    for spec in specs:
        key, eq, value = spec.partition("=")
        if not eq or not key or not value or "," in key:
            raise ValueError(f"--metrics-config option format is <setting>=<value>. Got {spec}")
        if key not in METRICS_CONFIG_KEYS:
            raise ValueError(
                f"--metrics-config: unknown setting '{key}'; expected one of "
                f"{', '.join(METRICS_CONFIG_KEYS)}"
            )
        if key == "summary_quantiles":
            fields[key] = _parse_quantiles(value)
            continue
        if value not in ("true", "false"):
            raise ValueError(f"--metrics-config: {key} must be true or false, got '{value}'")
        fields[key] = value == "true"
    return fields


def _parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    pairs: list[tuple[float, float]] = []
    for pair in text.split(","):
        quantile, colon, error = pair.strip().partition(":")
        try:
            q, e = float(quantile), float(error)
        except ValueError:
            q = e = math.nan
        if not colon or not (0.0 < q < 1.0) or not (0.0 < e < 1.0):
            raise ValueError(
                f"--metrics-config: invalid summary_quantiles pair [{pair}]: expected "
                "<quantile>:<error> with 0 < quantile < 1 and 0 < error < 1"
            )
        pairs.append((q, e))
    return tuple(pairs)


# The summaries, in the order of VersionMetrics' buffered tuples (Triton's names and help).
SUMMARIES = (
    (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Cumulative inference compute output duration in microseconds "
        "(does not include cached requests)",
    ),
)
LATENCY_COUNTERS = (
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


class LatencySummaries:
    """One version's five summaries. Requests only append a tuple to a bounded buffer; it is
    handed to the windows (server/observability/quantiles.py) at scrape, on the metrics poller,
    or, when SUMMARY_BUFFER requests came between those, by the request that fills it. Count
    and sum cover every observation, the quantiles the last 60 s (Triton's window)."""

    def __init__(self, quantiles: tuple[tuple[float, float], ...], samples: int) -> None:
        self.quantiles = tuple(q for q, _ in quantiles)
        self.windows = [WindowedQuantiles(samples) for _ in SUMMARIES]
        self.counts = [0] * len(SUMMARIES)
        self.sums = [0] * len(SUMMARIES)
        self.pending: list[tuple[int, int, int, int, int]] = []
        self._merge_lock = threading.Lock()  # one merge at a time; requests never wait on it

    def merge(self, lock: threading.Lock) -> None:
        """Take the buffer (under the version's `lock`, briefly) and hand it to the windows."""
        with self._merge_lock:
            with lock:
                batch, self.pending = self.pending, []
            if not batch:
                return
            now = time.monotonic_ns()
            for index, column in enumerate(zip(*batch, strict=True)):
                self.counts[index] += len(column)
                self.sums[index] += sum(column)
                self.windows[index].insert(column, now)

    def samples(self) -> list[tuple[list[tuple[float, float]], int, int]]:
        """Per summary: [(quantile, value)], count, sum."""
        with self._merge_lock:
            now = time.monotonic_ns()
            return [
                (
                    list(zip(self.quantiles, window.get(self.quantiles, now), strict=True)),
                    self.counts[index],
                    self.sums[index],
                )
                for index, window in enumerate(self.windows)
            ]


# name -> (type, help); HELP texts describe the same meaning as Triton's.
_FAMILIES: dict[str, tuple[str, str]] = {
    "nv_inference_request_success": (
        "counter",
        "Number of successful inference requests, all batch sizes",
    ),
    "nv_inference_request_failure": (
        "counter",
        "Number of failed inference requests, all batch sizes",
    ),
    "nv_inference_count": (
        "counter",
        "Number of inferences performed (does not include cached requests)",
    ),
    "nv_inference_exec_count": (
        "counter",
        "Number of model executions performed (does not include cached requests)",
    ),
    "nv_inference_request_duration_us": (
        "counter",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    "nv_inference_queue_duration_us": (
        "counter",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    "nv_inference_compute_input_duration_us": (
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    "nv_inference_compute_infer_duration_us": (
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    "nv_inference_compute_output_duration_us": (
        "counter",
        "Cumulative inference compute output duration in microseconds "
        "(does not include cached requests)",
    ),
    "nv_inference_pending_request_count": (
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    ),
    "nv_model_load_duration_secs": ("gauge", "Model load time in seconds"),
    # Beyond Triton: nv_inference_request_failure{reason="REJECTED"} split by why.
    "ascend_sequence_active": (
        "gauge",
        "Sequences of a sequence-batched model version that started and have neither ended "
        "nor been released (holding a slot or waiting for one)",
    ),
    "ascend_sequence_idle_released_total": (
        "counter",
        "Sequences released after max_sequence_idle_microseconds without a request; "
        "their next request needs the START flag",
    ),
    "ascend_ensemble_inflight": (
        "gauge",
        "Requests of an ensemble between the start of their first step and their answer "
        "(at most its max_inflight_requests; the requests waiting to enter are in "
        "nv_inference_pending_request_count)",
    ),
    "ascend_inference_rejected_total": (
        "counter",
        "Number of inference requests refused for overload, by reason: queue_full "
        "(max_queue_size reached, answered at once with a retry hint), queue_timeout "
        "(queue timeout expired under timeout_action REJECT)",
    ),
}
# Triton's per-model response cache families: rendered only while some version caches.
_CACHE_FAMILIES: dict[str, tuple[str, str]] = {
    "nv_cache_num_hits_per_model": ("counter", "Number of cache hits per model"),
    "nv_cache_num_misses_per_model": ("counter", "Number of cache misses per model"),
    "nv_cache_hit_duration_per_model": (
        "counter",
        "Total cache hit duration per model, in microseconds",
    ),
    "nv_cache_miss_duration_per_model": (
        "counter",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
    ),
}


@dataclass
class VersionMetrics:
    """The series of one model version; implements scheduler.stats.MetricsObserver."""

    model: str
    version: str
    histograms: ServerMetrics
    load_seconds: float = 0.0
    success: int = 0
    failure: dict[str, int] = field(default_factory=lambda: {r: 0 for r in FAILURE_REASONS})
    inference_count: int = 0
    exec_count: int = 0
    request_us: float = 0.0
    queue_us: float = 0.0
    input_us: float = 0.0
    infer_us: float = 0.0
    output_us: float = 0.0
    pending: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: {r: 0 for r in REJECTION_REASONS})
    sequences: int | None = None  # active sequences; None for a model without them
    sequences_idle: int = 0
    ensemble_inflight: int | None = None  # None for a model that is not an ensemble
    caching: bool = False  # the version answers from the response cache
    cache_hits: int = 0
    cache_misses: int = 0
    cache_hit_us: float = 0.0
    cache_miss_us: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._latency = self.histograms.latency.labels(self.model, self.version)
        self._batch = self.histograms.batch_size.labels(self.model, self.version)
        options = self.histograms.options
        self.summaries = (
            LatencySummaries(options.summary_quantiles, options.summary_samples)
            if options.summary_latencies
            else None
        )
        self._first = (
            self.histograms.first_response.labels(self.model, self.version)
            if self.histograms.first_response is not None
            else None
        )

    def requests_succeeded(self, batch: AnsweredBatch) -> None:
        """The successes of one batch: one lock for the counters and the summaries' samples;
        the histograms observe each request."""
        answered = batch.answered
        count = len(answered)
        summaries = self.summaries
        with self._lock:
            self.success += count
            self.request_us += batch.total_ns / 1000
            self.queue_us += batch.queue_ns / 1000
            self.input_us += count * batch.input_ns / 1000
            self.infer_us += count * batch.infer_ns / 1000
            self.output_us += count * batch.output_ns / 1000
            if summaries is not None:  # whole microseconds, as Triton observes them
                pending = summaries.pending
                compute = (batch.input_ns // 1000, batch.infer_ns // 1000, batch.output_ns // 1000)
                for total, queued in answered:
                    pending.append((total // 1000, queued // 1000, *compute))
                full = len(pending) >= SUMMARY_BUFFER
        latency, first_response = self._latency, self._first if batch.first else None
        for total, _ in answered:
            latency.observe(total / 1e9)
            if first_response is not None:  # whole milliseconds, as Triton observes them
                first_response.observe(total // 1_000_000)
        if summaries is not None and full:
            summaries.merge(self._lock)

    def first_response(self, elapsed_ns: int) -> None:
        """A request's first answer, `elapsed_ns` after it arrived (whole milliseconds, as
        Triton observes them)."""
        if self._first is not None:
            self._first.observe(elapsed_ns // 1_000_000)

    def request_failed(self, reason: str, total_ns: int) -> None:
        with self._lock:
            self.failure[reason] = self.failure.get(reason, 0) + 1
            self.request_us += total_ns / 1000
        self._latency.observe(total_ns / 1e9)

    def failure_counted(self, reason: str) -> None:
        """One more failure under `reason`, with no request time of its own."""
        with self._lock:
            self.failure[reason] = self.failure.get(reason, 0) + 1

    def batch_executed(self, batch_size: int, inferences: int = -1) -> None:
        inferences = batch_size if inferences < 0 else inferences
        with self._lock:
            self.exec_count += 1
            self.inference_count += inferences
        self._batch.observe(batch_size)

    def pending_changed(self, delta: int) -> None:
        with self._lock:
            self.pending += delta

    def sequences_changed(self, active: int) -> None:
        with self._lock:
            self.sequences = active

    def sequences_idle_released(self, count: int) -> None:
        with self._lock:
            self.sequences_idle += count

    def ensemble_inflight_changed(self, inflight: int) -> None:
        with self._lock:
            self.ensemble_inflight = inflight

    def request_rejected(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def cache_enabled(self) -> None:
        self.caching = True

    def cache_hit(self, total_ns: int, queue_ns: int, hit_ns: int) -> None:
        """A success with no execution (nv_inference_count and exec_count do not move)."""
        with self._lock:
            self.success += 1
            self.request_us += total_ns / 1000
            self.queue_us += queue_ns / 1000
            self.cache_hits += 1
            self.cache_hit_us += hit_ns / 1000
        self._latency.observe(total_ns / 1e9)

    def cache_miss(self, miss_ns: int) -> None:
        with self._lock:
            self.cache_misses += 1
            self.cache_miss_us += miss_ns / 1000


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields), idle


def _memory() -> tuple[int, int]:
    values: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    total = values.get("MemTotal", 0)
    return total, total - values.get("MemAvailable", values.get("MemFree", 0))


# Scrape-time reader of Python model worker restarts: (model, version, restarts so far).
WorkerRestarts = Callable[[], Iterable[tuple[str, str, int]]]
WORKER_RESTARTS = "ascend_python_worker_restarts_total"


def worker_restarts(registry: ModelRegistry) -> list[tuple[str, str, int]]:
    """Worker restarts per serving version whose backend counts them (`restarts`, the Python
    backend), summed over its instances. Backends only count; this side reads at scrape time,
    on the event loop like every registry change, so the series lives and dies with the
    version."""
    counts: list[tuple[str, str, int]] = []
    for name, record in registry.serving_versions():
        pool = getattr(record.scheduler, "pool", None)
        if pool is None:
            continue
        restarts = [
            getattr(getattr(instance, "backend", None), "restarts", None)
            for instance in pool.instances
        ]
        numbers = [count for count in restarts if isinstance(count, int)]
        if numbers:
            counts.append((name, str(record.version), sum(numbers)))
    return counts


class ServerMetrics:
    """Every metric the server exposes; also the repository manager's VersionHooks."""

    def __init__(
        self, restarts: WorkerRestarts | None = None, options: MetricsOptions | None = None
    ) -> None:
        self._restarts = restarts
        self.options = options or MetricsOptions()
        self.registry = CollectorRegistry(auto_describe=False)
        self.latency = Histogram(
            "ascend_inference_request_latency_seconds",
            "End-to-end inference request latency per model version",
            ["model", "version"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.batch_size = Histogram(
            "ascend_inference_batch_size",
            "Batch size of each model execution per model version",
            ["model", "version"],
            registry=self.registry,
            buckets=BATCH_BUCKETS,
        )
        self.first_response: Histogram | None = None
        if self.options.histogram_latencies:
            self.first_response = Histogram(
                FIRST_RESPONSE,
                "Duration from request to first response in milliseconds",
                ["model", "version"],
                registry=self.registry,
                buckets=FIRST_RESPONSE_BUCKETS,
            )
        self.versions: dict[tuple[str, str], VersionMetrics] = {}
        self._poller: threading.Thread | None = None
        self._stopping = threading.Event()
        self._extra: list[Collector] = []
        self._remote_reads = RemoteReads()
        self._cpu_last = _cpu_times() if os.path.exists("/proc/stat") else (0, 0)
        self._cpu_utilization = 0.0
        self._cpu_memory = (0, 0)
        self._lock = threading.Lock()

    # VersionHooks
    def version_loaded(self, name: str, version: int, load_seconds: float) -> VersionMetrics:
        key = (name, str(version))
        metrics = VersionMetrics(name, str(version), self, load_seconds)
        with self._lock:
            self.versions[key] = metrics
        return metrics

    def version_unloaded(self, name: str, version: int) -> None:
        key = (name, str(version))
        with self._lock:
            if self.versions.pop(key, None) is None:
                return
        for histogram in (self.latency, self.batch_size, self.first_response):
            if histogram is None:
                continue
            try:
                histogram.remove(*key)
            except KeyError:
                pass

    # Per-interval work (Triton's --metrics-interval-ms): CPU readings, summary merges.
    def poll(self) -> None:
        """Read what is read per interval: CPU utilization and memory, and merge each
        version's buffered summary observations."""
        if self.options.cpu_metrics and os.path.exists("/proc/stat"):
            total, idle = _cpu_times()
            last_total, last_idle = self._cpu_last
            memory = _memory()
            with self._lock:
                if total > last_total:
                    self._cpu_utilization = 1.0 - (idle - last_idle) / (total - last_total)
                    self._cpu_last = (total, idle)
                self._cpu_memory = memory
        for v in self._summarised():
            v.summaries.merge(v._lock)  # type: ignore[union-attr]  # _summarised: has them

    def _summarised(self) -> list[VersionMetrics]:
        with self._lock:
            return [v for v in self.versions.values() if v.summaries is not None]

    def start(self) -> None:
        """Poll every interval on a daemon thread (never the event loop: a merge takes CPU)."""
        if self._poller is not None:
            return
        self.poll()
        interval = max(self.options.interval_ms, 1) / 1000

        def run() -> None:
            while not self._stopping.wait(interval):
                try:
                    self.poll()
                except Exception:  # pragma: no cover - a bad read must not end the polling
                    logging.getLogger(__name__).exception("metrics poll failed")

        self._poller = threading.Thread(target=run, name="metrics-poll", daemon=True)
        self._poller.start()

    def stop(self) -> None:
        self._stopping.set()

    def add_collector(self, collector: Collector) -> None:
        """Extra families (NPU telemetry) rendered after ours; one with a `read_remote()` has
        it run off the loop before each scrape's render (server/observability/remote_reads.py)."""
        self._extra.append(collector)
        read_remote = getattr(collector, "read_remote", None)
        if callable(read_remote):
            self._remote_reads.add(read_remote)

    async def scrape(self) -> bytes:
        """The page for GET /metrics: other processes' readings read in a thread first, so the
        loop never waits on them, then `render()`."""
        await self._remote_reads.refresh()
        return self.render()

    # Rendering
    def _triton_families(self) -> Iterable[Metric]:
        with self._lock:
            versions = list(self.versions.values())
        known = dict(_FAMILIES)
        if any(v.caching for v in versions):
            known.update(_CACHE_FAMILIES)
        counters = self.options.counter_latencies
        families = {
            name: Metric(name, help_text, kind)
            for name, (kind, help_text) in known.items()
            if counters or name not in LATENCY_COUNTERS
        }

        def add(name: str, labels: dict[str, str], value: float) -> None:
            families[name].add_sample(name, labels, value)

        for v in versions:
            labels = {"model": v.model, "version": v.version}
            with v._lock:
                add("nv_inference_request_success", labels, v.success)
                for reason, count in v.failure.items():
                    add("nv_inference_request_failure", {**labels, "reason": reason}, count)
                add("nv_inference_count", labels, v.inference_count)
                add("nv_inference_exec_count", labels, v.exec_count)
                if counters:
                    add("nv_inference_request_duration_us", labels, int(v.request_us))
                    add("nv_inference_queue_duration_us", labels, int(v.queue_us))
                    add("nv_inference_compute_input_duration_us", labels, int(v.input_us))
                    add("nv_inference_compute_infer_duration_us", labels, int(v.infer_us))
                    add("nv_inference_compute_output_duration_us", labels, int(v.output_us))
                add("nv_inference_pending_request_count", labels, v.pending)
                add("nv_model_load_duration_secs", labels, round(v.load_seconds, 6))
                for reason, count in v.rejected.items():
                    add("ascend_inference_rejected_total", {**labels, "reason": reason}, count)
                if v.sequences is not None:
                    add("ascend_sequence_active", labels, v.sequences)
                    add("ascend_sequence_idle_released_total", labels, v.sequences_idle)
                if v.ensemble_inflight is not None:
                    add("ascend_ensemble_inflight", labels, v.ensemble_inflight)
                if v.caching:
                    add("nv_cache_num_hits_per_model", labels, v.cache_hits)
                    add("nv_cache_num_misses_per_model", labels, v.cache_misses)
                    add("nv_cache_hit_duration_per_model", labels, int(v.cache_hit_us))
                    add("nv_cache_miss_duration_per_model", labels, int(v.cache_miss_us))
        yield from families.values()

    def _summary_families(self) -> Iterable[Metric]:
        """Triton's summaries: `{quantile="q"}` samples, then `_count` and `_sum`, per version."""
        if not self.options.summary_latencies:
            return
        versions = self._summarised()
        families = [Metric(name, help_text, "summary") for name, help_text in SUMMARIES]
        for v in versions:
            summaries = v.summaries
            assert summaries is not None
            summaries.merge(v._lock)
            labels = {"model": v.model, "version": v.version}
            for family, (quantiles, count, total) in zip(
                families, summaries.samples(), strict=True
            ):
                for quantile, value in quantiles:
                    family.add_sample(family.name, {**labels, "quantile": repr(quantile)}, value)
                family.add_sample(family.name + "_count", labels, count)
                family.add_sample(family.name + "_sum", labels, total)
        yield from families

    def _worker_families(self) -> Iterable[Metric]:
        if self._restarts is None:
            return
        family = Metric(
            WORKER_RESTARTS,
            "Restarts of Python model worker processes that died, per model version",
            "counter",
        )
        for model, version, count in self._restarts():
            family.add_sample(WORKER_RESTARTS, {"model": model, "version": version}, count)
        yield family

    def _cpu_families(self) -> Iterable[Metric]:
        """Per interval, as Triton: the values of the last poll (a scrape before the poller
        runs reads them itself). None with --allow-cpu-metrics=false."""
        if not self.options.cpu_metrics or not os.path.exists("/proc/stat"):
            return
        if self._poller is None:
            self.poll()
        with self._lock:
            memory_total, memory_used = self._cpu_memory
        for name, help_text, value in (
            (
                "nv_cpu_utilization",
                "CPU utilization rate [0.0 - 1.0]",
                round(self._cpu_utilization, 6),
            ),
            ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", memory_total),
            ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", memory_used),
        ):
            family = Metric(name, help_text, "gauge")
            family.add_sample(name, {}, value)
            yield family

    def render(self) -> bytes:
        lines: list[str] = []
        sources: list[Callable[[], Iterable[Metric]]] = [
            self._triton_families,
            self._summary_families,
            self._worker_families,
            self._cpu_families,
            self.registry.collect,
        ]
        sources.extend(c.collect for c in self._extra)
        for source in sources:
            for family in source():
                _render_family(family, lines)
        return ("\n".join(lines) + "\n").encode("utf-8")


def _format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if math.isnan(value):
        return "NaN"  # a summary with no observation in its window
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    """HELP text as the exposition format escapes it: a newline in it cannot start a line."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _render_family(family: Metric, lines: list[str]) -> None:
    samples = [s for s in family.samples if not s.name.endswith("_created")]
    lines.append(f"# HELP {family.name} {_escape_help(family.documentation)}")
    lines.append(f"# TYPE {family.name} {family.type}")
    for sample in samples:
        if sample.labels:
            label_text = ",".join(
                f'{k}="{_escape(str(v))}"' for k, v in sorted(sample.labels.items())
            )
            lines.append(f"{sample.name}{{{label_text}}} {_format_value(sample.value)}")
        else:
            lines.append(f"{sample.name} {_format_value(sample.value)}")
