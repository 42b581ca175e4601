"""What only `--grpc-server threads` has: streams hold a handler thread each, so at most
`--grpc-thread-streams` are open at once and one more is refused RESOURCE_EXHAUSTED, while
unary calls keep being answered; ModelInfer holds none. It is the default server, so the rest
of the gRPC suite runs against it too (README, "gRPC servers")."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.procutil import wait_for
from harness.serverproc import ServerProcess, running_server
from harness.testmodels import write_python_model

pytestmark = pytest.mark.e2e

STREAMS = 2


@pytest.fixture(scope="module")
def server(
    example_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with running_server(
        [example_repository],
        ["--grpc-server", "threads", "--grpc-threads", "8", "--grpc-thread-streams", str(STREAMS)],
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as running:
        yield running


def _simple_infer(server: ServerProcess) -> np.ndarray:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return client.infer("simple", inputs).as_numpy("OUTPUT0")


def test_streams_past_the_limit_are_refused_and_unary_calls_still_answer(
    server: ServerProcess,
) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    health = health_pb2_grpc.HealthStub(channel)
    watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(STREAMS)]
    try:
        for watch in watches:  # each open, holding its thread
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        extra = health.Watch(health_pb2.HealthCheckRequest())
        with pytest.raises(grpc.RpcError) as refused:
            next(extra)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--grpc-thread-streams" in refused.value.details()
        np.testing.assert_array_equal(
            _simple_infer(server), 2 * np.arange(16, dtype=np.int32).reshape(1, 16)
        )
    finally:
        for watch in watches:
            watch.cancel()
    # the cancelled watches gave their threads back
    again = health.Watch(health_pb2.HealthCheckRequest())
    for _ in range(50):
        try:
            assert next(again).status == health_pb2.HealthCheckResponse.SERVING
            break
        except grpc.RpcError as exc:  # a cancel reaches the server a moment later
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            again = health.Watch(health_pb2.HealthCheckRequest())
    else:
        pytest.fail("no stream was accepted after the others ended")
    again.cancel()
    channel.close()


def test_a_bad_request_reads_the_same_as_on_grpc_aio(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    tensor = grpcclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.int32))
    with pytest.raises(Exception, match="Request for unknown model: 'nope' is not found"):
        client.infer("nope", [tensor])
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    with pytest.raises(grpc.RpcError) as malformed:
        call(b"\xff\xff\xff")
    assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed request message" in malformed.value.details()
    channel.close()


def test_calls_past_the_concurrent_rpc_limit_are_refused(
    example_repository: Path, tmp_path: Path
) -> None:
    args = ["--grpc-server", "threads", "--grpc-threads", "8", "--grpc-max-concurrent-rpcs", "2"]
    with running_server([example_repository], args, log_dir=tmp_path) as running:
        channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
        health = health_pb2_grpc.HealthStub(channel)
        watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(2)]
        try:
            for watch in watches:
                assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as refused:
                health.Check(health_pb2.HealthCheckRequest())
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            for watch in watches:
                watch.cancel()
            channel.close()


# Holds its first execution until the file `release` appears in the model directory.
GATED_MODEL = """
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.release = os.path.join(args["model_repository"], "release")

    def execute(self, requests):
        deadline = time.monotonic() + 30
        while not os.path.exists(self.release) and time.monotonic() < deadline:
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]
            )
            for r in requests
        ]
"""
GATED_CONFIG = """
name: "gated"
backend: "python"
max_batch_size: 16
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { }
"""
CALLS = 12


def _pending(server: ServerProcess) -> float:
    for line in httpx.get(server.metrics_url, timeout=5).text.splitlines():
        if line.startswith('nv_inference_pending_request_count{model="gated"'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_model_infer_calls_hold_no_handler_thread(tmp_path: Path) -> None:
    """ModelInfer is taken off grpc core's completion queue (server/grpc/direct_infer.py): with
    two handler threads, twelve calls still reach the batcher while the model is busy, and those
    that waited run as one batch (in handler threads, at most two could be in the server)."""
    repo = tmp_path / "repo"
    write_python_model(repo, "gated", GATED_MODEL, GATED_CONFIG)
    args = ["--grpc-server", "threads", "--grpc-threads", "2"]
    with running_server([repo], args, log_dir=tmp_path) as running:
        client = grpcclient.InferenceServerClient(running.grpc_url)

        def call(value: float) -> np.ndarray:
            tensor = grpcclient.InferInput("X", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
            return client.infer("gated", [tensor]).as_numpy("Y")

        with ThreadPoolExecutor(CALLS) as pool:
            answers = [pool.submit(call, float(v)) for v in range(CALLS)]
            try:
                wait_for(lambda: _pending(running) >= CALLS // 2, "calls in the batcher", 15)
            finally:
                (repo / "gated" / "release").touch()
            values = [float(a.result(timeout=60)[0, 0]) for a in answers]
        stats = client.get_inference_statistics("gated", as_json=True)["model_stats"][0]
    assert values == [v + 1.0 for v in range(CALLS)]
    assert int(stats["inference_count"]) == CALLS
    assert int(stats["execution_count"]) <= 4  # in handler threads: 6 or more
