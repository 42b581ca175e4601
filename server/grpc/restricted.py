"""The gRPC side of restricted APIs (server/restricted.py): a server interceptor, installed only
when --grpc-restricted-protocol names a category, that answers a call in a restricted category
without its `triton-grpc-protocol-<key>` metadata UNAVAILABLE, as Triton does, before any
handler (or request parsing) runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc

from server.restricted import Restriction, grpc_category


def refusal_text(restriction: Restriction) -> str:
    return f"This protocol is restricted, expecting header '{restriction.header}'"


def refused_by(
    restrictions: Mapping[str, Restriction], details: grpc.HandlerCallDetails
) -> Restriction | None:
    """The restriction that refuses this call (its category is restricted and the call lacks
    the header, or the header's value is not allowed), or None when the call may proceed."""
    category = grpc_category(details.method)
    restriction = restrictions.get(category) if category else None
    if restriction is None:
        return None
    for key, value in details.invocation_metadata or ():
        if key == restriction.header:
            allowed = restriction.allows(value if isinstance(value, str) else None)
            return None if allowed else restriction
    return restriction


def _shaped_like(
    handler: grpc.RpcMethodHandler, unary: Callable[..., Any], streaming: Callable[..., Any]
) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s shape running `unary` or `streaming` (the request is never
    parsed: no deserializer)."""
    serializer = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, None, serializer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming, None, serializer)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, None, serializer)
    return grpc.unary_unary_rpc_method_handler(unary, None, serializer)


class RestrictedProtocolInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, restrictions: Mapping[str, Restriction]) -> None:
        self.restrictions = dict(restrictions)

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        restriction = refused_by(self.restrictions, details)
        handler = await continuation(details)
        if restriction is None or handler is None:
            return handler
        return _refusing(handler, refusal_text(restriction))


def _refusing(handler: grpc.RpcMethodHandler, text: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape that only aborts."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, text)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, text)
        yield  # pragma: no cover - an async generator that never yields

    return _shaped_like(handler, unary, streaming)


class RestrictedProtocolThreadInterceptor(grpc.ServerInterceptor):
    """The same check for grpcio's synchronous server (--grpc-server threads)."""

    def __init__(self, restrictions: Mapping[str, Restriction]) -> None:
        self.restrictions = dict(restrictions)

    def intercept_service(
        self,
        continuation: Callable[[Any], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        restriction = refused_by(self.restrictions, details)
        handler = continuation(details)
        if restriction is None or handler is None:
            return handler
        return _refusing_sync(handler, refusal_text(restriction))


def _refusing_sync(handler: grpc.RpcMethodHandler, text: str) -> grpc.RpcMethodHandler:
    def unary(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAVAILABLE, text)

    def streaming(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAVAILABLE, text)
        yield  # pragma: no cover - a generator that never yields

    return _shaped_like(handler, unary, streaming)
