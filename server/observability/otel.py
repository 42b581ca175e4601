"""Request tracing in OpenTelemetry mode (`--trace-config mode=opentelemetry`): sampled requests
become spans, exported over OTLP/HTTP by the OpenTelemetry SDK's batch span processor.

Why the inner spans are built when the request ends: the timestamps come from several layers
(the core, the scheduler's batch, on the loop), so the record collects them as in Triton mode
(server/observability/tracing.py) and turns them into spans with explicit start and end times once
the answer is in: `InferRequest` (the whole request, opened when it is sampled, child of the
client's W3C `traceparent` when it sent one), and under it `queue` (waiting for a batch) and `batch`
(the execution of the batch the request ran in, with its `batch_size`), which holds `compute` (the
model's own run); an ensemble's steps are `InferRequest` spans under the ensemble's. The SDK is
imported only in this mode: it is an optional extra (`pip install -e '.[otel]'` in the checkout).
"""

from __future__ import annotations

import time
from typing import Any

from protocol.types import InferRequest, InferResponse
from server.observability.runtime_settings import TraceSettings
from server.observability.tracing import Trace, Tracer

DEFAULT_URL = "http://localhost:4318/v1/traces"
SERVICE_NAME = "ascend-serve"
# --trace-config opentelemetry,<key>=<value> settings of the batch span processor, as Triton
# names them, and the SDK's argument each sets.
BSP_SETTINGS = {
    "bsp_max_queue_size": "max_queue_size",
    "bsp_schedule_delay": "schedule_delay_millis",
    "bsp_max_export_batch_size": "max_export_batch_size",
}


def build_provider(config: dict[str, Any], processor: Any = None) -> Any:
    """A TracerProvider from the `opentelemetry,...` settings; `processor` replaces the OTLP
    batch processor (tests hand in an in-memory exporter's)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    attributes = {"service.name": SERVICE_NAME, **config.get("resource", {})}
    provider = TracerProvider(resource=Resource.create(attributes))
    if processor is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        options: dict[str, Any] = {
            BSP_SETTINGS[k]: int(v) for k, v in config.items() if k in BSP_SETTINGS
        }
        processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=config.get("url", DEFAULT_URL)), **options
        )
    provider.add_span_processor(processor)
    return provider


class OtelTrace(Trace):
    """A Triton-mode record that also holds its open `InferRequest` span and batch size."""

    __slots__ = ("parent", "batch_size", "span", "shift")

    def __init__(
        self,
        ident: int,
        request: InferRequest,
        settings: dict[str, list[str]],
        tracer: Tracer | None = None,
        parent_id: int = 0,
    ) -> None:
        super().__init__(ident, request, settings, tracer, parent_id)
        self.parent = request.traceparent
        self.batch_size = 0
        self.span: Any = None
        self.shift = time.time_ns() - time.monotonic_ns()  # monotonic stamps -> epoch

    def computed(
        self, start_ns: int, input_ns: int, infer_ns: int, output_ns: int, batch_size: int = 0
    ) -> None:
        super().computed(start_ns, input_ns, infer_ns, output_ns, batch_size)
        self.batch_size = batch_size


class OtelTracer(Tracer):
    """Samples as Triton mode does (no trace file needed) and exports spans. The request span
    opens when the request is sampled, so an ensemble's steps become its children (and an
    ensemble request's own span holds them rather than a batch)."""

    record_type = OtelTrace

    def __init__(self, settings: TraceSettings, provider: Any) -> None:
        super().__init__(settings)
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("ascend-serve")
        self.propagator = TraceContextTextMapPropagator()

    def wants(self, settings: dict[str, list[str]]) -> bool:
        return settings["trace_level"] != ["OFF"]

    def started(self, trace: Trace, parent: Trace | None) -> None:
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, set_span_in_context

        assert isinstance(trace, OtelTrace)
        context: Context | None
        if isinstance(parent, OtelTrace) and parent.span is not None:
            context = set_span_in_context(parent.span)
        else:
            context = (
                self.propagator.extract({"traceparent": trace.parent}) if trace.parent else None
            )
        start = dict(trace.stamps)["REQUEST_START"] + trace.shift
        trace.span = self.tracer.start_span(
            "InferRequest",
            context=context,
            kind=SpanKind.SERVER,
            start_time=start,
            attributes={
                "triton.model_name": trace.model,
                "triton.trace_id": trace.id,
                "triton.request_id": trace.request_id,
            },
        )

    def finish(self, trace: Trace, response: InferResponse | None, version: str) -> None:
        from opentelemetry.trace import set_span_in_context

        assert isinstance(trace, OtelTrace)
        trace.finished = True
        trace.stamp("REQUEST_END")
        stamps = {name: ns + trace.shift for name, ns in trace.stamps}
        root = trace.span
        root.set_attribute("triton.model_version", version)
        inside = set_span_in_context(root)
        if "COMPUTE_START" in stamps:
            self.tracer.start_span("queue", context=inside, start_time=stamps["QUEUE_START"]).end(
                end_time=stamps["COMPUTE_START"]
            )
            batch = self.tracer.start_span(
                "batch",
                context=inside,
                start_time=stamps["COMPUTE_START"],
                attributes={"triton.batch_size": trace.batch_size},
            )
            compute = self.tracer.start_span(
                "compute",
                context=set_span_in_context(batch),
                start_time=stamps["COMPUTE_INPUT_END"],
            )
            compute.end(end_time=stamps["COMPUTE_OUTPUT_START"])
            batch.end(end_time=stamps["COMPUTE_END"])
        if response is None:
            root.set_attribute("error", True)
        root.end(end_time=stamps["REQUEST_END"])

    def flush(self) -> None:
        self.provider.force_flush()
        self.provider.shutdown()
