"""Python models (`backend: "python"`) against a real server subprocess, with tritonclient.

The `add_sub` model is written exactly as Triton's python backend documents it. Others cover
BYTES tensors, per-request errors, dynamic batching, and the worker supervision: a SIGKILLed
worker fails only its in-flight request, comes back, and after 3 crashes within 60 s the
model stops being ready.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness.procutil import wait_for
from harness.serverproc import ServerProcess, running_server
from harness.testmodels import SLEEPER_MODEL, sleeper_config, write_python_model

pytestmark = pytest.mark.e2e

ADD_SUB_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Your Python model must use the same class name. Every Python model
    that is created must have "TritonPythonModel" as the class name.
    """

    def initialize(self, args):
        # You must parse model_config. JSON string is not parsed here
        self.model_config = model_config = json.loads(args["model_config"])

        # Get OUTPUT0 configuration
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")

        # Get OUTPUT1 configuration
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")

        # Convert Triton types to numpy types
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        output0_dtype = self.output0_dtype
        output1_dtype = self.output1_dtype

        responses = []

        # Every Python backend must iterate over everyone of the requests
        # and create a pb_utils.InferenceResponse for each of them.
        for request in requests:
            # Get INPUT0
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            # Get INPUT1
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")

            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )

            # Create output tensors. You need pb_utils.Tensor
            # objects to create pb_utils.InferenceResponse.
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(output1_dtype))

            inference_response = pb_utils.InferenceResponse(
                output_tensors=[out_tensor_0, out_tensor_1]
            )
            responses.append(inference_response)

        # You should return a list of pb_utils.InferenceResponse. Length
        # of this list must match the length of `requests` list.
        return responses

    def finalize(self):
        print("Cleaning up...")
'''

ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"

input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
input [
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]

instance_group [{ kind: KIND_CPU }]
"""

UPPER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            if any(item == b"fail" for item in text.reshape(-1)):
                code = pb_utils.TritonError.INVALID_ARG
                error = pb_utils.TritonError("cannot shout 'fail'", code)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            upper = np.array([item.upper() for item in text.reshape(-1)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("UPPER", upper.reshape(text.shape))]))
        return responses
"""

UPPER_CONFIG = """
name: "upper"
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

# Doubles its input and reports how many requests the call to execute received.
BATCHER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            count = np.full((x.shape[0], 1), len(requests), dtype=np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("Y", x * 2), pb_utils.Tensor("REQUESTS", count)]))
        return responses
"""

BATCHER_CONFIG = """
name: "batcher"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] },
         { name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 200000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

MODELS = {
    "add_sub": (ADD_SUB_MODEL, ADD_SUB_CONFIG),
    "upper": (UPPER_MODEL, UPPER_CONFIG),
    "batcher": (BATCHER_MODEL, BATCHER_CONFIG),
    "sleeper": (SLEEPER_MODEL, sleeper_config("sleeper")),
    "fragile": (SLEEPER_MODEL, sleeper_config("fragile")),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("python_models")
    for name, (source, config) in MODELS.items():
        write_python_model(repo, name, source, config)
    with running_server(
        [repo], ["--exit-timeout-secs", "10"], log_dir=tmp_path_factory.mktemp("logs")
    ) as process:
        yield process


def http_client(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url, network_timeout=30.0)


def sleeper_inputs(module, seconds: float):  # type: ignore[no-untyped-def]
    tensor = module.InferInput("SECONDS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    return [tensor]


def sleeper_pid(server: ServerProcess, model: str = "sleeper", seconds: float = 0.0) -> int:
    result = http_client(server).infer(model, sleeper_inputs(httpclient, seconds))
    return int(result.as_numpy("PID")[0])


def wait_model_ready(server: ServerProcess, model: str, timeout: float = 10.0) -> None:
    wait_for(
        lambda: httpx.get(f"{server.base}/v2/models/{model}/ready").status_code == 200,
        f"model '{model}' to become ready again",
        timeout,
        interval=0.02,
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_documented_add_sub_model(server: ServerProcess, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = (
        http_client(server)
        if protocol == "http"
        else grpcclient.InferenceServerClient(server.grpc_url)
    )
    in0 = np.random.default_rng(0).random(4, dtype=np.float32)
    in1 = np.random.default_rng(1).random(4, dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(in1)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    result = client.infer("add_sub", inputs, outputs=outputs)
    assert np.allclose(result.as_numpy("OUTPUT0"), in0 + in1)
    assert np.allclose(result.as_numpy("OUTPUT1"), in0 - in1)
    assert client.is_model_ready("add_sub")


def test_metadata_names_the_python_backend(server: ServerProcess) -> None:
    metadata = http_client(server).get_model_metadata("add_sub")
    assert metadata["platform"] == "python"
    config = http_client(server).get_model_config("add_sub")
    assert config["backend"] == "python"
    assert config["default_model_filename"] == "model.py"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_tensors_and_model_errors(server: ServerProcess, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = (
        http_client(server)
        if protocol == "http"
        else grpcclient.InferenceServerClient(server.grpc_url)
    )
    text = module.InferInput("TEXT", [3], "BYTES")
    text.set_data_from_numpy(np.array([b"hello", b"", b"w\xc3\xb6rld"], dtype=np.object_))
    result = client.infer("upper", [text])
    assert list(result.as_numpy("UPPER")) == [b"HELLO", b"", b"W\xc3\xb6RLD"]
    bad = module.InferInput("TEXT", [1], "BYTES")
    bad.set_data_from_numpy(np.array([b"fail"], dtype=np.object_))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("upper", [bad])
    assert "cannot shout 'fail'" in caught.value.message()
    expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert caught.value.status() == expected


def test_dynamic_batching_hands_several_requests_to_execute(server: ServerProcess) -> None:
    results: list[np.ndarray] = []
    lock = threading.Lock()

    def send(value: float) -> None:
        tensor = httpclient.InferInput("X", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.full((1, 2), value, np.float32))
        result = http_client(server).infer("batcher", [tensor])
        assert np.array_equal(result.as_numpy("Y"), np.full((1, 2), 2 * value, np.float32))
        with lock:
            results.append(result.as_numpy("REQUESTS"))

    threads = [threading.Thread(target=send, args=(float(i),)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 6
    assert max(int(r[0, 0]) for r in results) > 1  # execute saw a list of requests
    stats = http_client(server).get_inference_statistics("batcher")["model_stats"][0]
    assert int(stats["inference_count"]) == 6
    assert int(stats["execution_count"]) < 6


def test_killed_worker_fails_only_in_flight_requests_and_comes_back(server: ServerProcess) -> None:
    pid = sleeper_pid(server)
    outcomes: dict[str, object] = {}

    def call(key: str, seconds: float) -> None:
        started = time.monotonic()
        try:
            outcomes[key] = sleeper_pid(server, seconds=seconds)
        except InferenceServerException as exc:
            outcomes[key] = exc
        outcomes[key + "_s"] = time.monotonic() - started

    in_flight = threading.Thread(target=call, args=("in_flight", 5.0))
    in_flight.start()
    time.sleep(0.3)  # now running inside the worker
    queued = [threading.Thread(target=call, args=(f"queued{i}", 0.0)) for i in range(3)]
    for thread in queued:
        thread.start()
    time.sleep(0.2)  # queued behind it (one instance)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    saw_not_ready = False
    while time.monotonic() - killed_at < 3:
        if httpx.get(f"{server.base}/v2/models/sleeper/ready").status_code != 200:
            saw_not_ready = True
            break
        time.sleep(0.005)
    in_flight.join(10)
    for thread in queued:
        thread.join(20)
    error = outcomes["in_flight"]
    assert isinstance(error, InferenceServerException), error
    assert error.status() == "503"
    assert "was killed by SIGKILL" in error.message()
    assert outcomes["in_flight_s"] < 0.3 + 0.2 + 1.0 + 0.5  # failed within ~1 s of the kill
    for i in range(3):  # the queued requests ran on the new worker
        assert isinstance(outcomes[f"queued{i}"], int), outcomes[f"queued{i}"]
        assert outcomes[f"queued{i}"] != pid
    assert saw_not_ready
    wait_model_ready(server, "sleeper")
    assert sleeper_pid(server) not in (pid, 0)
    assert server.alive()


def test_three_crashes_within_a_minute_make_the_model_unavailable(server: ServerProcess) -> None:
    for _ in range(3):
        wait_model_ready(server, "fragile")
        pid = sleeper_pid(server, "fragile")
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    wait_for(
        lambda: httpx.get(f"{server.base}/v2/models/fragile/ready").status_code != 200,
        "the model to stop being ready after 3 crashes",
        timeout=10,
    )
    with pytest.raises(InferenceServerException) as caught:
        sleeper_pid(server, "fragile")
    assert (
        "crashed 3 times within 60 s" in caught.value.message()
        or "not at ready state" in caught.value.message()
    )
    with pytest.raises(InferenceServerException) as again:
        sleeper_pid(server, "fragile")
    assert again.value.status() == "503"
    index = {
        entry["name"]: entry
        for entry in httpx.post(f"{server.base}/v2/repository/index", json={}).json()
    }
    assert index["fragile"]["state"] == "UNAVAILABLE"
    assert "crashed 3 times within 60 s" in index["fragile"]["reason"]
    assert server.alive()
    assert sleeper_pid(server) > 0  # other Python models keep serving
