"""--metrics-config's latency families (Triton's summaries, the first-response histogram, the
counters switch), --allow-cpu-metrics, and the per-interval poll."""

from __future__ import annotations

import re

import pytest

from server.cli import settings_from_args
from server.observability.metrics import (
    SUMMARIES,
    SUMMARY_BUFFER,
    MetricsOptions,
    ServerMetrics,
    parse_metrics_config,
)
from server.observability.quantiles import DEFAULT_QUANTILES
from tests.support.answers import one_success


def _summarised(**options: object) -> ServerMetrics:
    return ServerMetrics(options=MetricsOptions(summary_latencies=True, **options))  # type: ignore[arg-type]


def test_summaries_are_off_by_default_and_cost_nothing() -> None:
    metrics = ServerMetrics()
    version = metrics.version_loaded("m", 1, 0.0)
    version.requests_succeeded(one_success(1_000_000, 0, 0, 0, 0))
    assert version.summaries is None
    assert "_summary_us" not in metrics.render().decode()


def test_summaries_have_tritons_names_quantiles_count_and_sum() -> None:
    metrics = _summarised()
    version = metrics.version_loaded("m", 1, 0.0)
    for i in range(1, 101):  # request i: i ms in all, i us queued, 1/2/3 us of compute
        version.requests_succeeded(one_success(i * 1_000_000, i * 1000, 1000, 2000, 3999))
    version.request_failed("BACKEND", 5_000_000)  # failures are not observed (as Triton)
    text = metrics.render().decode()
    for name, _ in SUMMARIES:
        assert f"# TYPE {name} summary" in text
        assert f'{name}_count{{model="m",version="1"}} 100' in text
        for quantile, _error in DEFAULT_QUANTILES:
            assert re.search(
                rf'^{name}{{model="m",quantile="{quantile}",version="1"}} \d+$', text, re.M
            )
    request = "nv_inference_request_summary_us"
    assert f'{request}{{model="m",quantile="0.5",version="1"}} 50000' in text
    assert f'{request}{{model="m",quantile="0.9",version="1"}} 90000' in text
    assert f'{request}{{model="m",quantile="0.999",version="1"}} 100000' in text
    assert f'{request}_sum{{model="m",version="1"}} 5050000' in text
    assert 'nv_inference_queue_summary_us_sum{model="m",version="1"} 5050' in text
    # whole microseconds, as Triton observes them: 3999 ns is 3 us
    assert 'nv_inference_compute_output_summary_us_sum{model="m",version="1"} 300' in text
    metrics.version_unloaded("m", 1)
    assert 'model="m"' not in metrics.render().decode()


def test_custom_quantiles_and_an_empty_window_read_nan() -> None:
    metrics = _summarised(summary_quantiles=((0.25, 0.01), (0.75, 0.01)))
    metrics.version_loaded("m", 1, 0.0)
    text = metrics.render().decode()
    assert 'nv_inference_queue_summary_us{model="m",quantile="0.25",version="1"} NaN' in text
    assert 'quantile="0.5"' not in text
    assert 'nv_inference_queue_summary_us_count{model="m",version="1"} 0' in text


def test_the_request_that_fills_the_buffer_merges_it() -> None:
    metrics = _summarised()
    version = metrics.version_loaded("m", 1, 0.0)
    assert version.summaries is not None
    for _ in range(SUMMARY_BUFFER):
        version.requests_succeeded(one_success(1000, 0, 0, 0, 0))
    assert version.summaries.pending == [] and version.summaries.counts[0] == SUMMARY_BUFFER
    metrics.poll()  # the poller merges what is buffered; nothing left is fine
    assert version.summaries.counts[0] == SUMMARY_BUFFER


def test_counter_latencies_false_drops_the_duration_counters() -> None:
    metrics = ServerMetrics(options=MetricsOptions(counter_latencies=False))
    metrics.version_loaded("m", 1, 0.0)
    text = metrics.render().decode()
    assert "nv_inference_request_duration_us" not in text
    assert "nv_inference_compute_infer_duration_us" not in text
    assert 'nv_inference_request_success{model="m",version="1"} 0' in text


def test_first_response_histogram_in_milliseconds_with_tritons_buckets() -> None:
    assert "first_response" not in ServerMetrics().render().decode()
    metrics = ServerMetrics(options=MetricsOptions(histogram_latencies=True))
    version = metrics.version_loaded("m", 1, 0.0)
    version.first_response(150_999_999)  # 150 ms, whole milliseconds as Triton
    version.first_response(3_000_000_000)
    text = metrics.render().decode()
    name = "nv_inference_first_response_histogram_ms"
    assert f"# TYPE {name} histogram" in text
    assert f'{name}_bucket{{le="100.0",model="m",version="1"}} 0' in text
    assert f'{name}_bucket{{le="500.0",model="m",version="1"}} 1' in text
    assert f'{name}_bucket{{le="5000.0",model="m",version="1"}} 2' in text
    assert f'{name}_sum{{model="m",version="1"}} 3150' in text
    metrics.version_unloaded("m", 1)
    assert f'{name}_count{{model="m"' not in metrics.render().decode()


def test_cpu_metrics_can_be_turned_off() -> None:
    text = ServerMetrics(options=MetricsOptions(cpu_metrics=False)).render().decode()
    assert "nv_cpu_" not in text


def test_the_poller_reads_per_interval_and_stops() -> None:
    metrics = ServerMetrics(options=MetricsOptions(interval_ms=10))
    metrics.start()
    try:
        assert metrics._poller is not None and metrics._poller.is_alive()
        assert re.search(r"^nv_cpu_memory_total_bytes [1-9]\d*$", metrics.render().decode(), re.M)
    finally:
        metrics.stop()
    metrics._poller.join(timeout=5)
    assert not metrics._poller.is_alive()


def test_metrics_config_parsing() -> None:
    assert parse_metrics_config(
        ["summary_latencies=true", "summary_quantiles=0.5:0.05,0.9:0.01", "counter_latencies=false"]
    ) == {
        "summary_latencies": True,
        "summary_quantiles": ((0.5, 0.05), (0.9, 0.01)),
        "counter_latencies": False,
    }


@pytest.mark.parametrize(
    "spec, text",
    [
        ("summary_latencies", "format is <setting>=<value>. Got summary_latencies"),
        ("gpu,summary_latencies=true", "format is <setting>=<value>"),
        ("summary_latency=true", "unknown setting 'summary_latency'"),
        ("summary_latencies=yes", "summary_latencies must be true or false"),
        ("summary_quantiles=0.5", "invalid summary_quantiles pair [0.5]"),
        ("summary_quantiles=1.0:0.01", "invalid summary_quantiles pair [1.0:0.01]"),
        ("summary_quantiles=0.9:0", "invalid summary_quantiles pair [0.9:0]"),
    ],
)
def test_metrics_config_refusals(spec: str, text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(text)):
        parse_metrics_config([spec])


def test_flags_reach_the_settings() -> None:
    settings = settings_from_args(
        [
            "--model-repository",
            "/tmp",
            "--metrics-config",
            "summary_latencies=true",
            "--metrics-config",
            "histogram_latencies=true",
            "--metrics-config",
            "summary_quantiles=0.9:0.01",
            "--allow-cpu-metrics=false",
            "--metrics-interval-ms",
            "500",
            "--metrics-summary-samples",
            "128",
        ]
    )
    assert settings.metrics_summary_latencies and settings.metrics_histogram_latencies
    assert settings.metrics_counter_latencies
    assert settings.metrics_summary_quantiles == ((0.9, 0.01),)
    assert not settings.allow_cpu_metrics
    assert settings.metrics_interval_ms == 500 and settings.metrics_summary_samples == 128
    defaults = settings_from_args(["--model-repository", "/tmp"])
    assert defaults.allow_cpu_metrics and not defaults.metrics_summary_latencies
    assert defaults.metrics_summary_quantiles == DEFAULT_QUANTILES
    assert not settings_from_args(
        ["--model-repository", "/tmp", "--allow-metrics=false"]
    ).allow_cpu_metrics  # Triton: ignored unless --allow-metrics
