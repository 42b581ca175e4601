"""server/observability/otel.py with an in-memory span exporter: the spans of a sampled request,
their times, the batch size, and the client's traceparent as their parent."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from protocol.types import InferRequest, InferResponse, Tensor
from server.observability.otel import OtelTracer, build_provider
from server.observability.runtime_settings import TraceSettings

PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


def _tracer(**settings: list[str]) -> tuple[OtelTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = build_provider({"resource": {"deployment": "test"}}, SimpleSpanProcessor(exporter))
    trace_settings = TraceSettings(
        {
            "trace_mode": ["opentelemetry"],
            "trace_rate": ["1"],
            "trace_level": ["TIMESTAMPS"],
            **settings,
        }
    )
    return OtelTracer(trace_settings, provider), exporter


def _request(traceparent: str = "") -> InferRequest:
    return InferRequest(
        "simple",
        id="r1",
        traceparent=traceparent,
        inputs=[Tensor("INPUT0", "INT32", (1,), np.zeros(1, np.int32))],
    )


def test_spans_of_a_sampled_request_under_the_clients_traceparent() -> None:
    tracer, exporter = _tracer()
    request = _request(f"00-{PARENT_TRACE}-{PARENT_SPAN}-01")
    trace = tracer.sample(request)
    assert trace is not None and request.trace is trace
    start = trace.stamps[0][1]
    trace.computed(start + 1_000, 200, 3_000, 100, batch_size=4)
    tracer.finish(trace, InferResponse("simple", "1"), "1")
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert set(spans) == {"InferRequest", "queue", "batch", "compute"}
    root = spans["InferRequest"]
    assert format(root.context.trace_id, "032x") == PARENT_TRACE
    assert format(root.parent.span_id, "016x") == PARENT_SPAN
    assert root.attributes["triton.model_name"] == "simple"
    assert root.attributes["triton.request_id"] == "r1"
    assert root.resource.attributes["deployment"] == "test"
    assert spans["queue"].parent.span_id == root.context.span_id
    assert spans["batch"].attributes["triton.batch_size"] == 4
    assert spans["compute"].parent.span_id == spans["batch"].context.span_id
    assert spans["compute"].end_time - spans["compute"].start_time == 3_000
    assert spans["batch"].end_time - spans["batch"].start_time == 3_300
    assert spans["queue"].end_time == spans["batch"].start_time


def test_without_traceparent_a_new_trace_and_sampling_by_rate() -> None:
    tracer, exporter = _tracer(trace_rate=["2"])
    assert tracer.sample(_request()) is None  # the first of every two is not traced
    trace = tracer.sample(_request())
    assert trace is not None
    tracer.finish(trace, None, "")  # failed before it ran: the request span alone
    (span,) = exporter.get_finished_spans()
    assert span.name == "InferRequest" and span.parent is None
    assert span.attributes["error"] is True


def test_an_ensembles_steps_are_children_of_its_span() -> None:
    tracer, exporter = _tracer()
    ensemble = _request(f"00-{PARENT_TRACE}-{PARENT_SPAN}-01")
    trace = tracer.sample(ensemble)
    step_request = InferRequest("preprocess", inputs=ensemble.inputs)
    step = trace.child(step_request)
    assert step_request.trace is step and step.parent_id == trace.id
    step.end(InferResponse("preprocess", "1"))
    tracer.finish(trace, InferResponse("simple", "1"), "1")
    spans = exporter.get_finished_spans()
    roots = {
        span.attributes["triton.model_name"]: span for span in spans if span.name == "InferRequest"
    }
    assert roots["preprocess"].parent.span_id == roots["simple"].context.span_id
    assert format(roots["preprocess"].context.trace_id, "032x") == PARENT_TRACE
