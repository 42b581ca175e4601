"""The HTTP answers every route shares: JSON bodies, empty answers and the one mapping of errors.

Why a module: the routed endpoints (server/http/routes.py), their sub-routers (admin.py,
generate.py) and the direct infer path (fast_path.py) all answer through these, and none of them
should import another's frontend class to reach them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from protocol import compression
from protocol.errors import (
    OVERLOAD_HTTP_STATUSES,
    Overloaded,
    ServerError,
    Unsupported,
    client_error,
    http_status,
)
from protocol.rest import encode as rest_encode
from server.http.body import BodyBudgetExhausted

log = logging.getLogger(__name__)

JSON = "application/json"

Handler = Callable[[Request], Awaitable[Response]]


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type=JSON)


def empty(status: int = 200) -> Response:
    return Response(b"", status_code=status)


def error_headers(error: ServerError) -> dict[str, str]:
    """An unknown Content-Encoding answer tells the client which encodings work; a full queue
    (503, or 429 with --overload-status) says in whole seconds when to come back; a body refused
    by the in-flight budget closes its connection (the rest of it is never read)."""
    if isinstance(error, Overloaded):
        if isinstance(error, BodyBudgetExhausted):
            return {"Retry-After": str(error.retry_after), "Connection": "close"}
        return {"Retry-After": str(error.retry_after)}
    if isinstance(error, Unsupported) and "compression" in error.message:
        return {"Accept-Encoding": compression.ACCEPT_ENCODING}
    return {}


DEFAULT_OVERLOAD_STATUS = OVERLOAD_HTTP_STATUSES[0]


def http_error(
    exc: BaseException, where: str, overload_status: int = DEFAULT_OVERLOAD_STATUS
) -> tuple[int, dict[str, str], bytes]:
    """Any failure as (status, extra headers, JSON body): the one HTTP mapping of errors, for
    the routed endpoints and the direct infer path (server/http/fast_path.py) alike; a full
    queue answers `overload_status` (the frontend's --overload-status).
    Unexpected (non-ServerError) exceptions are logged and answered as INTERNAL."""
    error = client_error(exc, log, where)
    status = http_status(error, overload_status)
    return status, error_headers(error), rest_encode.encode_error(error.message)


def error_response(
    exc: BaseException, where: str = "", overload_status: int = DEFAULT_OVERLOAD_STATUS
) -> Response:
    status, headers, body = http_error(exc, where, overload_status)
    return Response(body, status_code=status, headers=headers, media_type=JSON)


def guarded(handler: Handler, overload_status: int = DEFAULT_OVERLOAD_STATUS) -> Handler:
    """Every failure becomes a JSON error with its mapped status; nothing escapes as a 500 page."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ClientDisconnect:  # gone, or its body abandoned (--http-body-timeout-secs)
            return empty(400)  # never sent: uvicorn drops answers to a disconnected request
        except Exception as exc:
            return error_response(exc, request.url.path, overload_status)

    endpoint.__name__ = handler.__name__
    return endpoint
