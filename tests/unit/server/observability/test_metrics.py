"""Metric names, labels and the text rendering that keeps Triton's bare counter names."""

from __future__ import annotations

import re

from scheduler.stats import AnsweredBatch
from server.observability.metrics import ServerMetrics
from tests.support.answers import one_success


def test_series_appear_at_zero_on_load_and_vanish_on_unload() -> None:
    metrics = ServerMetrics()
    metrics.version_loaded("m", 1, 0.25)
    text = metrics.render().decode()
    assert 'nv_inference_count{model="m",version="1"} 0' in text
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert f'nv_inference_request_failure{{model="m",reason="{reason}",version="1"}} 0' in text
    assert 'nv_model_load_duration_secs{model="m",version="1"} 0.25' in text
    assert "# TYPE nv_inference_count counter" in text
    assert not re.search(r"^nv_inference\w*_total", text, re.M)
    metrics.version_unloaded("m", 1)
    text = metrics.render().decode()
    assert 'model="m"' not in text


def test_counters_histograms_and_pending_move() -> None:
    metrics = ServerMetrics()
    version = metrics.version_loaded("m", 2, 0.0)
    version.pending_changed(+3)
    version.pending_changed(-1)
    version.batch_executed(4)
    version.requests_succeeded(one_success(2_000_000, 500_000, 1000, 2000, 3000))
    version.request_failed("BACKEND", 1_000_000)
    text = metrics.render().decode()
    assert 'nv_inference_pending_request_count{model="m",version="2"} 2' in text
    assert 'nv_inference_exec_count{model="m",version="2"} 1' in text
    assert 'nv_inference_count{model="m",version="2"} 4' in text
    assert 'nv_inference_request_success{model="m",version="2"} 1' in text
    assert 'nv_inference_request_failure{model="m",reason="BACKEND",version="2"} 1' in text
    assert 'nv_inference_request_duration_us{model="m",version="2"} 3000' in text
    assert 'ascend_inference_batch_size_count{model="m",version="2"} 1' in text
    assert 'ascend_inference_batch_size_sum{model="m",version="2"} 4' in text
    assert 'ascend_inference_request_latency_seconds_count{model="m",version="2"} 2' in text


def test_cpu_metrics_are_plain_gauges() -> None:
    text = ServerMetrics().render().decode()
    total = re.search(r"^nv_cpu_memory_total_bytes (\d+)$", text, re.M)
    used = re.search(r"^nv_cpu_memory_used_bytes (\d+)$", text, re.M)
    assert total and used and 0 < int(used.group(1)) < int(total.group(1))
    assert re.search(r"^nv_cpu_utilization [0-9.]+$", text, re.M)


def test_rejections_are_counted_by_reason() -> None:
    metrics = ServerMetrics()
    version = metrics.version_loaded("m", 1, 0.0)
    text = metrics.render().decode()
    assert "# TYPE ascend_inference_rejected_total counter" in text
    for reason in ("queue_full", "queue_timeout"):
        assert (
            f'ascend_inference_rejected_total{{model="m",reason="{reason}",version="1"}} 0' in text
        )
    version.request_rejected("queue_full")
    version.request_rejected("queue_full")
    version.request_rejected("queue_timeout")
    text = metrics.render().decode()
    assert 'ascend_inference_rejected_total{model="m",reason="queue_full",version="1"} 2' in text
    assert 'ascend_inference_rejected_total{model="m",reason="queue_timeout",version="1"} 1' in text
    metrics.version_unloaded("m", 1)
    assert "ascend_inference_rejected_total{" not in metrics.render().decode()


def test_a_batch_of_answers_counts_each_request() -> None:
    from server.observability.metrics import MetricsOptions

    metrics = ServerMetrics(
        options=MetricsOptions(histogram_latencies=True, summary_latencies=True)
    )
    version = metrics.version_loaded("m", 1, 0.0)
    # three requests of one batch: (total, queue) each, the batch's compute durations
    answered = [(2_000_000, 500_000), (3_000_000, 1_000_000), (4_000_000, 0)]
    version.requests_succeeded(
        AnsweredBatch(answered, 9_000_000, 1_500_000, 1000, 2000, 3000, True)
    )
    text = metrics.render().decode()
    assert 'nv_inference_request_success{model="m",version="1"} 3' in text
    assert 'nv_inference_request_duration_us{model="m",version="1"} 9000' in text
    assert 'nv_inference_queue_duration_us{model="m",version="1"} 1500' in text
    assert 'nv_inference_compute_infer_duration_us{model="m",version="1"} 6' in text
    assert 'ascend_inference_request_latency_seconds_count{model="m",version="1"} 3' in text
    assert 'nv_inference_first_response_histogram_ms_count{model="m",version="1"} 3' in text
    assert 'nv_inference_first_response_histogram_ms_sum{model="m",version="1"} 9' in text
