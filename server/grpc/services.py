"""The gRPC frontend's services: Triton's GRPCInferenceService on grpc.aio (the listener, its
options and grpc.health.v1 are in server/grpc/listener.py).

Every RPC decodes once through protocol/grpc/codec.py, calls server/core/inference_core.py, and maps
every error through protocol/errors.py, so a failure gives the same message as over HTTP and the
matching status code. Handlers run as tasks on the server's event loop: when a client cancels or its
deadline passes, grpc.aio cancels the task, which cancels the awaited scheduler future, so a queued
request is dropped (and counted CANCELED) instead of executed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from protocol import shared_memory
from protocol.errors import (
    GRPC_INFER_RPC,
    InvalidArgument,
    Overloaded,
    ServerError,
    Unavailable,
    Unsupported,
    client_error,
    server_exiting,
)
from protocol.grpc import codec, wire
from protocol.proto import grpc_service_pb2 as pb
from protocol.proto.grpc_service_pb2_grpc import GRPCInferenceServiceServicer
from protocol.types import InferRequest, InferResponse
from server.core.api import CoreAPI
from server.settings import (
    GRPC_STREAM_FIRST_REQUEST_TIMEOUT_MS,
    GRPC_STREAM_PENDING_SIZE,
    ServerSettings,
)

log = logging.getLogger(__name__)

# Clients send this metadata to get a failed stream request as a real gRPC status (closing the
# stream) instead of an error_message on an open stream.
STREAM_ERROR_HEADER = "triton_grpc_error"
HEALTH_POLL_SECONDS = 0.5
STREAM_OUTBOX_SIZE = 64  # answers of one ModelStreamInfer call waiting to be written
RETRY_AFTER_KEY = "retry-after"  # trailing metadata of a full-queue UNAVAILABLE


def grpc_status(error: ServerError) -> tuple[grpc.StatusCode, str, tuple]:
    """The status the one error table gives, the error's message and the trailing metadata:
    the one gRPC mapping of errors, for unary RPCs and streams alike, on both gRPC servers (see
    `rpc_error`). A full queue also says when to retry, in whole seconds, as `retry-after`."""
    code = grpc.StatusCode[error.grpc_status_name()]
    if isinstance(error, Overloaded):
        return code, error.message, ((RETRY_AFTER_KEY, str(error.retry_after)),)
    return code, error.message, ()


async def abort(context: grpc.aio.ServicerContext, error: ServerError) -> NoReturn:
    """End the RPC with `grpc_status(error)`."""
    code, message, trailing = grpc_status(error)
    if trailing:
        await context.abort(code, message, trailing_metadata=trailing)
    await context.abort(code, message)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


def infer_call_status(error: BaseException) -> tuple[grpc.StatusCode, str, tuple]:
    """A unary ModelInfer's failure -> its status (a cancel answers CANCELLED), on both ways
    `threads` serves the call (server/grpc/threaded.py, server/grpc/direct_infer.py)."""
    if isinstance(error, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED, "cancelled", ()
    if not isinstance(error, Exception):
        raise error
    return grpc_status(rpc_error(error, "ModelInfer"))


def rpc_error(exc: Exception, where: str) -> ServerError:
    """The error an RPC (or one streamed request) answers with; unexpected ones are logged."""
    return client_error(exc, log, where)


Unary = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


def guarded(handler: Unary) -> Unary:
    """Every failure becomes a gRPC status with its message; nothing escapes as UNKNOWN."""

    @functools.wraps(handler)
    async def rpc(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if type(request) is Undecodable:
                raise request.error
            return await handler(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            error = rpc_error(exc, handler.__name__)
        await abort(context, error)

    return rpc


# ----- undecodable messages -----------------------------------------------------------------
class Undecodable:
    """What a request message that does not parse becomes, instead of an exception.

    grpcio answers a request deserializer that raises with UNKNOWN ("Unexpected <class
    DecodeError>") before any handler runs, and offers no hook to change that status. So the
    deserializers registered here never raise: a malformed message arrives at its handler as
    this object, and the handler refuses it as INVALID_ARGUMENT (`guarded`, Health) or, in a
    stream, answers it like any other failed request."""

    __slots__ = ("error",)
    id = ""  # no request id can be read from it (stream answers echo one)

    def __init__(self, error: InvalidArgument) -> None:
        self.error = error


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:
            return Undecodable(InvalidArgument(f"malformed request message: {exc}"))

    return deserialize


class _HandlerCapture:
    """Stands in for the server while generated `add_*_to_server` code registers a service."""

    def __init__(self) -> None:
        self.generic: list[Any] = []
        self.registered: dict[str, dict[str, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.registered[service] = handlers


# ModelInfer's messages on the wire without protobuf's copies of the tensor bytes
# (protocol/grpc/wire.py): method -> (request deserializer, response serializer or None).
_INFER_SERVICE = "inference.GRPCInferenceService"
WIRE_CODECS: dict[tuple[str, str], tuple[Callable[[bytes], Any], Callable[[Any], bytes] | None]] = {
    (_INFER_SERVICE, "ModelInfer"): (wire.parse_infer_request, wire.serialize),
    (_INFER_SERVICE, "ModelStreamInfer"): (wire.parse_infer_request, wire.serialize),
}


def _wire_handler(service: str, name: str, handler: Any) -> Any:
    """The handler with WIRE_CODECS's (de)serializers where it names some, the deserializer
    lenient."""
    parse, serialize = WIRE_CODECS.get((service, name), (None, None))
    if serialize is not None:
        handler = handler._replace(response_serializer=serialize)
    if handler.request_deserializer is None:
        return handler
    return handler._replace(request_deserializer=_lenient(parse or handler.request_deserializer))


def add_service(server: Any, add_to_server: Callable[[Any, Any], None], servicer: Any) -> None:
    """`add_to_server(servicer, server)` (generated code), with request deserializers that
    turn a malformed message into `Undecodable` instead of raising, and ModelInfer's
    messages read and written by protocol/grpc/wire.py."""
    capture = _HandlerCapture()
    add_to_server(servicer, capture)
    if not capture.registered:  # generated code older than registered handlers: as it is
        server.add_generic_rpc_handlers(tuple(capture.generic))
        return
    for service, handlers in capture.registered.items():
        lenient = {
            name: _wire_handler(service, name, handler) for name, handler in handlers.items()
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, lenient),))
        server.add_registered_method_handlers(service, lenient)


def _no_repository_name(repository_name: str) -> None:
    if repository_name:
        raise Unsupported("'repository_name' specification is not supported")


# ----- streaming ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Failure:
    error: ServerError
    request_id: str


_END = object()


async def _infer(
    core: CoreAPI,
    message: codec.ReceivedRequest,
    traceparent: str = "",
    offload_threshold: int | None = None,
) -> wire.InferAnswer:
    """One inference, wire to wire (ModelInfer): a decoupled model is refused. The answer's
    outputs stay their arrays until grpc serializes it (WIRE_CODECS)."""
    request = await _decode(core, message, traceparent, offload_threshold)
    response = await core.infer(request, endpoint=GRPC_INFER_RPC)
    return await _encode(response, message.id, offload_threshold)


async def _decode(
    core: CoreAPI,
    message: codec.ReceivedRequest,
    traceparent: str,
    offload_threshold: int | None,
) -> InferRequest:
    """The request, with what tracing reads where it is possible: the client's traceparent
    (OpenTelemetry mode) and when the message arrived (grpc.aio hands it over already read,
    so the wait/read itself is not seen). Converting over `offload_threshold` bytes element by
    element (BYTES, typed contents) happens in a thread, in steps that let the loop run."""
    now = time.monotonic_ns() if core.may_trace else 0
    if offload_threshold is not None and codec.per_element_input_bytes(message) > offload_threshold:
        request = await asyncio.to_thread(codec.decode_infer_request, message)
    else:
        request = codec.decode_infer_request(message)
    return _traced(request, traceparent, now)


def decode_received(
    core: CoreAPI, message: codec.ReceivedRequest, traceparent: str
) -> InferRequest:
    """`_decode` where nothing else waits on the thread (the synchronous server's handler
    thread): no offload."""
    now = time.monotonic_ns() if core.may_trace else 0
    return _traced(codec.decode_infer_request(message), traceparent, now)


def traced(core: CoreAPI, request: InferRequest, traceparent: str) -> InferRequest:
    """A request decoded from its plan (protocol/grpc/message_plans.py), stamped as
    `decode_received` stamps one."""
    return _traced(request, traceparent, time.monotonic_ns() if core.may_trace else 0)


def _traced(request: InferRequest, traceparent: str, received_ns: int) -> InferRequest:
    request.traceparent = traceparent
    if received_ns:
        request.received = (
            ("GRPC_WAITREAD_START", received_ns),
            ("GRPC_WAITREAD_END", received_ns),
        )
    return request


async def _encode(
    response: InferResponse, request_id: str, offload_threshold: int | None
) -> wire.InferAnswer:
    """The answer on the wire, its outputs still their arrays until grpc serializes it
    (WIRE_CODECS); large BYTES outputs are serialized in a thread, as above."""
    if (
        offload_threshold is not None
        and codec.per_element_output_bytes(response) > offload_threshold
    ):
        return await asyncio.to_thread(codec.encode_infer_answer, response, request_id)
    return codec.encode_infer_answer(response, request_id)


def traceparent_of(core: CoreAPI, context: Any) -> str:
    """The client's W3C trace context, read only in OpenTelemetry trace mode."""
    if not core.propagates_trace:
        return ""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent" and isinstance(value, str):
            return value
    return ""


async def _stream_answers(
    core: CoreAPI,
    message: Any,
    traceparent: str = "",
    offload_threshold: int | None = None,
) -> AsyncIterator[Any]:
    """Every answer to one ModelStreamInfer request, wire to wire: each model answer with
    `triton_final_response`, a failed one as a _Failure; a decoupled model's flag-only final
    answer only when the request asked for empty final responses."""
    if type(message) is Undecodable:  # a malformed message (ModelInfer: `guarded`)
        raise message.error
    request = await _decode(core, message, traceparent, offload_threshold)
    empty_final = bool(request.parameters.get("triton_enable_empty_final_response", False))
    async for item in core.infer_stream(request):
        if item.error is not None:
            yield _Failure(item.error, message.id)
            if item.final and empty_final:
                yield codec.stream_empty_final(request.model_name, message.id)
        elif item.response is not None:
            yield codec.stream_response(
                await _encode(item.response, message.id, offload_threshold), item.final
            )
        elif empty_final:
            yield codec.stream_empty_final(request.model_name, message.id)


def _wants_status_errors(context: grpc.aio.ServicerContext) -> bool:
    for key, value in context.invocation_metadata() or ():
        if key.lower() == STREAM_ERROR_HEADER:
            return str(value).strip().lower() == "true"
    return False


@dataclass(frozen=True)
class StreamLimits:
    """What one ModelStreamInfer call may hold (--grpc-max-stream-pending-size,
    --grpc-stream-first-request-timeout): bytes of requests read but not yet answered plus
    answers not yet taken by grpc (past it, the stream's requests are not read until the client
    reads answers: HTTP/2 flow control then stops the client), and how long a stream may stay
    open before its first request (None: for ever)."""

    pending_bytes: int = GRPC_STREAM_PENDING_SIZE
    first_request_seconds: float | None = GRPC_STREAM_FIRST_REQUEST_TIMEOUT_MS / 1000

    @classmethod
    def of(cls, settings: ServerSettings) -> StreamLimits:
        timeout_ms = settings.grpc_stream_first_request_timeout_ms
        return cls(settings.grpc_max_stream_pending_size, timeout_ms / 1000 if timeout_ms else None)


class InferStream:
    """One ModelStreamInfer call. Each request runs in its own task, so several are in flight
    at once; answers go out in completion order, each carrying its request's id. The stream
    ends once reading has stopped and every request has been answered.

    Back-pressure: grpc.aio's write of an answer completes only once HTTP/2 flow control lets
    it out (the client's window), so a client that never reads leaves answers here. `held`
    counts their bytes and those of the requests in flight; while it is over the limit the
    reader reads no request, so grpc stops taking the client's (its window fills) and memory
    stays bounded. A request larger than the limit is still read when nothing else is held."""

    def __init__(
        self,
        core: CoreAPI,
        context: grpc.aio.ServicerContext,
        offload_threshold: int | None = None,
        limits: StreamLimits = StreamLimits(),
    ) -> None:
        self.core = core
        self.context = context
        self.offload_threshold = offload_threshold
        self.limits = limits
        self.raise_errors = _wants_status_errors(context)
        self.traceparent = traceparent_of(core, context)
        # Bounded: a decoupled model's answers wait here for a slow client, and past this many
        # its answers stay unread, so its sender blocks (backends/python/worker/bridge.py).
        # Entries are (answer, its bytes).
        self.outbox: asyncio.Queue[tuple[Any, int]] = asyncio.Queue(STREAM_OUTBOX_SIZE)
        self.tasks: set[asyncio.Task] = set()
        self.reader: asyncio.Task | None = None
        self.held = 0  # bytes of requests in flight and of answers not yet written
        self.room = asyncio.Event()  # set while `held` is within the limit
        self.room.set()
        self.closing = False
        self.cut_short = False  # shutdown stopped reading before the client finished
        self.no_request = False  # no first request within limits.first_request_seconds
        self._ended = False

    async def responses(
        self, requests: AsyncIterator[pb.ModelInferRequest]
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        if self.closing:  # the call arrived while the server was closing
            await abort(self.context, server_exiting())
        self.reader = asyncio.create_task(self._read(requests))
        self.reader.add_done_callback(lambda _: self._end_when_settled())
        try:
            while (entry := await self.outbox.get())[0] is not _END:
                item, size = entry
                if isinstance(item, _Failure):
                    if self.raise_errors:
                        await abort(self.context, item.error)
                    yield codec.stream_error(item.error.message, item.request_id)
                else:
                    yield item  # resumes once grpc has taken it (flow control)
                self._release(size)
        finally:
            self._cancel_all()
        if self.cut_short:
            await abort(self.context, server_exiting())
        if self.no_request:
            await abort(self.context, no_first_request(self.limits.first_request_seconds))

    def close(self) -> None:
        """Server shutdown: read no more requests, answer those in flight, then end."""
        self.closing = True
        if self.reader is not None and not self.reader.done():
            self.cut_short = True
            self.reader.cancel()

    async def _read(self, requests: AsyncIterator[pb.ModelInferRequest]) -> None:
        """Read requests, none while over the pending limit; the first within its time."""
        iterator = requests.__aiter__()
        limit = self.limits.pending_bytes
        try:
            first = True
            while True:
                if self.held > limit:
                    self.room.clear()
                    await self.room.wait()
                try:
                    if first:
                        first = False
                        message = await asyncio.wait_for(
                            iterator.__anext__(), self.limits.first_request_seconds
                        )
                    else:
                        message = await iterator.__anext__()
                except StopAsyncIteration:
                    return
                except TimeoutError:  # only the first read has a time limit
                    self.no_request = True
                    return
                self._admit(message)
        except Exception as exc:
            log.debug("stream read ended: %s", exc)

    def _admit(self, message: pb.ModelInferRequest) -> None:
        size = message.ByteSize() if type(message) is not Undecodable else 0
        self.held += size
        task = asyncio.create_task(self._answer(message, size))
        self.tasks.add(task)
        task.add_done_callback(self._answered)

    def _release(self, size: int) -> None:
        self.held -= size
        if self.held <= self.limits.pending_bytes:
            self.room.set()

    def _answered(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self._end_when_settled()

    def _end_when_settled(self) -> None:
        """Queue the end marker (after every answer) once reading stopped and none is left."""
        if not self._ended and self.reader is not None and self.reader.done() and not self.tasks:
            self._ended = True
            if self.outbox.full():  # the consumer is draining it; it ends after the rest
                asyncio.get_running_loop().create_task(self.outbox.put((_END, 0)))
            else:
                self.outbox.put_nowait((_END, 0))

    async def _answer(self, message: pb.ModelInferRequest, size: int) -> None:
        """Every answer to one request into the outbox; the request's bytes count until then."""
        try:
            async for item in _stream_answers(
                self.core, message, self.traceparent, self.offload_threshold
            ):
                await self._put(item)
        except Exception as exc:
            await self._put(_Failure(rpc_error(exc, "a streamed inference"), message.id))
        finally:
            self._release(size)

    async def _put(self, item: Any) -> None:
        size = len(item.error.message) if type(item) is _Failure else item.ByteSize()
        self.held += size
        await self.outbox.put((item, size))

    def _cancel_all(self) -> None:
        """The call ended (client cancel, deadline, error): nothing it started may run on."""
        if self.reader is not None and not self.reader.done():
            self.reader.cancel()
        for task in list(self.tasks):
            task.cancel()


def no_first_request(seconds: float | None) -> Unavailable:
    """A stream that sent no request in time: UNAVAILABLE, which clients may retry."""
    return Unavailable(
        f"no request on this stream within {seconds:g} s (--grpc-stream-first-request-timeout)"
    )


# ----- the inference service ----------------------------------------------------------------
class InferenceServicer(GRPCInferenceServiceServicer):
    def __init__(
        self,
        core: CoreAPI,
        offload_threshold: int | None = None,
        stream_limits: StreamLimits = StreamLimits(),
    ) -> None:
        """`offload_threshold`: --grpc-offload-threshold (None: every conversion on the loop);
        `stream_limits`: what one ModelStreamInfer call may hold."""
        self.core = core
        self.offload_threshold = offload_threshold
        self.stream_limits = stream_limits
        self.streams: set[InferStream] = set()
        self.closing = False

    def close(self) -> None:
        """Shutdown: end every open stream, and any that starts from now on."""
        self.closing = True
        for stream in list(self.streams):
            stream.close()

    # ----- health and metadata ------------------------------------------------------------
    def _not_exiting(self) -> None:
        """While shutting down, health answers UNAVAILABLE "Server exiting", as over HTTP."""
        if self.core.exiting:
            raise server_exiting()

    @guarded
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Any
    ) -> pb.ServerLiveResponse:
        self._not_exiting()
        return pb.ServerLiveResponse(live=self.core.live())

    @guarded
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: Any
    ) -> pb.ServerReadyResponse:
        self._not_exiting()
        return pb.ServerReadyResponse(ready=self.core.ready())

    @guarded
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        """Unknown models and versions are not ready, never an error (tritonclient raises)."""
        return pb.ModelReadyResponse(ready=self.core.model_ready(request.name, request.version))

    @guarded
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        return codec.encode_server_metadata(self.core.server_metadata())

    @guarded
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        return codec.encode_model_metadata(self.core.model_metadata(request.name, request.version))

    @guarded
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: Any
    ) -> pb.ModelConfigResponse:
        return codec.encode_model_config(self.core.model_config(request.name, request.version))

    @guarded
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        return codec.encode_statistics_response(self.core.statistics(request.name, request.version))

    # ----- inference ----------------------------------------------------------------------
    @guarded
    async def ModelInfer(  # answers wire.InferAnswer (WIRE_CODECS)
        self, request: codec.ReceivedRequest, context: grpc.aio.ServicerContext
    ) -> wire.InferAnswer:
        return await _infer(
            self.core, request, traceparent_of(self.core, context), self.offload_threshold
        )

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        stream = InferStream(self.core, context, self.offload_threshold, self.stream_limits)
        if self.closing:
            stream.close()
        self.streams.add(stream)
        try:
            async for response in stream.responses(request_iterator):
                yield response
        finally:
            self.streams.discard(stream)

    # ----- repository ---------------------------------------------------------------------
    @guarded
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        _no_repository_name(request.repository_name)
        return codec.encode_repository_index(self.core.repository_index(request.ready))

    @guarded
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        _no_repository_name(request.repository_name)
        config, files = codec.decode_load_parameters(request.model_name, request.parameters)
        await self.core.load_model(request.model_name, config, files or None)
        return pb.RepositoryModelLoadResponse()

    @guarded
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        _no_repository_name(request.repository_name)
        dependents = codec.decode_unload_dependents(request.parameters)
        await self.core.unload_model(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # ----- shared memory (server/core/client_shm.py; CUDA: none on this server) ----------------
    @guarded
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        return codec.encode_system_shm_status(self.core.system_shared_memory_status(request.name))

    @guarded
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.core.register_system_shared_memory(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @guarded
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.core.unregister_system_shared_memory(request.name)  # "" means all
        return pb.SystemSharedMemoryUnregisterResponse()

    @guarded
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        self.core.cuda_shared_memory_status(request.name)  # always empty, or NOT_FOUND
        return pb.CudaSharedMemoryStatusResponse()

    @guarded
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        raise shared_memory.cuda_unsupported(request.name)

    @guarded
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()

    # ----- trace and logging --------------------------------------------------------------
    @guarded
    async def TraceSetting(
        self, request: pb.TraceSettingRequest, context: Any
    ) -> pb.TraceSettingResponse:
        changes = codec.decode_trace_settings(request.settings) if request.settings else None
        return codec.encode_trace_settings(self.core.trace_settings(request.model_name, changes))

    @guarded
    async def LogSettings(
        self, request: pb.LogSettingsRequest, context: Any
    ) -> pb.LogSettingsResponse:
        changes = codec.decode_log_settings(request.settings) if request.settings else None
        return codec.encode_log_settings(self.core.log_settings(changes))
