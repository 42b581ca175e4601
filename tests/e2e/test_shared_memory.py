"""System shared memory end to end: tritonclient's shared-memory utils over HTTP and gRPC,
Triton's codes and texts over raw HTTP, CUDA answers of a server without GPUs, regions shared by
frontend processes, and perf_analyzer with --shared-memory=system.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor, serialized_byte_size

from harness.serverproc import running_server
from tests.support import tools

pytestmark = pytest.mark.e2e

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


@pytest.fixture
def regions() -> Iterator[Any]:
    """Creates POSIX shared memory objects with unique keys; destroys them afterwards."""
    made: list[Any] = []

    def create(size: int) -> tuple[str, Any]:
        key = f"/ascend_test_{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key[1:], key, size)
        made.append(handle)
        return key, handle

    yield create
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _client(protocol: str, server: Any) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _module(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def _status_names(client: Any, protocol: str) -> list[str]:
    status = client.get_system_shared_memory_status()
    if protocol == "http":
        return sorted(region["name"] for region in status)
    return sorted(status.regions)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_in_shared_memory(example_server, regions, protocol: str) -> None:
    client = _client(protocol, example_server)
    mod = _module(protocol)
    client.unregister_system_shared_memory()
    in_key, in_handle = regions(128)
    out_key, out_handle = regions(128)
    shm.set_shared_memory_region(in_handle, [A])
    shm.set_shared_memory_region(in_handle, [B], offset=64)
    client.register_system_shared_memory("in", in_key, 128)
    client.register_system_shared_memory("out", out_key, 128)
    assert _status_names(client, protocol) == ["in", "out"]
    try:
        inputs = [
            mod.InferInput("INPUT0", [1, 16], "INT32"),
            mod.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_shared_memory("in", 64)
        inputs[1].set_shared_memory("in", 64, offset=64)
        outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("out", 64)
        outputs[1].set_shared_memory("out", 64, offset=64)
        result = client.infer("simple", inputs, outputs=outputs)
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(out_handle, np.int32, [1, 16]), A + B
        )
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=64), A - B
        )
        output = result.get_output("OUTPUT0")
        if protocol == "http":
            assert output == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
        else:
            assert list(output.shape) == [1, 16]
            assert result.get_response().raw_output_contents[0] == b""  # no data sent back
        client.unregister_system_shared_memory("in")
        assert _status_names(client, protocol) == ["out"]
    finally:
        client.unregister_system_shared_memory()
    assert _status_names(client, protocol) == []


def test_mixed_inputs_bytes_and_an_output_over_the_socket_grpc(example_server, regions) -> None:
    """One input in shared memory and one in raw_input_contents; a BYTES tensor in shm."""
    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    key, handle = regions(4096)
    shm.set_shared_memory_region(handle, [B])
    client.register_system_shared_memory("mixed", key, 4096)
    try:
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(A)
        inputs[1].set_shared_memory("mixed", 64)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)

        words = np.array([b"alpha", b"", "gamma \u00e9".encode()], dtype=np.object_)
        packed = serialize_byte_tensor(words)
        shm.set_shared_memory_region(handle, [packed], offset=1024)
        text = grpcclient.InferInput("INPUT", [3], "BYTES")
        text.set_shared_memory("mixed", serialized_byte_size(packed), offset=1024)
        answer = client.infer("identity_bytes", [text])
        assert list(answer.as_numpy("OUTPUT")) == list(words)
    finally:
        client.unregister_system_shared_memory("mixed")


def test_shared_memory_through_a_grpc_stream(example_server, regions) -> None:
    """ModelStreamInfer takes the same regions: inputs read there, outputs written there."""
    import queue

    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    key, handle = regions(256)
    shm.set_shared_memory_region(handle, [A, B])
    client.register_system_shared_memory("streamed", key, 256)
    answers: queue.Queue = queue.Queue()
    try:
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_shared_memory("streamed", 64)
        inputs[1].set_shared_memory("streamed", 64, offset=64)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
        outputs[0].set_shared_memory("streamed", 64, offset=128)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("simple", inputs, outputs=outputs, request_id="s1")
        result, error = answers.get(timeout=30)
        client.stop_stream()
        assert error is None, error
        assert result.get_response().id == "s1"
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=128), A + B
        )
    finally:
        client.unregister_system_shared_memory("streamed")


def test_registering_at_an_offset_and_two_regions_on_one_key(example_server, regions) -> None:
    """Triton bugs not copied: a non-zero (unaligned) register offset reads from that offset,
    and two names over one key both work."""
    client = httpclient.InferenceServerClient(example_server.http_url)
    key, handle = regions(4096 + 300)
    shm.set_shared_memory_region(handle, [A], offset=4096 + 100)
    shm.set_shared_memory_region(handle, [B], offset=4096 + 164)
    client.register_system_shared_memory("late", key, 200, offset=4096 + 100)
    client.register_system_shared_memory("whole", key, 4096 + 300)
    try:
        status = {r["name"]: r for r in client.get_system_shared_memory_status()}
        assert status["late"] == {"name": "late", "key": key, "offset": 4196, "byte_size": 200}
        inputs = [
            httpclient.InferInput("INPUT0", [1, 16], "INT32"),
            httpclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_shared_memory("late", 64)
        inputs[1].set_shared_memory("whole", 64, offset=4096 + 164)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    finally:
        client.unregister_system_shared_memory()


def _infer_body(input0: dict, output0: dict | None = None) -> dict:
    body: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", **input0},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ]
    }
    if output0 is not None:
        body["outputs"] = [{"name": "OUTPUT0", **output0}]
    return body


def test_codes_and_texts_over_http(example_server, regions) -> None:
    http = httpx.Client(base_url=example_server.base, timeout=10)
    key, handle = regions(64)
    shm.set_shared_memory_region(handle, [A])
    base = "/v2/systemsharedmemory"

    def register(name: str, body: dict) -> httpx.Response:
        return http.post(f"{base}/region/{name}/register", json=body)

    def expect(response: httpx.Response, status: int, text: str) -> None:
        assert (response.status_code, response.json()) == (status, {"error": text})

    expect(
        register("r", {"key": "/ascend_no_such_key", "byte_size": 8}),
        400,
        "Unable to open shared memory region: '/ascend_no_such_key'",
    )
    expect(
        register("r", {"key": "/../../etc/passwd", "byte_size": 8}),
        400,
        "Unable to open shared memory region: '/../../etc/passwd'",
    )
    expect(
        register("r", {"key": key, "byte_size": 65}),
        400,
        "failed to register shared memory region 'r': invalid args",
    )
    expect(
        register("r", {"key": key, "offset": 60, "byte_size": 8}),
        400,
        "failed to register shared memory region 'r': invalid args",
    )
    expect(
        register("r", {"byte_size": 8}), 400, "Shared memory register request has no 'key' field"
    )
    expect(
        register("r", {"key": key}), 400, "Shared memory register request has no 'byte_size' field"
    )
    expect(
        http.post(f"{base}/register", json={"key": key, "byte_size": 8}),
        400,
        "'region name' is necessary to register system shared memory region",
    )
    expect(
        register("r", {"key": "/ascend-serve-body-1", "byte_size": 8}),
        400,
        "cannot register shared memory region 'r' with key '/ascend-serve-body-1' as the "
        "key contains the reserved prefix 'ascend-serve-'",
    )
    expect(
        register("r", {"key": "///", "byte_size": 8}),
        400,
        "cannot register shared memory region 'r' - invalid shm key '///'",
    )
    assert register("r", {"key": key, "byte_size": 64}).status_code == 200
    try:
        expect(
            register("r", {"key": key, "byte_size": 64}),
            400,
            "shared memory region 'r' already in manager",
        )
        expect(
            http.get(f"{base}/region/nope/status"),
            404,
            "Unable to find system shared memory region: 'nope'",
        )
        assert http.get(f"{base}/region/r/status").json() == [
            {"name": "r", "key": key, "offset": 0, "byte_size": 64}
        ]
        expect(http.get(f"{base}/region/r/register"), 405, "Method Not Allowed")

        infer = "/v2/models/simple/infer"
        in_r = {"parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 64}}
        assert http.post(infer, json=_infer_body(in_r)).json()["outputs"][0]["data"] == [
            v + 1 for v in range(16)
        ]
        expect(
            http.post(
                infer,
                json=_infer_body(
                    {
                        "parameters": {
                            "shared_memory_region": "r",
                            "shared_memory_byte_size": 64,
                            "shared_memory_offset": 4,
                        }
                    }
                ),
            ),
            400,
            "Invalid offset + byte size for shared memory region: 'r'",
        )
        expect(
            http.post(
                infer,
                json=_infer_body(
                    {"parameters": {"shared_memory_region": "gone", "shared_memory_byte_size": 64}}
                ),
            ),
            404,
            "Unable to find shared memory region: 'gone'",
        )
        expect(
            http.post(
                infer,
                json=_infer_body(
                    {"parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 60}}
                ),
            ),
            400,
            "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60",
        )
        expect(
            http.post(
                infer,
                json=_infer_body(
                    {"data": list(range(16))},
                    {"parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 32}},
                ),
            ),
            400,
            "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) "
            "should be at least 64 bytes to hold the results",
        )
        answer = http.post(
            infer,
            json=_infer_body(
                {"data": list(range(16))},
                {"parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 64}},
            ),
        )
        assert answer.json()["outputs"] == [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
        ]
        np.testing.assert_array_equal(shm.get_contents_as_numpy(handle, np.int32, [1, 16]), A + 1)
    finally:
        assert http.post(f"{base}/unregister").status_code == 200
    assert http.get(f"{base}/status").json() == []


def test_cuda_shared_memory_answers_as_triton_without_gpus(example_server) -> None:
    http = httpx.Client(base_url=example_server.base, timeout=10)
    assert http.get("/v2/cudasharedmemory/status").json() == []
    assert http.post("/v2/cudasharedmemory/unregister").status_code == 200
    answer = http.post(
        "/v2/cudasharedmemory/region/c/register",
        json={"raw_handle": {"b64": "AA=="}, "device_id": 0, "byte_size": 8},
    )
    assert (answer.status_code, answer.json()) == (
        400,
        {"error": "failed to register CUDA shared memory region: 'c', GPUs not supported"},
    )
    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    assert not client.get_cuda_shared_memory_status().regions
    client.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException) as error:
        client.register_cuda_shared_memory("c", b"\0" * 64, 0, 64)
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "GPUs not supported" in error.value.message()
    with pytest.raises(InferenceServerException) as error:
        client.register_system_shared_memory("c", "/ascend_no_such_key", 8)
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_grpc_already_exists(example_server, regions) -> None:
    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    key, _ = regions(64)
    client.register_system_shared_memory("twice", key, 64)
    try:
        with pytest.raises(InferenceServerException) as error:
            client.register_system_shared_memory("twice", key, 64)
        assert error.value.status() == "StatusCode.ALREADY_EXISTS"
        assert error.value.message() == "shared memory region 'twice' already in manager"
    finally:
        client.unregister_system_shared_memory("twice")


def test_regions_serve_every_frontend_process(
    example_repository: Path, regions, tmp_path: Path
) -> None:
    """Registered over one connection, used over many (each may land in another process)."""
    with running_server(
        [example_repository], ["--frontend-processes", "2"], log_dir=tmp_path
    ) as server:
        key, handle = regions(128)
        shm.set_shared_memory_region(handle, [A, B])
        httpclient.InferenceServerClient(server.http_url).register_system_shared_memory(
            "shared", key, 128
        )
        for _ in range(8):  # new connections each time
            for client in (
                httpclient.InferenceServerClient(server.http_url),
                grpcclient.InferenceServerClient(server.grpc_url),
            ):
                mod = (
                    httpclient
                    if isinstance(client, httpclient.InferenceServerClient)
                    else grpcclient
                )
                assert (
                    len(client.get_system_shared_memory_status()) == 1
                    if mod is httpclient
                    else len(client.get_system_shared_memory_status().regions) == 1
                )
                inputs = [
                    mod.InferInput("INPUT0", [1, 16], "INT32"),
                    mod.InferInput("INPUT1", [1, 16], "INT32"),
                ]
                inputs[0].set_shared_memory("shared", 64)
                inputs[1].set_shared_memory("shared", 64, offset=64)
                np.testing.assert_array_equal(
                    client.infer("simple", inputs).as_numpy("OUTPUT0"), A + B
                )
        httpclient.InferenceServerClient(server.http_url).unregister_system_shared_memory()


@tools.needs_perf_analyzer
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_with_system_shared_memory(example_server, protocol: str) -> None:
    url = example_server.http_url if protocol == "http" else example_server.grpc_url
    command = [
        tools.perf_analyzer(),
        "-m",
        "simple",
        "-i",
        protocol,
        "-u",
        url,
        "--shared-memory=system",
        "--concurrency-range",
        "1:2",
        "--measurement-interval",
        "500",
        "--max-trials",
        "4",
        "--stability-percentage",
        "1000",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Throughput:" in output and "infer/sec" in output, output
    assert "error" not in output.lower(), output
    assert httpx.get(example_server.base + "/v2/systemsharedmemory/status").json() == []
