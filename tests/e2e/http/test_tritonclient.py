"""NVIDIA's tritonclient.http (sync and asyncio) and perf_analyzer against our server."""

from __future__ import annotations

import asyncio
import re
import subprocess

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.support import tools

pytestmark = pytest.mark.e2e


def _inputs(module, a: np.ndarray, b: np.ndarray, binary: bool = True) -> list:
    inputs = [
        module.InferInput("INPUT0", list(a.shape), "INT32"),
        module.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


@pytest.fixture(scope="module")
def client(example_server):
    with httpclient.InferenceServerClient(example_server.http_url) as c:
        yield c


def test_health_metadata_config(client) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("simple", "3")
    metadata = client.get_model_metadata("simple")
    assert metadata["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    assert client.get_model_config("simple")["max_batch_size"] == 8
    assert "statistics" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_binary_and_json(client, binary: bool) -> None:
    a = np.arange(48, dtype=np.int32).reshape(3, 16)
    b = np.ones((3, 16), dtype=np.int32)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer(
        "simple", _inputs(httpclient, a, b, binary), outputs=outputs, request_id="7"
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["id"] == "7"


def test_infer_all_outputs_by_default(client) -> None:
    a = np.full((1, 16), 5, dtype=np.int32)
    result = client.infer("simple", _inputs(httpclient, a, a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a * 0)


def test_bytes_tensors(client) -> None:
    data = np.array([b"alpha", b"", "\u00fc".encode()], dtype=object)
    tensor = httpclient.InferInput("INPUT", [3], np_to_triton_dtype(data.dtype))
    tensor.set_data_from_numpy(data)
    result = client.infer("identity_bytes", [tensor])
    assert list(result.as_numpy("OUTPUT")) == list(data)


def test_classification(client) -> None:
    image = np.zeros((2, 3, 32, 32), dtype=np.float32)
    image[0, 2] = 1.0
    image[1, 1] = 1.0
    tensor = httpclient.InferInput("INPUT", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    result = client.infer(
        "classifier",
        [tensor],
        outputs=[httpclient.InferRequestedOutput("PROBABILITIES", class_count=2)],
    )
    top = result.as_numpy("PROBABILITIES")
    assert top.shape == (2, 2)
    plain = client.infer("classifier", [tensor]).as_numpy("PROBABILITIES")
    for row in range(2):
        value, index, _label = top[row][0].decode().split(":")
        assert int(index) == int(np.argmax(plain[row]))
        assert float(value) == pytest.approx(float(plain[row].max()), abs=1e-6)


def test_errors_surface_as_exceptions_with_status(client) -> None:
    a = np.zeros((1, 15), dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 15], "INT32"),
        httpclient.InferInput("INPUT1", [1, 15], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    with pytest.raises(InferenceServerException) as info:
        client.infer("simple", inputs)
    assert "unexpected shape for input 'INPUT0'" in info.value.message()
    assert info.value.status() == "400"
    with pytest.raises(InferenceServerException) as info:
        client.infer("missing", inputs)
    assert info.value.status() == "404"


def test_statistics_and_repository_index(client) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    client.infer("simple", _inputs(httpclient, a, a))
    stats = client.get_inference_statistics("simple")["model_stats"][0]
    assert stats["inference_count"] >= 1 and stats["execution_count"] >= 1
    index = client.get_model_repository_index()
    assert {"name": "simple", "version": "1", "state": "READY"} in index


def test_asyncio_client(example_server) -> None:
    async def run() -> list[np.ndarray]:
        async with aiohttpclient.InferenceServerClient(example_server.http_url) as client:
            assert await client.is_server_ready()
            assert (await client.get_model_metadata("simple"))["name"] == "simple"
            arrays = [np.full((1, 16), i, dtype=np.int32) for i in range(8)]
            results = await asyncio.gather(
                *(client.infer("simple", _inputs(httpclient, x, x)) for x in arrays)
            )
            return [r.as_numpy("OUTPUT0") for r in results]

    outputs = asyncio.run(run())
    for i, output in enumerate(outputs):
        np.testing.assert_array_equal(output, np.full((1, 16), 2 * i, dtype=np.int32))


def test_concurrent_requests_to_a_batching_model(example_server) -> None:
    """Each concurrent caller gets its own answer, and the server really batched them."""

    async def run() -> None:
        async with aiohttpclient.InferenceServerClient(example_server.http_url) as client:
            before = (await client.get_inference_statistics("simple_batching"))["model_stats"][0]
            arrays = [np.full((1, 16), i, dtype=np.int32) for i in range(48)]
            results = await asyncio.gather(
                *(
                    client.infer("simple_batching", _inputs(httpclient, x, np.ones_like(x)))
                    for x in arrays
                )
            )
            for i, result in enumerate(results):
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), arrays[i] + 1)
            after = (await client.get_inference_statistics("simple_batching"))["model_stats"][0]
            executions = after["execution_count"] - before["execution_count"]
            inferences = after["inference_count"] - before["inference_count"]
            assert inferences == 48
            assert executions < inferences

    asyncio.run(run())


def run_perf_analyzer(args: list[str]) -> str:
    completed = subprocess.run(
        [tools.perf_analyzer(), *args], capture_output=True, text=True, timeout=240
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    return output


def test_perf_analyzer_http(example_server) -> None:
    output = run_perf_analyzer(
        [
            "-m",
            "simple",
            "-u",
            example_server.http_url,
            "-i",
            "http",
            "--concurrency-range",
            "1:2",
            "--measurement-interval",
            "1000",
            "--stability-percentage",
            "1000",
            "--max-trials",
            "3",
        ]
    )  # a shared 2-core machine never looks stable
    assert re.search(r"Concurrency: 2, throughput: [0-9.]+ infer/sec", output), output
    assert "error" not in output.lower().replace("errors: 0", "")
