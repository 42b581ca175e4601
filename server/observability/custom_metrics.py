"""Python models' own metrics (pb_utils.MetricFamily), served on :8002 beside Triton's.

A model declares a family (`MetricFamily(...)`) and each of its series (`family.Metric(labels)`)
and waits for the answer: `declare` checks it here, so a bad one is refused for that model (its
call raises TritonModelException with the reason, and the server logs a warning) and never
reaches the page, where one bad name, label or help line used to make /metrics unparseable for
every scraper. What is checked, each with its named bound (--custom-metric-max-*):

- names match `[a-zA-Z_:][a-zA-Z0-9_:]*` (ASCII) and leave the server's own prefixes (`nv_`,
  `ascend_`) alone; a name already declared with another kind, or clashing with another
  family's samples (a histogram's `_bucket`, `_count`, `_sum`), is refused;
- descriptions and label values hold no control character and are at most max_text long;
- label keys match `[a-zA-Z_][a-zA-Z0-9_]*`, do not start with `__`, a histogram's are not `le`;
- families in all, series per family, labels per series and buckets per histogram are bounded.

Values then arrive as small updates (backends/python/worker/bridge.py ->
backends/python/streams.py -> the infer path's loop) for declared series only. Families and
series live as long as the server (a model reloaded keeps counting where it was, as its
instances all report into one family). Declarations come on a worker's reading thread and
values on the loop, so one lock guards the families.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from protocol.text import has_controls, shown

log = logging.getLogger(__name__)

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
RESERVED_PREFIXES = ("nv_", "ascend_")  # the server's own families
KINDS = ("counter", "gauge", "histogram")


@dataclass(frozen=True)
class CustomMetricLimits:
    """--custom-metric-max-families, -series, -labels, -buckets, -text."""

    max_families: int = 100
    max_series: int = 1000  # per family
    max_labels: int = 16  # per series
    max_buckets: int = 64  # per histogram series
    max_text: int = 1024  # characters of a name, description or label value


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
    model: str  # the model that declared it first
    series: dict[tuple, _Series] = field(default_factory=dict)


def _snapshot(series: _Series) -> tuple:
    """A series' values, copied under the lock (the loop may change them while a scrape runs)."""
    return (
        series.labels,
        series.value,
        list(series.buckets),
        list(series.counts),
        series.total,
        series.observations,
    )


def _sample_names(name: str, kind: str) -> set[str]:
    if kind == "histogram":
        return {name, f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    return {name}


class CustomMetrics:
    """A prometheus Collector (`collect`), fed by `declare` (any thread) and `apply` (the loop)."""

    def __init__(self, limits: CustomMetricLimits | None = None) -> None:
        self.limits = limits or CustomMetricLimits()
        self._families: dict[str, _Family] = {}
        self._samples: dict[str, str] = {}  # sample name -> the family it belongs to
        self._lock = threading.Lock()

    # ----- declarations ---------------------------------------------------------------------

    def declare(self, update: dict) -> str | None:
        """A family (`action` "family") or a series ("series") a model declares: None when it
        is accepted (again: declaring what exists is fine), else why not, for the model's
        TritonModelException; a refusal is logged as a warning."""
        with self._lock:
            if update.get("action") == "family":
                error = self._declare_family(update)
            else:
                error = self._declare_series(update)
        if error is not None:
            log.warning(
                "python model '%s': custom metric refused: %s",
                shown(update.get("model", "")),
                error,
            )
        return error

    def _text(self, what: str, value: object) -> str | None:
        if not isinstance(value, str):
            return f"{what} must be a string"
        if len(value) > self.limits.max_text:
            return (
                f"{what} is {len(value)} characters long, over the limit of "
                f"{self.limits.max_text} (--custom-metric-max-text)"
            )
        if has_controls(value):
            return f"{what} '{shown(value)}' holds a control character"
        return None

    def _declare_family(self, update: dict) -> str | None:
        name = update.get("family")
        kind = update.get("kind")
        error = self._text("a metric family's name", name)
        if error is not None:
            return error
        assert isinstance(name, str)
        if not NAME.match(name):
            return (
                f"invalid metric family name '{shown(name)}': it must match "
                "[a-zA-Z_:][a-zA-Z0-9_:]*"
            )
        if name.startswith(RESERVED_PREFIXES):
            return (
                f"metric family name '{name}' is reserved: names starting with "
                f"{' or '.join(RESERVED_PREFIXES)} are the server's own"
            )
        if kind not in KINDS:
            return f"metric family '{name}': unknown kind {shown(kind)}"
        assert isinstance(kind, str)
        error = self._text(f"the description of metric family '{name}'", update.get("description"))
        if error is not None:
            return error
        existing = self._families.get(name)
        if existing is not None:
            if existing.kind != kind:
                return (
                    f"metric family '{name}' is already a {existing.kind} (declared by model "
                    f"'{shown(existing.model)}'), not a {kind}"
                )
            return None
        for sample in _sample_names(name, kind):
            owner = self._samples.get(sample)
            if owner is not None:
                return (
                    f"metric family '{name}' clashes with family '{owner}' (both would "
                    f"write '{sample}')"
                )
        if len(self._families) >= self.limits.max_families:
            return (
                f"more than {self.limits.max_families} custom metric families "
                "(--custom-metric-max-families)"
            )
        self._families[name] = _Family(
            name, str(update["description"]), kind, str(update.get("model", ""))
        )
        for sample in _sample_names(name, kind):
            self._samples[sample] = name
        return None

    def _declare_series(self, update: dict) -> str | None:
        name = str(update.get("family", ""))
        family = self._families.get(name)
        if family is None:
            return f"metric family '{shown(name)}' was not declared"
        labels = update.get("labels") or {}
        if not isinstance(labels, dict):
            return "labels must be a dict of strings"
        if len(labels) > self.limits.max_labels:
            return (
                f"{len(labels)} labels, over the limit of {self.limits.max_labels} "
                "(--custom-metric-max-labels)"
            )
        for key, value in labels.items():
            error = self._text("a label key", key) or self._text(
                f"the value of label '{shown(key)}'", value
            )
            if error is not None:
                return error
            if not LABEL.match(key) or key.startswith("__"):
                return (
                    f"invalid label key '{shown(key)}': it must match [a-zA-Z_][a-zA-Z0-9_]* "
                    "and not start with __"
                )
            if key == "le" and family.kind == "histogram":
                return "label key 'le' is reserved for a histogram's buckets"
        buckets: list[float] = []
        if family.kind == "histogram":
            try:
                buckets = sorted({float(b) for b in update.get("buckets") or ()})
            except (TypeError, ValueError):
                return "buckets must be numbers"
            if not buckets or not all(math.isfinite(b) for b in buckets):
                return "a histogram's buckets must be finite numbers, at least one"
            if len(buckets) > self.limits.max_buckets:
                return (
                    f"{len(buckets)} buckets, over the limit of {self.limits.max_buckets} "
                    "(--custom-metric-max-buckets)"
                )
        key = tuple(sorted(labels.items()))
        if key in family.series:
            return None
        if len(family.series) >= self.limits.max_series:
            return (
                f"metric family '{name}' has {self.limits.max_series} series already "
                "(--custom-metric-max-series)"
            )
        family.series[key] = _Series(dict(labels), buckets=buckets, counts=[0] * (len(buckets) + 1))
        return None

    # ----- values (on the loop) -------------------------------------------------------------

    def apply(self, update: dict) -> None:
        """A declared series' new value; anything else (a refused series) is dropped."""
        with self._lock:
            family = self._families.get(str(update.get("family", "")))
            if family is None:
                return
            try:
                value = float(update.get("value", 0.0))
                series = family.series.get(tuple(sorted((update.get("labels") or {}).items())))
            except (TypeError, ValueError, AttributeError):
                return
            if series is None:
                return
            action = update.get("action")
            if action == "increment":
                series.value += value
            elif action == "set":
                series.value = value
            elif action == "observe" and series.counts:
                series.counts[bisect_left(series.buckets, value)] += 1
                series.total += value
                series.observations += 1

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            families = [
                (family, [_snapshot(s) for s in family.series.values()])
                for family in self._families.values()
            ]
        for family, series in families:
            metric = Metric(family.name, family.description, family.kind)
            for labels, value, bounds, counts, total, observations in series:
                if family.kind != "histogram":
                    metric.add_sample(family.name, labels, value)
                    continue
                running = 0
                for bound, count in zip(bounds + [float("inf")], counts, strict=False):
                    running += count
                    le = "+Inf" if bound == float("inf") else repr(bound)
                    metric.add_sample(f"{family.name}_bucket", {**labels, "le": le}, running)
                metric.add_sample(f"{family.name}_count", labels, observations)
                metric.add_sample(f"{family.name}_sum", labels, total)
            yield metric
