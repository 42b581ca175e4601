"""OpenTelemetry mode end to end: spans exported over OTLP/HTTP to a receiver the test runs,
with the client's W3C traceparent (HTTP header, gRPC metadata) as their parent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("opentelemetry.proto")

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from harness.serverproc import running_server

pytestmark = pytest.mark.e2e


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list = []
        self.resources: list = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                message = ExportTraceServiceRequest.FromString(body)
                for resource_spans in message.resource_spans:
                    receiver.resources.append(resource_spans.resource)
                    for scope in resource_spans.scope_spans:
                        receiver.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.close()


def _inputs(mod):  # type: ignore[no-untyped-def]
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "INT32"),
        mod.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    return inputs


def test_spans_reach_an_otlp_receiver_under_the_clients_trace(
    example_repository: Path, receiver: Receiver, tmp_path: Path
) -> None:
    args = [
        "--trace-config",
        "mode=opentelemetry",
        "--trace-config",
        "rate=1",
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        f"opentelemetry,url={receiver.url}",
        "--trace-config",
        "opentelemetry,resource=cluster=test-a",
        "--trace-config",
        "opentelemetry,bsp_schedule_delay=100",
        "--frontend-processes",
        "2",
    ]
    http_trace, grpc_trace = "a" * 32, "b" * 32
    with running_server([example_repository], args, log_dir=tmp_path) as server:
        httpclient.InferenceServerClient(server.http_url).infer(
            "simple", _inputs(httpclient), headers={"traceparent": f"00-{http_trace}-{'1' * 16}-01"}
        )
        grpcclient.InferenceServerClient(server.grpc_url).infer(
            "simple", _inputs(grpcclient), headers={"traceparent": f"00-{grpc_trace}-{'2' * 16}-01"}
        )
        deadline = time.monotonic() + 15
        while (
            time.monotonic() < deadline
            and sum(s.name == "InferRequest" for s in receiver.spans) < 2
        ):
            time.sleep(0.1)
    roots = {s.trace_id.hex(): s for s in receiver.spans if s.name == "InferRequest"}
    assert set(roots) >= {http_trace, grpc_trace}
    assert roots[http_trace].parent_span_id.hex() == "1" * 16
    assert roots[grpc_trace].parent_span_id.hex() == "2" * 16
    names = {s.name for s in receiver.spans if s.trace_id.hex() == http_trace}
    assert names == {"InferRequest", "queue", "batch", "compute"}
    batch = next(s for s in receiver.spans if s.name == "batch")
    assert any(a.key == "triton.batch_size" and a.value.int_value >= 1 for a in batch.attributes)
    attributes = {a.key: a.value.string_value for r in receiver.resources for a in r.attributes}
    assert attributes["service.name"] == "ascend-serve" and attributes["cluster"] == "test-a"
