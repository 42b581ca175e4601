"""Python models' own metrics (pb_utils.MetricFamily), served on :8002 beside Triton's.

A model declares a family and changes its series in its worker; each change arrives here as a
small update (backends/python/worker/bridge.py -> backends/python/streams.py -> the infer path's
loop) and is applied on the event loop, so no lock is needed. Families and series live as long as
the server (a model reloaded keeps counting where it was, as its instances all report into one
family). The number of families and of series per family is bounded by named limits; updates past
them are dropped and logged once.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import Metric

log = logging.getLogger(__name__)

MAX_CUSTOM_FAMILIES = 100
MAX_SERIES_PER_FAMILY = 1000


@dataclass
class _Series:
    labels: dict[str, str]
    value: float = 0.0
    buckets: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)  # per bucket, then +Inf
    total: float = 0.0
    observations: int = 0


@dataclass
class _Family:
    name: str
    description: str
    kind: str
    series: dict[tuple, _Series] = field(default_factory=dict)


class CustomMetrics:
    """A prometheus Collector (`collect`) fed by `apply` on the loop."""

    def __init__(
        self, max_families: int = MAX_CUSTOM_FAMILIES, max_series: int = MAX_SERIES_PER_FAMILY
    ) -> None:
        self.max_families = max_families
        self.max_series = max_series
        self._families: dict[str, _Family] = {}
        self._warned: set[str] = set()

    def apply(self, update: dict) -> None:
        name = str(update.get("family", ""))
        if update.get("action") == "family":
            if name not in self._families:
                if len(self._families) >= self.max_families:
                    self._warn(name, f"more than {self.max_families} custom metric families")
                    return
                self._families[name] = _Family(
                    name, str(update.get("description", "")), str(update.get("kind", "gauge"))
                )
            return
        family = self._families.get(name)
        if family is None:
            return
        labels = {str(k): str(v) for k, v in (update.get("labels") or {}).items()}
        key = tuple(sorted(labels.items()))
        series = family.series.get(key)
        if series is None:
            if len(family.series) >= self.max_series:
                self._warn(name, f"more than {self.max_series} series")
                return
            buckets = [float(b) for b in update.get("buckets") or ()]
            series = family.series[key] = _Series(
                labels, buckets=buckets, counts=[0] * (len(buckets) + 1)
            )
        value = float(update.get("value", 0.0))
        action = update.get("action")
        if action == "increment":
            series.value += value
        elif action == "set":
            series.value = value
        elif action == "observe":
            series.counts[bisect_left(series.buckets, value)] += 1
            series.total += value
            series.observations += 1

    def _warn(self, name: str, what: str) -> None:
        if name not in self._warned:
            self._warned.add(name)
            log.warning("custom metric '%s' dropped: %s", name, what)

    def collect(self) -> Iterable[Metric]:
        for family in list(self._families.values()):
            metric = Metric(family.name, family.description, family.kind)
            for series in family.series.values():
                if family.kind != "histogram":
                    metric.add_sample(family.name, series.labels, series.value)
                    continue
                running = 0
                for bound, count in zip(
                    series.buckets + [float("inf")], series.counts, strict=False
                ):
                    running += count
                    le = "+Inf" if bound == float("inf") else repr(bound)
                    metric.add_sample(f"{family.name}_bucket", {**series.labels, "le": le}, running)
                metric.add_sample(f"{family.name}_count", series.labels, series.observations)
                metric.add_sample(f"{family.name}_sum", series.labels, series.total)
            yield metric
