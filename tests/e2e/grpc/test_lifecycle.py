"""gRPC behaviour that needs its own repository or flags: cancellation of queued requests,
concurrency inside one stream, 50 MiB messages, the message size limit and shutdown with open
streams. The `slow` model holds a lone request 2 s in its queue (it waits for a preferred batch
of 64), long enough to cancel it before it could run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import re
import signal
import socket
import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from examples.build_repository import make_dense_compute_model
from examples.common import IR_VERSION, OPSET
from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024
QUEUE_DELAY_S = 2.0
WIDTH = 256

SLOW_CONFIG = f"""
name: "slow"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
dynamic_batching {{
  preferred_batch_size: [ 64 ]
  max_queue_delay_microseconds: {int(QUEUE_DELAY_S * 1_000_000)}
}}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

IDENTITY_CONFIG = """
name: "identity_fp32"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def _identity_fp32_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])],
        "identity_fp32",
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def _write_model(repo: Path, name: str, model: onnx.ModelProto, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.onnx").write_bytes(model.SerializeToString())
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("grpc_models")
    _write_model(repo, "slow", make_dense_compute_model(), SLOW_CONFIG)
    _write_model(repo, "identity_fp32", _identity_fp32_model(), IDENTITY_CONFIG)
    return repo


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    with running_server([repository], log_dir=tmp_path_factory.mktemp("logs")) as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> grpcclient.InferenceServerClient:
    with grpcclient.InferenceServerClient(server.grpc_url) as triton:
        yield triton


def dense_input(seed: int, module=grpcclient):
    data = np.random.default_rng(seed).standard_normal((1, WIDTH)).astype(np.float32)
    tensor = module.InferInput("INPUT", [1, WIDTH], "FP32")
    tensor.set_data_from_numpy(data)
    return tensor, data


def reference(data: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(
        make_dense_compute_model().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"INPUT": data})[0]


def canceled_metric(server: ServerProcess) -> float:
    text = httpx.get(server.metrics_url, timeout=10).text
    pattern = r'^nv_inference_request_failure\{model="slow",reason="CANCELED",version="1"\} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    assert match, "no CANCELED failure series for 'slow'"
    return float(match.group(1))


# ----- cancellation -------------------------------------------------------------------------
def _cancel_by_deadline(client: grpcclient.InferenceServerClient) -> None:
    tensor, _ = dense_input(1)
    with pytest.raises(InferenceServerException) as error:
        client.infer("slow", [tensor], client_timeout=0.3)
    assert error.value.status() == "StatusCode.DEADLINE_EXCEEDED"


def _cancel_aio_call(server: ServerProcess) -> None:
    async def run() -> None:
        async with aioclient.InferenceServerClient(server.grpc_url) as triton:
            tensor, _ = dense_input(2, aioclient)
            call = asyncio.ensure_future(triton.infer("slow", [tensor]))
            await asyncio.sleep(0.3)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call

    asyncio.run(run())


def _cancel_stream(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as triton:
        triton.start_stream(lambda result, error: None)
        tensor, _ = dense_input(3)
        triton.async_stream_infer("slow", [tensor])
        time.sleep(0.3)
        triton.stop_stream(cancel_requests=True)


def test_cancelled_requests_never_execute(
    client: grpcclient.InferenceServerClient, server: ServerProcess
) -> None:
    """A deadline, an aio cancel and a cancelled stream, each while the request waits in the
    queue: none runs, each counts as a failure with reason CANCELED."""
    before = client.get_inference_statistics("slow").model_stats[0]
    metric_before = canceled_metric(server)
    started = time.monotonic()
    _cancel_by_deadline(client)
    _cancel_aio_call(server)
    _cancel_stream(server)
    # Past the queue delay of the last one: had it stayed queued, it would have run by now.
    time.sleep(max(0.0, started + QUEUE_DELAY_S + 1.5 - time.monotonic()))
    after = client.get_inference_statistics("slow").model_stats[0]
    assert after.execution_count == before.execution_count
    assert after.inference_count == before.inference_count
    assert after.inference_stats.fail.count - before.inference_stats.fail.count == 3
    assert after.inference_stats.success.count == before.inference_stats.success.count
    assert canceled_metric(server) - metric_before == 3


def test_stream_requests_run_concurrently(
    client: grpcclient.InferenceServerClient, server: ServerProcess
) -> None:
    """Four requests on one stream wait in the queue together and run as one batch of 4 (one
    at a time they would take four queue delays); each answer matches its own input."""
    answers: queue.Queue = queue.Queue()
    before = client.get_inference_statistics("slow").model_stats[0]
    sent = {}
    started = time.monotonic()
    with grpcclient.InferenceServerClient(server.grpc_url) as triton:
        triton.start_stream(lambda result, error: answers.put((result, error)))
        for seed in range(10, 14):
            tensor, data = dense_input(seed)
            sent[f"id-{seed}"] = data
            triton.async_stream_infer("slow", [tensor], request_id=f"id-{seed}")
        got = [answers.get(timeout=30) for _ in sent]
        triton.stop_stream()
    elapsed = time.monotonic() - started
    assert elapsed < 2 * QUEUE_DELAY_S
    for result, error in got:
        assert error is None
        request_id = result.get_response().id
        np.testing.assert_allclose(
            result.as_numpy("OUTPUT"), reference(sent[request_id]), rtol=1e-4, atol=1e-5
        )
    after = client.get_inference_statistics("slow").model_stats[0]
    assert after.execution_count - before.execution_count == 1
    assert after.inference_count - before.inference_count == 4


# ----- large messages -----------------------------------------------------------------------
def _identity_input(values: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return tensor


def test_fifty_mib_request_and_response(client: grpcclient.InferenceServerClient) -> None:
    """Beyond grpcio's 4 MiB default in both directions (qa/L0_large_payload)."""
    values = np.arange(50 * MIB // 4, dtype=np.float32)
    result = client.infer("identity_fp32", [_identity_input(values)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), values)


class CountingRelay:
    """A TCP relay in front of the server that counts the bytes the server sends back."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.received = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client_side, _ = self.listener.accept()
                server_side = socket.create_connection(("127.0.0.1", self.target_port))
                for source, sink, counted in (
                    (client_side, server_side, False),
                    (server_side, client_side, True),
                ):
                    threading.Thread(
                        target=self._pipe, args=(source, sink, counted), daemon=True
                    ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        with contextlib.suppress(OSError), source, sink:
            while data := source.recv(1 << 16):
                if counted:
                    self.received += len(data)
                sink.sendall(data)

    def close(self) -> None:
        self.listener.close()


def test_responses_are_compressed(repository: Path, tmp_path: Path) -> None:
    """--grpc-infer-response-compression-level high: 4 MiB of zeros come back in far less."""
    with running_server(
        [repository], ["--grpc-infer-response-compression-level", "high"], log_dir=tmp_path
    ) as compressing:
        relay = CountingRelay(compressing.grpc_port)
        try:
            with grpcclient.InferenceServerClient(f"127.0.0.1:{relay.port}") as triton:
                values = np.zeros(MIB, np.float32)
                result = triton.infer("identity_fp32", [_identity_input(values)])
                np.testing.assert_array_equal(result.as_numpy("OUTPUT"), values)
        finally:
            relay.close()
    assert 0 < relay.received < MIB


def test_gzip_request(client: grpcclient.InferenceServerClient) -> None:
    values = np.linspace(0, 1, MIB, dtype=np.float32)
    result = client.infer("identity_fp32", [_identity_input(values)], compression_algorithm="gzip")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), values)


def test_message_size_limit_is_configurable(repository: Path, tmp_path: Path) -> None:
    with running_server(
        [repository], ["--grpc-max-message-size", str(MIB)], log_dir=tmp_path
    ) as small:
        with grpcclient.InferenceServerClient(small.grpc_url) as triton:
            fits = np.ones(1024, np.float32)
            np.testing.assert_array_equal(
                triton.infer("identity_fp32", [_identity_input(fits)]).as_numpy("OUTPUT"), fits
            )
            with pytest.raises(InferenceServerException) as error:
                triton.infer("identity_fp32", [_identity_input(np.ones(MIB // 2, np.float32))])
            assert error.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert triton.is_server_ready()


# ----- shutdown -----------------------------------------------------------------------------
def test_shutdown_ends_watches_and_idle_streams(repository: Path, tmp_path: Path) -> None:
    """SIGTERM with a health watch and an idle stream open: the watch sees NOT_SERVING and the
    server exits at once instead of waiting out --exit-timeout-secs for them."""
    with running_server([repository], ["--exit-timeout-secs", "20"], log_dir=tmp_path) as proc:
        statuses: list[int] = []
        with grpc.insecure_channel(proc.grpc_url) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(), timeout=30
            )
            statuses.append(next(watch).status)
            reader = threading.Thread(target=lambda: statuses.extend(m.status for m in watch))
            reader.start()
            triton = grpcclient.InferenceServerClient(proc.grpc_url)
            stream_errors: queue.Queue = queue.Queue()
            triton.start_stream(lambda result, error: stream_errors.put(error))
            # One answered request proves the stream is open; it then stays idle.
            triton.async_stream_infer("identity_fp32", [_identity_input(np.ones(4, np.float32))])
            assert stream_errors.get(timeout=10) is None
            started = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.process.wait(15) == 0
            reader.join(10)
            triton.stop_stream()
            triton.close()
    assert time.monotonic() - started < 10
    assert statuses[0] == health_pb2.HealthCheckResponse.SERVING
    assert statuses[-1] == health_pb2.HealthCheckResponse.NOT_SERVING
    ended = stream_errors.get(timeout=5)
    assert ended.status() == "StatusCode.UNAVAILABLE" and "Server exiting" in ended.message()
