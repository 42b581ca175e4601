"""The Grafana dashboard, the HPA's adapter rule and the alert rules: every PromQL expression
parses, and every metric it names is one a real server exports (scraped from the server the
Ascend image's entrypoint started, with an ONNX model under a gray release and an emulated NPU
model)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.deploy.manifests import CHART, DASHBOARD, chart_manifests, one
from tests.deploy.promql import (
    adapter_expressions,
    alert_expressions,
    dashboard_expressions,
    exposed_names,
    grafana_query,
    metric_names,
)

ADAPTER_RULES = CHART / "prometheus-adapter-values.yaml"
# Series Prometheus itself writes for every scrape target, not the server.
PROMETHEUS_OWN = {"up"}


@pytest.fixture(scope="module")
def exported(entrypoint_server) -> set[str]:
    return exposed_names(httpx.get(entrypoint_server.metrics_url, timeout=10).text)


def all_expressions() -> list[tuple[str, str]]:
    monitoring = chart_manifests(
        {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
    )
    return [
        *dashboard_expressions(DASHBOARD),
        *adapter_expressions(ADAPTER_RULES),
        *alert_expressions(monitoring),
    ]


def test_every_expression_parses():
    expressions = all_expressions()
    sources = [where.split()[0] for where, _ in expressions]
    assert {source: sources.count(source) for source in set(sources)} == {
        "panel": 20,
        "variable": 2,
        "rule": 2,
        "alert": 3,
    }
    failures = []
    for where, expression in expressions:
        try:
            metric_names(expression)
        except ValueError as error:
            failures.append(f"{where}: {error}: {expression}")
    assert failures == []


def test_parser_refuses_what_prometheus_refuses():
    for broken in ("sum(rate(x[5m])", "rate(x)", "histogram_quantil(0.5, x)", "x{a=}"):
        with pytest.raises(ValueError):
            metric_names(broken)


@pytest.mark.slow  # about 10 s: the server started the image's way, and its traffic
def test_every_named_metric_is_exported_by_a_running_server(exported):
    named = {name for _, expression in all_expressions() for name in metric_names(expression)}
    assert named - exported - PROMETHEUS_OWN == set()
    # The scrape really covered the NPU, histogram and gray release series the dashboard reads.
    assert {
        "ascend_npu_memory_used_bytes",
        "ascend_npu_utilization",
        "ascend_inference_batch_size_bucket",
        "ascend_traffic_requests_total",
        "ascend_canary_transitions_total",
        "ascend_shadow_errors_total",
        "ascend_inference_request_latency_seconds_bucket",
    } <= named & exported


def test_dashboard_covers_what_operators_asked_for():
    dashboard = json.loads(DASHBOARD.read_text())
    panels = {p["title"]: p for p in dashboard["panels"] if p["type"] != "row"}
    wanted = {
        "Request rate": "nv_inference_request_success",
        "Latency p50 / p99": "ascend_inference_request_latency_seconds_bucket",
        "Queue and compute time per request": "nv_inference_queue_duration_us",
        "Batch size distribution": "ascend_inference_batch_size_bucket",
        "Pending requests": "nv_inference_pending_request_count",
        "Failures by reason": "nv_inference_request_failure",
        "Per-version split": "nv_inference_request_success",
        "NPU memory used": "ascend_npu_memory_used_bytes",
        "NPU utilisation": "ascend_npu_utilization",
        "Requests by route": "ascend_traffic_requests_total",
        "Canary transitions and shadow errors": "ascend_canary_transitions_total",
    }
    for title, metric in wanted.items():
        expressions = [t["expr"] for t in panels[title]["targets"]]
        assert any(metric in metric_names(e) for e in map(grafana_query, expressions)), title
    split = panels["Per-version split"]["targets"][0]["expr"]
    assert "by (model, version)" in split
    assert "by (model, reason)" in panels["Failures by reason"]["targets"][0]["expr"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels.values())


def test_hpa_metric_is_the_one_the_adapter_rule_serves(exported):
    rule = next(
        expression
        for where, expression in adapter_expressions(ADAPTER_RULES)
        if where.endswith("seriesQuery")
    )
    hpa = one(chart_manifests(), "HorizontalPodAutoscaler")
    served = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric_names(rule) == {served} == {"nv_inference_pending_request_count"}
    assert served in exported
