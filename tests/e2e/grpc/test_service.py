"""The gRPC frontend against a server subprocess, through the real tritonclient (sync, aio and
streaming), the grpc.health.v1 stub and a raw stub for what tritonclient never sends."""

from __future__ import annotations

import asyncio
import queue
import re
import threading

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(example_server) -> grpcclient.InferenceServerClient:
    with grpcclient.InferenceServerClient(example_server.grpc_url) as triton:
        yield triton


@pytest.fixture(scope="module")
def stub(example_server) -> service_pb2_grpc.GRPCInferenceServiceStub:
    with grpc.insecure_channel(example_server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(autouse=True)
def still_serving(client: grpcclient.InferenceServerClient):
    """After every test, errors included, the server still answers inferences."""
    yield
    a, b = simple_arrays(3)
    check_simple(client.infer("simple", simple_inputs(a, b)), a, b)


# ----- helpers ------------------------------------------------------------------------------
def simple_arrays(seed: int, batch: int = 1) -> tuple[np.ndarray, np.ndarray]:
    a = (np.arange(16 * batch, dtype=np.int32) * seed).reshape(batch, 16)
    return a, np.full((batch, 16), seed, np.int32)


def simple_inputs(a: np.ndarray, b: np.ndarray, module=grpcclient) -> list:
    inputs = [
        module.InferInput("INPUT0", list(a.shape), "INT32"),
        module.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def check_simple(result, a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def bytes_input(values: list[bytes], module=grpcclient):
    array = np.array(values, dtype=object)
    tensor = module.InferInput("INPUT", [len(values)], "BYTES")
    tensor.set_data_from_numpy(array)
    return tensor


def metric(text: str, name: str, **labels: str) -> float:
    """One sample from Prometheus text; labels printed in sorted order, as the server does."""
    label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{name}\{{{re.escape(label_text)}\}} (\S+)$", text, re.MULTILINE)
    assert match, f"{name}{{{label_text}}} not in metrics"
    return float(match.group(1))


def stats_of(client: grpcclient.InferenceServerClient, model: str):
    return client.get_inference_statistics(model).model_stats[0]


# ----- health, metadata, config, repository -------------------------------------------------
def test_health_and_model_readiness(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    # Unknown versions and models are "not ready", never an error (qa/L0_lifecycle).
    assert not client.is_model_ready("simple", "9")
    assert not client.is_model_ready("no_such_model")


def test_server_and_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "ascend-serve" and "statistics" in server["extensions"]
    meta = client.get_model_metadata("simple", as_json=True)
    assert meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("INPUT0", "INT32", ["-1", "16"]),
        ("INPUT1", "INT32", ["-1", "16"]),
    ]
    assert client.get_model_metadata("identity_bytes").inputs[0].shape == [-1]


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple_batching").config
    assert (config.name, config.max_batch_size) == ("simple_batching", 64)
    assert config.HasField("dynamic_batching") and [i.name for i in config.input] == [
        "INPUT0",
        "INPUT1",
    ]
    assert not client.get_model_config("simple").config.HasField("dynamic_batching")


def test_repository_index_and_control(client: grpcclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index().models
    ready = {(m.name, m.version, m.state) for m in index}
    assert ("simple", "1", "READY") in ready and ("identity_bytes", "1", "READY") in ready
    for call in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException) as error:
            call("simple")
        assert error.value.status() == "StatusCode.UNAVAILABLE"
        assert (
            "explicit model load / unload is not allowed if polling is enabled"
            in error.value.message()
        )


# ----- inference ----------------------------------------------------------------------------
def test_sync_infer(client: grpcclient.InferenceServerClient) -> None:
    a, b = simple_arrays(5, batch=4)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple", simple_inputs(a, b), outputs=outputs, request_id="sync-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("sync-1", "simple", "1")
    assert len(response.raw_output_contents) == len(response.outputs) == 1


def test_aio_concurrent_infers(example_server) -> None:
    async def run() -> None:
        async with aioclient.InferenceServerClient(example_server.grpc_url) as triton:
            assert await triton.is_server_ready()
            pairs = [simple_arrays(seed) for seed in range(1, 9)]
            results = await asyncio.gather(
                *[
                    triton.infer(
                        "simple_batching", simple_inputs(a, b, aioclient), request_id=str(i)
                    )
                    for i, (a, b) in enumerate(pairs)
                ]
            )
            for i, ((a, b), result) in enumerate(zip(pairs, results, strict=False)):
                assert result.get_response().id == str(i)
                check_simple(result, a, b)

    asyncio.run(run())


def test_bytes_tensors(client: grpcclient.InferenceServerClient) -> None:
    # UTF-8 only: ONNX Runtime string tensors cannot carry arbitrary bytes. The last element
    # alone is over grpcio's 4 MiB default message size.
    values = [b"", b"hello", "grüße".encode(), b"\x00\x01" * 100, b"0123456789" * 500_000]
    result = client.infer("identity_bytes", [bytes_input(values)])
    assert result.as_numpy("OUTPUT").tolist() == values


def test_typed_contents_are_accepted_and_answered_raw(stub) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name, values in (("INPUT0", range(16)), ("INPUT1", [2] * 16)):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(values)
    response = stub.ModelInfer(request)
    assert not any(o.HasField("contents") for o in response.outputs)
    first = np.frombuffer(response.raw_output_contents[0], np.int32)
    np.testing.assert_array_equal(first, np.arange(16) + 2)


def test_gzip_request_compression(client: grpcclient.InferenceServerClient) -> None:
    a, b = simple_arrays(7)
    check_simple(client.infer("simple", simple_inputs(a, b), compression_algorithm="gzip"), a, b)


# ----- streaming ----------------------------------------------------------------------------
class Collector:
    """A tritonclient stream callback that keeps every (result, error) it is given."""

    def __init__(self) -> None:
        self.items: queue.Queue = queue.Queue()

    def __call__(self, result, error) -> None:
        self.items.put((result, error))

    def take(self, count: int, timeout: float = 30.0) -> list:
        return [self.items.get(timeout=timeout) for _ in range(count)]


def test_stream_interleaved_requests(example_server) -> None:
    collector = Collector()
    sent = {f"req-{i}": simple_arrays(i + 1) for i in range(12)}
    with grpcclient.InferenceServerClient(example_server.grpc_url) as triton:
        triton.start_stream(collector)
        for request_id, (a, b) in sent.items():
            model = "simple_batching" if int(request_id[4:]) % 2 else "simple"
            triton.async_stream_infer(model, simple_inputs(a, b), request_id=request_id)
        got = collector.take(len(sent))
        triton.stop_stream()
    seen = set()
    for result, error in got:
        assert error is None
        response = result.get_response()
        assert response.parameters["triton_final_response"].bool_param is True
        check_simple(result, *sent[response.id])
        seen.add(response.id)
    assert seen == set(sent)


def test_stream_error_keeps_the_stream_open(example_server) -> None:
    collector = Collector()
    a, b = simple_arrays(2)
    with grpcclient.InferenceServerClient(example_server.grpc_url) as triton:
        triton.start_stream(collector)
        triton.async_stream_infer("simple", simple_inputs(a[:, :8], b[:, :8]), request_id="bad")
        [(result, error)] = collector.take(1)
        assert result is None and "unexpected shape for input 'INPUT0'" in error.message()
        triton.async_stream_infer("no_such_model", simple_inputs(a, b), request_id="unknown")
        [(result, error)] = collector.take(1)
        assert "Request for unknown model: 'no_such_model' is not found" in error.message()
        triton.async_stream_infer("simple", simple_inputs(a, b), request_id="good")
        [(result, error)] = collector.take(1)
        assert error is None and result.get_response().id == "good"
        check_simple(result, a, b)
        triton.stop_stream()


def test_stream_error_as_grpc_status_with_header(example_server) -> None:
    collector = Collector()
    a, b = simple_arrays(2)
    with grpcclient.InferenceServerClient(example_server.grpc_url) as triton:
        triton.start_stream(collector, headers={"triton_grpc_error": "true"})
        triton.async_stream_infer("simple", simple_inputs(a[:, :8], b[:, :8]))
        [(result, error)] = collector.take(1)
        triton.stop_stream()
    assert result is None
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "unexpected shape for input 'INPUT0'" in error.message()


def test_aio_stream(example_server) -> None:
    async def run() -> None:
        async with aioclient.InferenceServerClient(example_server.grpc_url) as triton:
            sent = {str(i): simple_arrays(i + 1) for i in range(6)}

            async def requests():
                for request_id, (a, b) in sent.items():
                    yield {
                        "model_name": "simple_batching",
                        "request_id": request_id,
                        "inputs": simple_inputs(a, b, aioclient),
                    }

            answered = set()
            async for result, error in triton.stream_infer(requests()):
                assert error is None
                response_id = result.get_response().id
                check_simple(result, *sent[response_id])
                answered.add(response_id)
                if answered == set(sent):
                    break
            assert answered == set(sent)

    asyncio.run(run())


# ----- statistics and metrics ---------------------------------------------------------------
def test_statistics_and_metrics_move_with_grpc_requests(
    client: grpcclient.InferenceServerClient, example_server
) -> None:
    def success_metric() -> float:
        text = httpx.get(example_server.metrics_url, timeout=10).text
        return metric(text, "nv_inference_request_success", model="classifier", version="1")

    before, metric_before = stats_of(client, "classifier"), success_metric()
    image = grpcclient.InferInput("INPUT", [2, 3, 32, 32], "FP32")
    image.set_data_from_numpy(np.ones((2, 3, 32, 32), np.float32))
    for _ in range(3):
        result = client.infer(
            "classifier",
            [image],
            outputs=[grpcclient.InferRequestedOutput("PROBABILITIES", class_count=2)],
        )
    top = result.as_numpy("PROBABILITIES")
    assert top.shape == (2, 2) and top[0, 0].decode().count(":") == 2  # value:index:label
    after = stats_of(client, "classifier")
    assert (after.name, after.version) == ("classifier", "1")
    assert after.inference_count - before.inference_count == 6
    assert after.execution_count - before.execution_count == 3
    stats, old = after.inference_stats, before.inference_stats
    assert stats.success.count - old.success.count == 3
    assert stats.queue.count == stats.success.count
    assert stats.compute_input.count == stats.compute_infer.count == stats.compute_output.count
    assert stats.success.ns > old.success.ns and after.last_inference >= before.last_inference
    assert {b.batch_size for b in after.batch_stats} >= {2}
    for field in (
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    ):
        assert stats.HasField(field)
    assert success_metric() - metric_before == 3


def test_statistics_errors(client: grpcclient.InferenceServerClient) -> None:
    names = {s.name for s in client.get_inference_statistics().model_stats}
    assert {"simple", "identity_bytes", "classifier"} <= names
    with pytest.raises(InferenceServerException) as error:
        client.get_inference_statistics("no_such_model")
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "requested model 'no_such_model' is not available" in error.value.message()


# ----- grpc.health.v1 -----------------------------------------------------------------------
def test_grpc_health_check_and_watch(example_server) -> None:
    with grpc.insecure_channel(example_server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert health.Check(health_pb2.HealthCheckRequest(service="")).status == serving
        assert (
            health.Check(
                health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")
            ).status
            == serving
        )
        watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=10)
        assert next(watch).status == serving
        watch.cancel()


def test_grpc_health_check_of_an_unknown_service_is_not_found(example_server) -> None:
    with grpc.insecure_channel(example_server.grpc_url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        assert error.value.details() == "unknown service"
        assert (
            health.Check(health_pb2.HealthCheckRequest(service="grpc.health.v1.Health")).status
            == health_pb2.HealthCheckResponse.SERVING
        )
        watch = health.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        watch.cancel()


# ----- errors and the unsupported extensions ------------------------------------------------
@pytest.mark.parametrize(
    "model, version, inputs_of, status, fragment",
    [
        (
            "no_such_model",
            "",
            lambda a, b: simple_inputs(a, b),
            "NOT_FOUND",
            "Request for unknown model: 'no_such_model' is not found",
        ),
        (
            "simple",
            "7",
            lambda a, b: simple_inputs(a, b),
            "NOT_FOUND",
            "Request for unknown model: 'simple' version 7 is not found",
        ),
        (
            "simple",
            "",
            lambda a, b: simple_inputs(a[:, :4], b[:, :4]),
            "INVALID_ARGUMENT",
            "unexpected shape for input 'INPUT0' for model 'simple'",
        ),
        (
            "simple",
            "",
            lambda a, b: simple_inputs(a, b)[:1],
            "INVALID_ARGUMENT",
            "expected 2 inputs but got 1 inputs",
        ),
        (
            "simple",
            "",
            lambda a, b: simple_inputs(np.tile(a, (9, 1)), np.tile(b, (9, 1))),
            "INVALID_ARGUMENT",
            "inference request batch-size must be <= 8 for 'simple'",
        ),
    ],
)
def test_inference_errors(client, model, version, inputs_of, status, fragment) -> None:
    a, b = simple_arrays(1)
    with pytest.raises(InferenceServerException) as error:
        client.infer(model, inputs_of(a, b), model_version=version)
    assert error.value.status() == f"StatusCode.{status}"
    assert fragment in error.value.message()


def test_reserved_parameters_are_refused(stub) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple")
    request.parameters["triton_foo"].bool_param = True
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reserved for Triton usage" in error.value.details()


def test_shared_memory_answers(client: grpcclient.InferenceServerClient) -> None:
    assert not client.get_system_shared_memory_status().regions
    assert not client.get_cuda_shared_memory_status().regions
    client.unregister_system_shared_memory()  # "" means all: perf_analyzer calls it at startup
    client.unregister_cuda_shared_memory()
    for register in (
        lambda: client.register_system_shared_memory("r", "/no_such_key", 64),
        lambda: client.register_cuda_shared_memory("r", b"\0" * 64, 0, 64),
    ):
        with pytest.raises(InferenceServerException) as error:  # test_shared_memory.py: more
            register()
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_trace_settings(client: grpcclient.InferenceServerClient) -> None:
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"]["value"] == ["OFF"]
    assert settings["trace_rate"]["value"] == ["1000"]
    updated = client.update_trace_settings("simple", {"trace_rate": "7"}, as_json=True)
    assert updated["settings"]["trace_rate"]["value"] == ["7"]
    assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1000"]
    with pytest.raises(InferenceServerException) as error:
        client.update_trace_settings(settings={"trace_file": "/tmp/elsewhere.json"})
    assert error.value.status() == "StatusCode.UNIMPLEMENTED"
    assert (
        error.value.message() == "trace file location can not be updated through network protocol"
    )
    with pytest.raises(InferenceServerException) as error:
        client.get_trace_settings("no_such_model")
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.value.message() == "Request for unknown model : no_such_model"


def test_log_settings(client: grpcclient.InferenceServerClient) -> None:
    settings = client.get_log_settings(as_json=True)["settings"]
    assert settings["log_info"]["bool_param"] is True
    assert settings["log_format"]["string_param"] == "default"
    try:
        updated = client.update_log_settings({"log_verbose_level": 1}, as_json=True)
        assert updated["settings"]["log_verbose_level"]["uint32_param"] == 1
    finally:
        client.update_log_settings({"log_verbose_level": 0})
    with pytest.raises(InferenceServerException) as error:
        client.update_log_settings({"log_format": "xml"})
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_many_clients_at_once(example_server) -> None:
    """Sync clients on threads: every answer matches its own request."""
    failures: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            with grpcclient.InferenceServerClient(example_server.grpc_url) as triton:
                for step in range(5):
                    a, b = simple_arrays(seed * 10 + step)
                    check_simple(triton.infer("simple_batching", simple_inputs(a, b)), a, b)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures
