"""Real failures read the same over HTTP and gRPC: a server's answers to the same bad requests
have the status and code of the one error table (EXPECTED, checked in
tests/unit/protocol/test_errors.py) and the same text."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from protocol import errors
from tests.unit.protocol.test_errors import EXPECTED


def _http_simple(a: np.ndarray, b: np.ndarray) -> dict:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": list(a.shape),
                "datatype": "INT32",
                "data": a.ravel().tolist(),
            },
            {
                "name": "INPUT1",
                "shape": list(b.shape),
                "datatype": "INT32",
                "data": b.ravel().tolist(),
            },
        ]
    }


def _grpc_simple(a: np.ndarray, b: np.ndarray) -> list:
    import tritonclient.grpc as grpcclient

    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), "INT32"),
        grpcclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _grpc_failure(server, model: str, version: str, inputs: list) -> tuple[str, str]:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as error:
            client.infer(model, inputs, model_version=version)
    return error.value.status(), error.value.message()


def _http_failure(server, model: str, version: str, body: dict) -> tuple[int, str]:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    reply = httpx.post(server.base + path, json=body, timeout=30)
    return reply.status_code, reply.json()["error"]


def _assert_same(http: tuple[int, str], grpc_answer: tuple[str, str], expected: type) -> None:
    http_status, grpc_name = EXPECTED[expected]
    assert http[0] == http_status
    assert grpc_answer[0] == f"StatusCode.{grpc_name}"
    assert http[1] == grpc_answer[1]


A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), np.int32)
FAILURES = [
    ("unknown model", "no_such_model", "", A, B, errors.NotFound, "no_such_model"),
    ("unknown version", "simple", "5", A, B, errors.NotFound, "version 5"),
    ("wrong shape", "simple", "", A[:, :8], B[:, :8], errors.InvalidArgument, "unexpected shape"),
    (
        "batch too large",
        "simple",
        "",
        np.tile(A, (9, 1)),
        np.tile(B, (9, 1)),
        errors.InvalidArgument,
        "batch-size must be <= 8",
    ),
]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "case, model, version, a, b, expected, fragment", FAILURES, ids=[f[0] for f in FAILURES]
)
def test_same_failure_same_answer(
    example_server, case, model, version, a, b, expected, fragment
) -> None:
    http = _http_failure(example_server, model, version, _http_simple(a, b))
    grpc_answer = _grpc_failure(example_server, model, version, _grpc_simple(a, b))
    _assert_same(http, grpc_answer, expected)
    assert fragment in http[1]


@pytest.fixture(scope="module")
def queued_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from harness.testmodels import write_queued_model

    return write_queued_model(tmp_path_factory.mktemp("queued_models"), 1_500_000)


@pytest.mark.e2e
def test_queue_full_reads_the_same(queued_repository: Path, tmp_path: Path) -> None:
    """One request fills the queue (it waits 1.5 s for a batch); the next is refused at once,
    with the same status and text over both protocols."""
    import tritonclient.grpc as grpcclient

    from harness.serverproc import running_server

    data = np.zeros((1, 256), np.float32)
    tensor = grpcclient.InferInput("INPUT", [1, 256], "FP32")
    tensor.set_data_from_numpy(data)
    body = {
        "inputs": [
            {"name": "INPUT", "shape": [1, 256], "datatype": "FP32", "data": data.ravel().tolist()}
        ]
    }
    with running_server([queued_repository], log_dir=tmp_path) as server:
        first: dict = {}

        def hold_the_queue() -> None:
            first["reply"] = httpx.post(
                server.base + "/v2/models/queued/infer", json=body, timeout=30
            )

        holder = threading.Thread(target=hold_the_queue)
        holder.start()
        time.sleep(0.4)
        http = _http_failure(server, "queued", "", body)
        grpc_answer = _grpc_failure(server, "queued", "", [tensor])
        holder.join(30)
    _assert_same(http, grpc_answer, errors.Unavailable)
    assert "Exceeds maximum queue size" in http[1]
    assert first["reply"].status_code == 200
