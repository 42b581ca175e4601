"""server/observability/custom_metrics.py: a model's bad custom metric is refused with a
reason and never reaches /metrics, which stays parseable (issue 28 item 10)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.observability.custom_metrics import CustomMetricLimits, CustomMetrics
from server.observability.metrics import ServerMetrics


def _family(name: str, kind: str = "gauge", description: str = "d", model: str = "m") -> dict:
    return {"action": "family", "family": name, "kind": kind, "description": description,
            "model": model}  # fmt: skip


def _series(family: str, labels: dict | None = None, buckets: list | None = None) -> dict:
    return {"action": "series", "family": family, "labels": labels or {}, "buckets": buckets}


BAD_FAMILIES = [
    (_family("caf\u00e9_total"), "invalid metric family name"),
    (_family("9lives"), "invalid metric family name"),
    (_family("a-b"), "invalid metric family name"),
    (_family("nv_inference_count", "counter"), "reserved"),
    (_family("ascend_inference_batch_size"), "reserved"),
    (_family("ok", description="line\n# TYPE x gauge\nx 1"), "control character"),
    (_family("ok", description="d" * 2000), "--custom-metric-max-text"),
    (_family("ok", kind="summary"), "unknown kind"),
]


@pytest.mark.parametrize("update, words", BAD_FAMILIES)
def test_a_bad_family_is_refused_with_its_reason(update: dict, words: str) -> None:
    metrics = CustomMetrics()
    error = metrics.declare(update)
    assert error is not None and words in error, error
    assert list(metrics.collect()) == []


def test_a_name_taken_with_another_kind_or_clashing_samples_is_refused() -> None:
    metrics = CustomMetrics()
    assert metrics.declare(_family("lat", "histogram", model="a")) is None
    assert metrics.declare(_family("lat", "histogram", model="b")) is None  # shared: fine
    error = metrics.declare(_family("lat", "gauge", model="b"))
    assert error is not None and "already a histogram (declared by model 'a')" in error
    error = metrics.declare(_family("lat_count", "counter", model="b"))
    assert error is not None and "clashes with family 'lat'" in error


BAD_SERIES = [
    ({"bad-key": "v"}, "invalid label key"),
    ({"__name__": "v"}, "invalid label key"),
    ({"k\u00e9": "v"}, "invalid label key"),
    ({"k": "v\x1b[2J"}, "control character"),
    ({"k": "v" * 2000}, "--custom-metric-max-text"),
    ({f"k{i}": "v" for i in range(17)}, "--custom-metric-max-labels"),
]


@pytest.mark.parametrize("labels, words", BAD_SERIES)
def test_a_bad_series_is_refused_with_its_reason(labels: dict, words: str) -> None:
    metrics = CustomMetrics()
    assert metrics.declare(_family("g")) is None
    error = metrics.declare(_series("g", labels))
    assert error is not None and words in error, error
    metrics.apply({"action": "set", "family": "g", "labels": labels, "value": 1})
    assert [m.samples for m in metrics.collect()] == [[]]


def test_histogram_buckets_and_le_are_checked() -> None:
    metrics = CustomMetrics(CustomMetricLimits(max_buckets=2))
    assert metrics.declare(_family("h", "histogram")) is None
    assert "reserved" in str(metrics.declare(_series("h", {"le": "1"}, [1.0])))
    assert "finite" in str(metrics.declare(_series("h", {}, [float("nan")])))
    assert "--custom-metric-max-buckets" in str(metrics.declare(_series("h", {}, [1, 2, 3])))
    assert metrics.declare(_series("h", {}, [1, 2])) is None


def test_the_page_stays_parseable_with_help_text_and_label_values_escaped() -> None:
    server = ServerMetrics()
    custom = CustomMetrics()
    server.add_collector(custom)
    assert custom.declare(_family("good_total", "counter", description='say "hi" \\ bye')) is None
    labels = {"path": 'a"b\\c d'}  # escaped by the format
    assert custom.declare(_series("good_total", labels)) is None
    custom.apply({"action": "increment", "family": "good_total", "labels": labels, "value": 2})
    page = server.render().decode()
    families = {f.name: f for f in text_string_to_metric_families(page)}
    good = families["good"]  # the parser names a counter without its _total
    assert good.documentation == 'say "hi" \\ bye'
    assert [(s.labels, s.value) for s in good.samples] == [(labels, 2.0)]


def test_a_newline_in_any_help_text_is_escaped_on_the_page() -> None:
    """The render's own guarantee, whatever a collector hands it."""
    from prometheus_client.core import GaugeMetricFamily

    class Collector:
        def collect(self) -> list:
            family = GaugeMetricFamily("x", "one\nx_injected 666")
            family.add_metric([], 1)
            return [family]

    server = ServerMetrics()
    server.add_collector(Collector())  # type: ignore[arg-type]
    page = server.render().decode()
    assert "\nx_injected" not in page and "x_injected 666" in page
    names = [s.name for f in text_string_to_metric_families(page) for s in f.samples]
    assert "x_injected" not in names and "x" in names
