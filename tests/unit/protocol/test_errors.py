"""One error table for both frontends: every error class has its HTTP status and gRPC code, the
frontends use exactly those. (That real failures read the same over HTTP and gRPC is in
tests/e2e/hostile_input/test_error_table.py.)"""

from __future__ import annotations

import asyncio

import grpc
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
    from server.http.routes import error_response

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
