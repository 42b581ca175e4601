"""Quantiles over a sliding time window, for Triton's `nv_inference_*_summary_us` summaries.

Why a module of its own: prometheus_client's Summary exports only a count and a sum, while
Triton's summaries carry quantiles. Triton uses prometheus-cpp's Summary: a window of max_age
(60 s) in `age_buckets` (5) slices. The window is the same here; within each slice a uniform
reservoir (Vitter's algorithm R) keeps at most `capacity` observations, so memory is bounded
by capacity x age_buckets values whatever the request rate, and a quantile is the weighted
quantile of the slices' reservoirs. Below capacity observations per slice the quantiles are
exact; above it they are estimates whose rank error shrinks as the capacity grows (about
sqrt(q(1-q) / window samples)), where prometheus-cpp's CKMS sketch bounds the error per
quantile instead: a CKMS in pure Python costs about 100 us per observation at Triton's error
targets, which the request path cannot pay.

Cost: `insert` takes a batch (callers buffer observations and hand them over off the request
path) and places it with numpy; `get` sorts at most capacity x age_buckets values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# Triton's default (quantile, error) pairs (metric_model_reporter.h); the errors are
# accepted for Triton's syntax and recorded, the reservoir's capacity sets the accuracy.
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.001),
)
MAX_AGE_NS = 60 * 1_000_000_000  # prometheus-cpp's Summary defaults, which Triton keeps
AGE_BUCKETS = 5
DEFAULT_CAPACITY = 4096  # observations kept per slice (--metrics-summary-samples)


class _Slice:
    """One age slice: its epoch, how many observations it saw, and its reservoir."""

    __slots__ = ("epoch", "seen", "kept")

    def __init__(self) -> None:
        self.epoch = -1
        self.seen = 0
        self.kept = np.empty(0, dtype=np.float64)


class WindowedQuantiles:
    """The observations of the last max_age, a bounded reservoir per slice."""

    __slots__ = ("_slices", "_interval", "_capacity", "_random")

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        max_age_ns: int = MAX_AGE_NS,
        age_buckets: int = AGE_BUCKETS,
        seed: int | None = None,
    ) -> None:
        self._slices = [_Slice() for _ in range(age_buckets)]
        self._interval = max(1, max_age_ns // age_buckets)
        self._capacity = capacity
        self._random = np.random.default_rng(seed)

    def insert(self, values: Sequence[float], now_ns: int) -> None:
        """A batch observed now (algorithm R, vectorised: the same result as one by one)."""
        if not len(values):
            return
        epoch = now_ns // self._interval
        part = self._slices[epoch % len(self._slices)]
        if part.epoch != epoch:
            part.epoch, part.seen, part.kept = epoch, 0, np.empty(0, dtype=np.float64)
        batch = np.asarray(values, dtype=np.float64)
        room = self._capacity - part.kept.size
        if room > 0:  # fill first: every observation kept
            part.kept = np.concatenate((part.kept, batch[:room]))
            part.seen += min(room, batch.size)
            batch = batch[room:]
        if batch.size:
            # The t-th observation (t > capacity) replaces slot j, uniform in [0, t), if j is
            # a slot; numpy's assignment keeps the last of repeated slots, as the loop would.
            ranks = part.seen + 1 + np.arange(batch.size)
            slots = (self._random.random(batch.size) * ranks).astype(np.int64)
            hit = slots < self._capacity
            part.kept[slots[hit]] = batch[hit]
            part.seen += batch.size

    def get(self, quantiles: Sequence[float], now_ns: int) -> list[float]:
        """Each quantile of the window; NaN with no observation in it (as prometheus-cpp)."""
        epoch = now_ns // self._interval
        live = [
            p
            for p in self._slices
            if p.seen and epoch - len(self._slices) < p.epoch <= epoch and p.kept.size
        ]
        if not live:
            return [math.nan for _ in quantiles]
        values = np.concatenate([p.kept for p in live])
        weights = np.concatenate([np.full(p.kept.size, p.seen / p.kept.size) for p in live])
        order = np.argsort(values, kind="stable")
        values, cumulative = values[order], np.cumsum(weights[order])
        total = cumulative[-1]
        answers = []
        for quantile in quantiles:
            # The smallest value with at least quantile x total of the weight at or below it.
            index = int(np.searchsorted(cumulative, quantile * total, side="left"))
            answers.append(float(values[min(index, values.size - 1)]))
        return answers
