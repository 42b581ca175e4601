"""Limits, metrics and graceful shutdown against dedicated server subprocesses."""

from __future__ import annotations

import concurrent.futures
import gzip
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from examples.build_repository import build_simple
from harness.serverproc import running_server, start_server

pytestmark = pytest.mark.e2e

SLOW_QUEUE = """
name: "slow_queue"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { preferred_batch_size: [ 64 ] max_queue_delay_microseconds: 1500000 }
"""


def _body(offset: int = 0) -> dict:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "INT32",
                "data": [offset + i for i in range(16)],
            },
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ]
    }


@pytest.fixture(scope="module")
def small_repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    build_simple(root)
    slow = build_simple(root, name="slow_queue")
    (slow / "config.pbtxt").write_text(SLOW_QUEUE)
    return root


def test_body_limits(small_repository: Path, tmp_path: Path) -> None:
    with running_server(
        [small_repository], ["--http-max-input-size", "4096"], log_dir=tmp_path
    ) as server:
        with httpx.Client(base_url=server.base, timeout=30) as http:
            big = b'{"inputs": [' + b" " * 5000 + b"]}"
            reply = http.post("/v2/models/simple/infer", content=big)
            assert reply.status_code == 413
            assert "exceeds the maximum allowed input size of 4096 bytes" in reply.json()["error"]

            def chunks():
                for _ in range(10):
                    yield b" " * 1000

            reply = http.post("/v2/models/simple/infer", content=chunks())
            assert reply.status_code == 413
            bomb = gzip.compress(b'{"inputs": [' + b" " * 1_000_000 + b"]}")
            assert len(bomb) < 4096
            reply = http.post(
                "/v2/models/simple/infer", content=bomb, headers={"Content-Encoding": "gzip"}
            )
            assert reply.status_code == 413
            assert http.post("/v2/models/simple/infer", json=_body()).status_code == 200
            assert http.get("/v2/health/live").status_code == 200


def _metric(text: str, name: str, **labels: str) -> float:
    label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{name}\{{{re.escape(label_text)}\}} ([0-9.e+]+)$", text, re.M)
    assert match, f"{name}{{{label_text}}} not in metrics"
    return float(match.group(1))


def test_metrics_move_by_exactly_the_requests_made(small_repository: Path, tmp_path: Path) -> None:
    with running_server([small_repository], log_dir=tmp_path) as server:
        with httpx.Client(base_url=server.base, timeout=30) as http:
            before = httpx.get(server.metrics_url).text
            labels = {"model": "simple", "version": "1"}
            assert _metric(before, "nv_inference_request_success", **labels) == 0
            assert _metric(before, "nv_inference_exec_count", **labels) == 0
            for i in range(5):
                assert http.post("/v2/models/simple/infer", json=_body(i)).status_code == 200
            batch = {
                "inputs": [
                    {"name": "INPUT0", "shape": [3, 16], "datatype": "INT32", "data": [1] * 48},
                    {"name": "INPUT1", "shape": [3, 16], "datatype": "INT32", "data": [1] * 48},
                ]
            }
            assert http.post("/v2/models/simple/infer", json=batch).status_code == 200
            bad = _body()
            bad["inputs"][0]["datatype"] = "FP32"
            for _ in range(3):
                assert http.post("/v2/models/simple/infer", json=bad).status_code == 400
            after = httpx.get(server.metrics_url)
            assert after.headers["content-type"].startswith("text/plain")
            text = after.text
            assert _metric(text, "nv_inference_request_success", **labels) == 6
            assert _metric(text, "nv_inference_request_failure", reason="OTHER", **labels) == 3
            assert _metric(text, "nv_inference_request_failure", reason="BACKEND", **labels) == 0
            assert _metric(text, "nv_inference_count", **labels) == 8
            assert _metric(text, "nv_inference_exec_count", **labels) == 6
            assert _metric(text, "nv_inference_pending_request_count", **labels) == 0
            assert _metric(text, "nv_inference_request_duration_us", **labels) > 0
            assert _metric(text, "nv_inference_compute_infer_duration_us", **labels) > 0
            assert _metric(text, "nv_model_load_duration_secs", **labels) > 0
            assert _metric(text, "ascend_inference_batch_size_sum", **labels) == 8
            assert _metric(text, "ascend_inference_request_latency_seconds_count", **labels) == 9
            assert re.search(r"^nv_cpu_utilization [0-9.]+$", text, re.M)
            assert httpx.post(server.metrics_url).status_code == 405


def test_a_client_that_disconnects_cancels_its_queued_request(
    small_repository: Path, tmp_path: Path
) -> None:
    with running_server([small_repository], log_dir=tmp_path) as server:
        with pytest.raises(httpx.TimeoutException):
            # waits 1.5 s in the batching queue; the client gives up after 0.3 s
            httpx.post(server.base + "/v2/models/slow_queue/infer", json=_body(), timeout=0.3)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stats = httpx.get(server.base + "/v2/models/slow_queue/stats").json()["model_stats"][0]
            if stats["inference_stats"]["fail"]["count"]:
                break
            time.sleep(0.1)
        time.sleep(2.0)  # past the queue delay: a request still queued would have run by now
        stats = httpx.get(server.base + "/v2/models/slow_queue/stats").json()["model_stats"][0]
        assert stats["inference_stats"]["fail"]["count"] == 1
        assert stats["execution_count"] == 0 and stats["inference_count"] == 0
        text = httpx.get(server.metrics_url).text
        labels = {"model": "slow_queue", "version": "1"}
        assert _metric(text, "nv_inference_request_failure", reason="CANCELED", **labels) == 1
        assert _metric(text, "nv_inference_pending_request_count", **labels) == 0
        assert httpx.post(server.base + "/v2/models/simple/infer", json=_body()).status_code == 200


def test_sigterm_drains_in_flight_requests(small_repository: Path, tmp_path: Path) -> None:
    server = start_server([small_repository], ["--exit-timeout-secs", "20"], log_dir=tmp_path)
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:

            def infer(i: int) -> httpx.Response:
                return httpx.post(
                    server.base + "/v2/models/slow_queue/infer", json=_body(i), timeout=30
                )

            futures = [pool.submit(infer, i) for i in range(8)]
            time.sleep(0.5)  # all eight now wait in the 1.5 s batching queue
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            ready = httpx.get(server.base + "/v2/health/ready", timeout=5)
            assert ready.status_code == 503 and ready.json() == {"error": "Server exiting"}
            refused = httpx.post(server.base + "/v2/models/simple/infer", json=_body(), timeout=5)
            assert refused.status_code == 503
            replies = [f.result() for f in futures]
        assert [r.status_code for r in replies] == [200] * 8
        for i, reply in enumerate(replies):
            assert reply.json()["outputs"][0]["data"][0] == i + 1
        assert server.process.wait(20) == 0
        assert time.monotonic() - started < 20
    finally:
        server.stop()


def test_exit_timeout_bounds_shutdown(small_repository: Path, tmp_path: Path) -> None:
    server = start_server([small_repository], ["--exit-timeout-secs", "1"], log_dir=tmp_path)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(
                httpx.post, server.base + "/v2/models/slow_queue/infer", json=_body(), timeout=30
            )
            time.sleep(0.3)
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            server.process.wait(15)
            assert time.monotonic() - started < 6
            reply = future.result()
            # the request either finished or was answered: never left hanging
            assert reply.status_code in (200, 503)
    finally:
        server.stop()


def test_a_broken_model_does_not_stop_the_others(small_repository: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "repo"
    shutil.copytree(small_repository, root)
    broken = root / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "1" / "model.onnx").write_bytes(b"not an onnx file")
    (broken / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 1\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [1] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [1] } ]\n'
    )
    syntax = root / "syntax"
    (syntax / "1").mkdir(parents=True)
    (syntax / "config.pbtxt").write_text("max_batch_size: [[[\n")
    with running_server(
        [root], ["--exit-on-error", "false"], wait_ready=False, log_dir=tmp_path
    ) as server:
        with httpx.Client(base_url=server.base, timeout=30) as http:
            assert http.get("/v2/health/live").status_code == 200
            assert http.get("/v2/health/ready").status_code == 400  # strict readiness
            assert http.post("/v2/models/simple/infer", json=_body()).status_code == 200
            index = {e["name"]: e for e in http.post("/v2/repository/index").json()}
            assert (
                index["broken"]["state"] == "UNAVAILABLE"
                and "onnx" in index["broken"]["reason"].lower()
            )
            assert index["syntax"]["state"] == "UNAVAILABLE"
            assert "config.pbtxt:1:" in index["syntax"]["reason"]
            reply = http.post("/v2/models/broken/infer", json=_body())
            assert reply.status_code in (400, 503) and "broken" in reply.json()["error"]
    with running_server(
        [root], ["--exit-on-error", "false", "--strict-readiness", "false"], log_dir=tmp_path
    ) as server:
        assert httpx.get(server.base + "/v2/health/ready").status_code == 200


def test_exit_on_error_stops_startup(small_repository: Path, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "repo"
    shutil.copytree(small_repository, root)
    (root / "syntax" / "1").mkdir(parents=True)
    (root / "syntax" / "config.pbtxt").write_text("max_batch_size: [[[\n")
    with pytest.raises(RuntimeError, match="server exited with 1"):
        start_server([root], log_dir=tmp_path, timeout=60)
