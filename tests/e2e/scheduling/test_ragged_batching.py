"""Ragged batching (Triton's allow_ragged_batch, batch_input, batch_output) against a server
subprocess: requests of different lengths run as one batch, for an ONNX model that reads where
each request ends from a batch input, and for a Python model. TRITONSERVER_DELAY_SCHEDULER=3
holds the batcher until all three requests are queued, so the batch is known."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from harness.serverproc import running_server
from harness.testmodels import write_python_model

pytestmark = pytest.mark.e2e
LENGTHS = (3, 4, 5)

RAGGED_CONFIG = """
name: "ragged"
backend: "onnxruntime"
max_batch_size: 16
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX"
                data_type: TYPE_FP32 source_input: "INPUT" } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "END" data_type: TYPE_FP32 dims: [ 1 ] } ]
batch_output [ { target_name: "OUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "INPUT" } ]
dynamic_batching { max_queue_delay_microseconds: 2000000 }
"""

ECHO_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        count = np.array([[len(requests)]], dtype=np.int32)
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() * 2),
            pb_utils.Tensor("TOGETHER", count)]) for r in requests]
"""

ECHO_CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 16
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "TOGETHER" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000000 }
"""


def _ragged_onnx(directory: Path) -> None:
    """OUT = 2 * INPUT (1-D, all requests joined); END = INDEX as a column (one row per request)."""
    import onnx
    from onnx import TensorProto, helper

    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT", "two"], ["OUT"]),
            helper.make_node("Unsqueeze", ["INDEX", "axes"], ["END"]),
        ],
        "ragged",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [-1]),
            helper.make_tensor_value_info("INDEX", TensorProto.FLOAT, [-1]),
        ],
        [
            helper.make_tensor_value_info("OUT", TensorProto.FLOAT, [-1]),
            helper.make_tensor_value_info("END", TensorProto.FLOAT, [-1, 1]),
        ],
        initializer=[axes, two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (directory / "1").mkdir(parents=True)
    onnx.save(model, str(directory / "1" / "model.onnx"))
    (directory / "config.pbtxt").write_text(RAGGED_CONFIG)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("ragged") / "repo"
    _ragged_onnx(root / "ragged")
    write_python_model(root, "echo", ECHO_MODEL, ECHO_CONFIG)
    with running_server(
        [root], env={"TRITONSERVER_DELAY_SCHEDULER": "3"}, log_dir=root.parent
    ) as process:
        yield process


def _send_three(server, model: str) -> list:
    """Three requests of lengths 3, 4 and 5, sent in that order (staggered), answered together."""
    results: list = [None] * len(LENGTHS)

    def send(index: int) -> None:
        data = np.arange(LENGTHS[index], dtype=np.float32).reshape(1, -1) + 10 * index
        with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
            tensor = httpclient.InferInput("INPUT", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            results[index] = (data, client.infer(model, [tensor]))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(LENGTHS))]
    for thread in threads:
        thread.start()
        time.sleep(0.3)
    for thread in threads:
        thread.join(60)
    return results


def test_onnx_requests_of_different_lengths_run_as_one_batch_with_batch_inputs(server) -> None:
    results = _send_three(server, "ragged")
    for index, (data, result) in enumerate(results):
        out = result.as_numpy("OUT")
        assert out.shape == data.shape  # scattered back with the request's own input shape
        np.testing.assert_array_equal(out, data * 2)
        # INDEX, the accumulated element count, said where this request ended in the batch.
        assert result.as_numpy("END").tolist() == [[float(sum(LENGTHS[: index + 1]))]]
    stats = httpx.get(f"{server.base}/v2/models/ragged/stats").json()["model_stats"][0]
    assert stats["execution_count"] == 1 and stats["inference_count"] == 3


def test_python_model_gets_ragged_requests_in_one_execute(server) -> None:
    results = _send_three(server, "echo")
    for data, result in results:
        np.testing.assert_array_equal(result.as_numpy("OUT"), data * 2)
        assert result.as_numpy("TOGETHER").tolist() == [[3]]
