"""One mapping of errors per protocol: server/http/responses.py `http_error` (routed endpoints and
the direct infer path) and server/grpc/services.py `abort`/`rpc_error` (unary RPCs and streams)."""

from __future__ import annotations

import logging

import orjson
import pytest

from protocol import compression
from protocol.errors import InternalError, NotFound, Unavailable, Unsupported, server_exiting
from server.grpc.services import rpc_error
from server.http.responses import error_response, http_error


def test_server_errors_map_through_the_table_without_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    status, headers, body = http_error(NotFound("no model 'x'"), "/v2/models/x/infer")
    assert (status, headers, orjson.loads(body)) == (404, {}, {"error": "no model 'x'"})
    assert rpc_error(NotFound("no model 'x'"), "ModelInfer").message == "no model 'x'"
    assert not caplog.records


def test_an_unknown_encoding_says_which_ones_work() -> None:
    status, headers, _ = http_error(Unsupported("unsupported compression 'br'"), "/")
    assert status == 501 and headers == {"Accept-Encoding": compression.ACCEPT_ENCODING}


def test_unexpected_exceptions_are_logged_and_internal(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        status, headers, body = http_error(ValueError("boom"), "/v2/models/m/infer")
        error = rpc_error(KeyError("k"), "ModelInfer")
    assert (status, orjson.loads(body)) == (500, {"error": "ValueError: boom"})
    assert isinstance(error, InternalError) and error.message == "KeyError: 'k'"
    assert [r.exc_info is not None for r in caplog.records] == [True, True]
    assert "/v2/models/m/infer" in caplog.records[0].getMessage()


def test_the_asgi_response_carries_the_same_answer() -> None:
    response = error_response(Unsupported("unsupported compression 'br'"))
    assert response.status_code == 501
    assert response.headers["accept-encoding"] == compression.ACCEPT_ENCODING
    assert response.headers["content-type"] == "application/json"


def test_server_exiting_is_built_in_one_place() -> None:
    error = server_exiting()
    assert isinstance(error, Unavailable) and error.message == "Server exiting"
    assert (error.http_status(), error.grpc_status_name()) == (503, "UNAVAILABLE")


def test_a_full_queue_says_when_to_retry_on_both_protocols() -> None:
    import asyncio

    import grpc

    from protocol.errors import Overloaded, http_status, overload_http_status
    from server.grpc.services import abort

    class Context:
        async def abort(self, code, details, trailing_metadata=()) -> None:
            self.answer = (code, details, tuple(trailing_metadata))
            raise RuntimeError("aborted")

    error = Overloaded("Exceeds maximum queue size", retry_after=7)
    status, headers, body = http_error(error, "/v2/models/m/infer")
    assert (status, headers) == (503, {"Retry-After": "7"})
    assert orjson.loads(body) == {"error": "Exceeds maximum queue size"}
    assert error_response(error).headers["retry-after"] == "7"
    context = Context()
    with pytest.raises(RuntimeError):
        asyncio.run(abort(context, error))  # type: ignore[arg-type]
    assert context.answer == (
        grpc.StatusCode.UNAVAILABLE,
        "Exceeds maximum queue size",
        (("retry-after", "7"),),
    )
    # --overload-status=429: HTTP only; the frontend maps with it, the error table is unchanged
    assert http_error(error, "/", overload_http_status(429))[:2] == (429, {"Retry-After": "7"})
    assert error.grpc_status_name() == "UNAVAILABLE"
    only_a_full_queue = http_status(Unavailable("not ready"), overload_http_status(429))
    assert only_a_full_queue == 503
    with pytest.raises(ValueError):
        overload_http_status(500)
    assert Overloaded("x", retry_after=0).retry_after == 1  # never "retry at once"
