"""What a Python model reads of its requests when the server sends only the details some
request needs: the requested output names (a request naming every output in the config's
order is sent as one naming none), ids and parameters, and a response sender that a model
which is not decoupled gets only when it asks for one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.python.backend import PythonBackend
from protocol.errors import InternalError
from protocol.types import InferRequest, RequestedOutput, Tensor
from tests.unit.backends.python.test_backend import make_backend, write_model

ECHO = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            seen = {"names": request.requested_output_names(), "id": request.request_id(),
                    "parameters": json.loads(request.parameters())}
            response = pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x),
                pb_utils.Tensor("SEEN", np.array([json.dumps(seen).encode()], np.object_))])
            mode = seen["parameters"].get("mode")
            if mode == "sender":
                request.get_response_sender().send(
                    response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif mode == "silent":
                pass
            else:
                responses.append(response)
        return responses or None
"""

CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] },
         { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[PythonBackend]:
    backend = make_backend(write_model(tmp_path, "echo", ECHO, CONFIG), CONFIG)
    backend.load()
    yield backend
    backend.unload()


def request(
    outputs: list[str] | None = None, request_id: str = "", **parameters: object
) -> InferRequest:
    x = np.ones((1, 2), np.float32)
    return InferRequest(
        "echo",
        "",
        request_id,
        [Tensor("X", "FP32", (1, 2), x)],
        None if outputs is None else [RequestedOutput(n) for n in outputs],
        dict(parameters),
    )


def run(backend: PythonBackend, requests: list[InferRequest]) -> list:
    inputs = [{t.name: t.data for t in r.inputs} for r in requests]
    return backend.execute_requests(inputs, requests)


def seen(result: dict) -> dict:
    return json.loads(result["SEEN"][0])


def test_each_request_sees_the_outputs_it_named(echo: PythonBackend) -> None:
    batches = [
        [request(), request(["Y", "SEEN"])],  # all in the config's order: nothing sent
        [request(["Y", "SEEN"]), request(["SEEN"]), request(["SEEN", "Y"]), request()],
    ]
    expected = [
        [["Y", "SEEN"], ["Y", "SEEN"]],
        [["Y", "SEEN"], ["SEEN"], ["SEEN", "Y"], ["Y", "SEEN"]],
    ]
    for batch, names in zip(batches, expected, strict=False):
        assert [seen(result)["names"] for result in run(echo, batch)] == names


def test_ids_and_parameters_reach_the_model_only_where_set(echo: PythonBackend) -> None:
    results = run(echo, [request(request_id="a", flag=True), request()])
    assert (seen(results[0])["id"], seen(results[0])["parameters"]) == ("a", {"flag": True})
    assert (seen(results[1])["id"], seen(results[1])["parameters"]) == ("", {})


def test_a_model_that_is_not_decoupled_may_answer_through_its_sender(echo: PythonBackend) -> None:
    answered, silent = run(echo, [request(mode="sender"), request(mode="silent")])
    assert np.array_equal(answered["Y"], np.ones((1, 2), np.float32))
    assert seen(answered)["parameters"] == {"mode": "sender"}
    assert isinstance(silent, InternalError) and "sent no response" in silent.message
