"""One error table for both frontends: every error class has its HTTP status and gRPC code, the
frontends use exactly those, and real failures read the same over HTTP and gRPC."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import orjson
import pytest

from protocol import errors
from protocol.errors import ALL_ERROR_CLASSES, ServerError

EXPECTED: dict[type[ServerError], tuple[int, str]] = {
    errors.InvalidArgument: (400, "INVALID_ARGUMENT"),
    errors.NotFound: (404, "NOT_FOUND"),
    errors.Unavailable: (503, "UNAVAILABLE"),
    errors.Unsupported: (501, "UNIMPLEMENTED"),
    errors.InternalError: (500, "INTERNAL"),
    errors.AlreadyExists: (400, "ALREADY_EXISTS"),
    errors.Cancelled: (400, "CANCELLED"),
    errors.UnknownError: (400, "UNKNOWN"),
    errors.TooLarge: (413, "RESOURCE_EXHAUSTED"),
    errors.PermissionDenied: (403, "PERMISSION_DENIED"),
    errors.Overloaded: (503, "UNAVAILABLE"),
}


def test_every_error_class_is_in_the_table() -> None:
    assert set(ALL_ERROR_CLASSES) == set(EXPECTED)


@pytest.mark.parametrize("error_class", ALL_ERROR_CLASSES, ids=lambda c: c.__name__)
def test_status_pairs(error_class: type[ServerError]) -> None:
    http_status, grpc_name = EXPECTED[error_class]
    error = error_class("some message")
    assert error.http_status() == http_status
    assert error.grpc_status_name() == grpc_name
    assert grpc.StatusCode[error.grpc_status_name()] is getattr(grpc.StatusCode, grpc_name)
    assert error.message == str(error) == "some message"


class _Aborted(Exception):
    pass


class _FakeContext:
    """Records what a servicer aborts with."""

    code: grpc.StatusCode
    details: str

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata=()) -> None:
        self.code, self.details = code, details
        self.trailing_metadata = tuple(trailing_metadata)
        raise _Aborted


@pytest.mark.parametrize("error_class", ALL_ERROR_CLASSES, ids=lambda c: c.__name__)
def test_both_frontends_answer_through_the_table(error_class: type[ServerError]) -> None:
    from server.grpc.services import abort
    from server.http.responses import error_response

    error = error_class("the same text")
    response = error_response(error)
    assert response.status_code == error.http_status()
    assert orjson.loads(response.body) == {"error": "the same text"}
    context = _FakeContext()
    with pytest.raises(_Aborted):
        asyncio.run(abort(context, error))  # type: ignore[arg-type]
    assert context.code is grpc.StatusCode[error.grpc_status_name()]
    assert context.details == "the same text"


def test_unexpected_exceptions_are_internal_on_both() -> None:
    wrapped = errors.as_server_error(ValueError("boom"))
    assert isinstance(wrapped, errors.InternalError)
    assert (wrapped.http_status(), wrapped.grpc_status_name()) == (500, "INTERNAL")
    assert wrapped.message == "ValueError: boom"


# ----- end to end: the same failure over HTTP and over gRPC ---------------------------------
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
    from testmodels import write_queued_model

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
