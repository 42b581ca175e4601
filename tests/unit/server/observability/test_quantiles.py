"""server/observability/quantiles.py: a window's quantiles, exact below the reservoir's capacity,
close above it, and forgotten once the window has passed."""

from __future__ import annotations

import math

import numpy as np

from server.observability.quantiles import MAX_AGE_NS, WindowedQuantiles

SLICE = MAX_AGE_NS // 5


def test_exact_nearest_rank_below_capacity() -> None:
    window = WindowedQuantiles(capacity=100, seed=0)
    window.insert([float(v) for v in range(100, 0, -1)], now_ns=SLICE)  # 1..100, unsorted
    assert window.get([0.5, 0.9, 0.99, 0.999], now_ns=SLICE) == [50.0, 90.0, 99.0, 100.0]


def test_estimates_within_a_percent_of_rank_above_capacity() -> None:
    rng = np.random.default_rng(3)
    values = rng.exponential(100.0, 200_000)
    window = WindowedQuantiles(capacity=4096, seed=1)
    for slice_index in range(5):  # spread over the window's five slices
        part = values[slice_index * 40_000 : (slice_index + 1) * 40_000]
        for start in range(0, part.size, 4096):
            window.insert(part[start : start + 4096].tolist(), now_ns=slice_index * SLICE)
    ordered = np.sort(values)
    for quantile, estimate in zip(
        (0.5, 0.9, 0.99), window.get([0.5, 0.9, 0.99], now_ns=4 * SLICE), strict=True
    ):
        rank = np.searchsorted(ordered, estimate) / ordered.size
        assert abs(rank - quantile) < 0.01, (quantile, rank)


def test_memory_is_bounded_by_capacity_per_slice() -> None:
    window = WindowedQuantiles(capacity=64, seed=0)
    for _ in range(50):
        window.insert(list(range(1000)), now_ns=0)
    assert sum(part.kept.size for part in window._slices) == 64


def test_old_slices_leave_the_window() -> None:
    window = WindowedQuantiles(capacity=16, seed=0)
    window.insert([1000.0], now_ns=0)
    window.insert([1.0], now_ns=SLICE)
    assert window.get([0.999], now_ns=4 * SLICE) == [1000.0]  # both within 60 s
    assert window.get([0.999], now_ns=5 * SLICE) == [1.0]  # the first slice aged out
    assert all(math.isnan(v) for v in window.get([0.5], now_ns=20 * SLICE))
