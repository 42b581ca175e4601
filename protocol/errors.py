"""Every error the server can return, and the one table that maps it to HTTP and gRPC statuses.

Both frontends map errors only through `http_status()` (the HTTP frontend through the module's
`http_status`, which adds its --overload-status) and `grpc_status_name()`, so the same failure
always gives the matching status and the same message on both protocols (Triton's
HttpCodeFromError and its gRPC status mapping).
"""

from __future__ import annotations

import logging
from enum import Enum

from protocol.text import bounded_message


class ErrorCode(Enum):
    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    # Beyond Triton: a body or message over the configured size limit. Triton answers 400;
    # 413 tells clients and proxies plainly that the size, not the content, was refused.
    TOO_LARGE = "TOO_LARGE"
    # Beyond Triton: something the server was not started to allow (file overrides in the
    # load API without --allow-model-load-file-override).
    PERMISSION_DENIED = "PERMISSION_DENIED"
    # A full queue: UNAVAILABLE, with a hint of when to retry (Retry-After, `retry-after`
    # trailing metadata). Its HTTP status is 503 unless --overload-status says 429.
    OVERLOADED = "OVERLOADED"


# code -> (HTTP status, gRPC status code name)
_STATUS_TABLE: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.UNKNOWN: (400, "UNKNOWN"),
    ErrorCode.INTERNAL: (500, "INTERNAL"),
    ErrorCode.NOT_FOUND: (404, "NOT_FOUND"),
    ErrorCode.INVALID_ARG: (400, "INVALID_ARGUMENT"),
    ErrorCode.UNAVAILABLE: (503, "UNAVAILABLE"),
    ErrorCode.UNSUPPORTED: (501, "UNIMPLEMENTED"),
    ErrorCode.ALREADY_EXISTS: (400, "ALREADY_EXISTS"),
    ErrorCode.CANCELLED: (400, "CANCELLED"),
    ErrorCode.TOO_LARGE: (413, "RESOURCE_EXHAUSTED"),
    ErrorCode.PERMISSION_DENIED: (403, "PERMISSION_DENIED"),
    ErrorCode.OVERLOADED: (503, "UNAVAILABLE"),
}
OVERLOAD_HTTP_STATUSES = (503, 429)  # the first is the table's, as Triton answers


def overload_http_status(status: int) -> int:
    """`status` checked as the HTTP status of a full queue (--overload-status): 503 as Triton
    answers, or 429 for clients and proxies that retry on 429 only. gRPC stays UNAVAILABLE
    either way. The HTTP frontend is built with it; the table above is never changed."""
    if status not in OVERLOAD_HTTP_STATUSES:
        raise ValueError(f"overload status must be one of {OVERLOAD_HTTP_STATUSES}, got {status}")
    return status


class ServerError(Exception):
    """Base of every error that reaches a client. `message` is what the client reads: its
    control characters escaped and its length bounded (protocol/text.py), whatever client text
    it quotes, so it never forges a log line and always fits gRPC's metadata."""

    code: ErrorCode = ErrorCode.INTERNAL
    # True for an error a model itself answered (pb_utils.TritonError): the generate extension
    # answers those 400 with the model's text, as its protocol says a failed request is.
    from_model: bool = False

    def __init__(self, message: str) -> None:
        message = bounded_message(message)
        super().__init__(message)
        self.message = message

    def http_status(self) -> int:
        return _STATUS_TABLE[self.code][0]

    def grpc_status_name(self) -> str:
        return _STATUS_TABLE[self.code][1]


class InvalidArgument(ServerError):
    code = ErrorCode.INVALID_ARG


class NotFound(ServerError):
    code = ErrorCode.NOT_FOUND


class Unavailable(ServerError):
    code = ErrorCode.UNAVAILABLE


class InternalError(ServerError):
    code = ErrorCode.INTERNAL


class Unsupported(ServerError):
    code = ErrorCode.UNSUPPORTED


class AlreadyExists(ServerError):
    code = ErrorCode.ALREADY_EXISTS


class Cancelled(ServerError):
    code = ErrorCode.CANCELLED


class UnknownError(ServerError):
    code = ErrorCode.UNKNOWN


class TooLarge(ServerError):
    code = ErrorCode.TOO_LARGE


class PermissionDenied(ServerError):
    code = ErrorCode.PERMISSION_DENIED


class Overloaded(Unavailable):
    """A request refused because its queue is full. `retry_after` (whole seconds, at least 1)
    is when a retry may find room: HTTP sends it as Retry-After, gRPC as `retry-after`
    trailing metadata."""

    code = ErrorCode.OVERLOADED

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = max(1, int(retry_after))

    def __reduce__(self) -> tuple:
        """Pickled with its hint (a frontend process receives it from the model owner)."""
        return type(self), (self.message, self.retry_after)


ALL_ERROR_CLASSES: tuple[type[ServerError], ...] = (
    InvalidArgument,
    NotFound,
    Unavailable,
    InternalError,
    Unsupported,
    AlreadyExists,
    Cancelled,
    UnknownError,
    TooLarge,
    PermissionDenied,
    Overloaded,
)


def as_server_error(exc: BaseException) -> ServerError:
    """Wrap anything unexpected as INTERNAL so a client always gets a message, never a traceback."""
    if isinstance(exc, ServerError):
        return exc
    return InternalError(f"{type(exc).__name__}: {exc}")


def client_error(exc: BaseException, logger: logging.Logger, where: str) -> ServerError:
    """The error a client is answered with for `exc`, for both frontends' one mapping each.

    A ServerError is the answer as it is; anything else is a bug, so it is logged with its
    traceback on `logger` ("unexpected error in <where>": a path, an RPC) and answered as
    INTERNAL."""
    if isinstance(exc, ServerError):
        return exc
    logger.error("unexpected error in %s", where, exc_info=exc)
    return as_server_error(exc)


SERVER_EXITING = "Server exiting"


def http_status(error: ServerError, overload_status: int = OVERLOAD_HTTP_STATUSES[0]) -> int:
    """The HTTP status a frontend answers `error` with: the table's, except that a full queue
    answers `overload_status` (what the HTTP frontend was built with, --overload-status)."""
    return overload_status if error.code is ErrorCode.OVERLOADED else error.http_status()


def server_exiting() -> Unavailable:
    """What a request refused during shutdown gets (HTTP 503, gRPC UNAVAILABLE), built here so
    health, infer and open streams word it alike on both protocols."""
    return Unavailable(SERVER_EXITING)


# Where a model that answers through a stream cannot be called (Triton's texts).
HTTP_ENDPOINT = "HTTP end point"
GRPC_INFER_RPC = "ModelInfer RPC"


def decoupled_unsupported(endpoint: str) -> Unsupported:
    """A decoupled model called where exactly one answer is expected (HTTP infer, ModelInfer)."""
    return Unsupported(f"{endpoint} doesn't support models with decoupled transaction policy")
