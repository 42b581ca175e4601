"""Triton's optional latency metrics against a real server: `--metrics-config
summary_latencies=true` (nv_inference_*_summary_us with the configured quantiles, _count and
_sum), `histogram_latencies=true` (nv_inference_first_response_histogram_ms, a decoupled model's
first answer only), `--allow-cpu-metrics=false` and `--metrics-interval-ms`."""

from __future__ import annotations

import queue
import re
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from harness.serverproc import ServerProcess, running_server
from tests.support.streamingmodels import build_streaming_repository

pytestmark = pytest.mark.e2e

REQUESTS = 6  # per protocol


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = build_streaming_repository(tmp_path_factory.mktemp("latency"))
    args = [
        "--metrics-config",
        "summary_latencies=true",
        "--metrics-config",
        "histogram_latencies=true",
        "--metrics-config",
        "summary_quantiles=0.5:0.05,0.99:0.001",
        "--allow-cpu-metrics=false",
        "--metrics-interval-ms",
        "100",
    ]
    with running_server([repo], args, log_dir=tmp_path_factory.mktemp("logs")) as process:
        yield process


def _value(text: str, sample: str) -> float:
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    assert found, f"{sample} not in the scrape"
    return float(found.group(1))


def _simple(mod: object) -> list:
    inputs = [mod.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    return inputs


def test_summaries_and_first_response_histogram_over_http_and_grpc(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for _ in range(REQUESTS):
        http.infer("simple", _simple(httpclient))
        grpc.infer("simple", _simple(grpcclient))
    # A decoupled model: two answers 150 ms apart, so its first comes after >= 150 ms.
    stream = httpx.post(
        f"{server.base}/v2/models/chatty/generate_stream",
        json={"COUNT": 2, "delay_ms": 150},
        timeout=30,
    )
    assert stream.status_code == 200 and stream.text.count("data: ") == 2
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(lambda result, error: answers.put((result, error)))
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([2], np.int32))
    grpc.async_stream_infer("chatty", [count], parameters={"delay_ms": 150})
    assert answers.get(timeout=30)[1] is None and answers.get(timeout=30)[1] is None
    grpc.stop_stream()
    grpc.close()

    text = httpx.get(server.metrics_url, timeout=10).text
    simple = 'model="simple",version="1"'
    for name in (
        "nv_inference_request_summary_us",
        "nv_inference_queue_summary_us",
        "nv_inference_compute_input_summary_us",
        "nv_inference_compute_infer_summary_us",
        "nv_inference_compute_output_summary_us",
    ):
        assert f"# TYPE {name} summary" in text
        assert _value(text, f"{name}_count{{{simple}}}") == 2 * REQUESTS
        low = _value(text, f'{name}{{model="simple",quantile="0.5",version="1"}}')
        high = _value(text, f'{name}{{model="simple",quantile="0.99",version="1"}}')
        assert 0 <= low <= high
        assert f'{name}{{model="simple",quantile="0.9",version="1"}}' not in text  # not asked
    request_sum = _value(text, f"nv_inference_request_summary_us_sum{{{simple}}}")
    request_counter = _value(text, f"nv_inference_request_duration_us{{{simple}}}")
    assert request_sum > 0 and abs(request_sum - request_counter) <= 2 * REQUESTS  # whole us
    assert _value(text, f"nv_inference_request_success{{{simple}}}") == 2 * REQUESTS

    first = "nv_inference_first_response_histogram_ms"
    assert f"# TYPE {first} histogram" in text
    assert _value(text, f"{first}_count{{{simple}}}") == 2 * REQUESTS
    chatty = 'model="chatty",version="1"'
    assert _value(text, f"{first}_count{{{chatty}}}") == 2  # one per request, not per answer
    assert _value(text, f'{first}_bucket{{le="100.0",{chatty}}}') == 0
    assert _value(text, f'{first}_bucket{{le="+Inf",{chatty}}}') == 2
    assert _value(text, f"{first}_sum{{{chatty}}}") >= 300
    assert "nv_cpu_utilization" not in text and "nv_cpu_memory" not in text
    assert "ascend_inference_request_latency_seconds_count" in text  # ours stay


def test_no_request_was_a_bug(server: ServerProcess) -> None:
    assert "Traceback" not in server.log()
