"""gRPC on grpcio's synchronous server (`--grpc-server threads`), serving the same servicers.

Why: grpc.aio hands every completion from grpc core's threads to its poller thread and from
there to the event loop, one at a time: about ten context switches and ~140 µs of CPU per call
before our code runs (bench/FINDINGS.md, sections 9.2 and 17). grpcio's synchronous server runs
each call in one of its handler threads instead. The transport is all that differs: the
servicers of server/grpc/services.py (and the traffic and health services) still run on the
event loop, through a stand-in for grpc.aio's ServicerContext.

- Every RPC with one request message is registered as request-streaming, so its handler runs
  when the call opens and takes the message itself, within `--grpc-message-timeout`
  (server/grpc/message_wait.py): a call whose message never comes cannot keep its thread.
- `ModelInfer` takes raw bytes and the handler thread queues them for the loop and waits on a
  lock; the loop is woken once per burst of arrivals (one `call_soon_threadsafe` only when no
  drain is already scheduled) and admits the burst's requests together (`admission_group`: one
  dispatch pass per model version), with no task per request (`core.infer_nowait`). A message
  up to `--grpc-offload-threshold` is parsed, decoded, encoded and serialized on the loop (the
  thread only hands bytes to grpcio); a larger one is parsed and decoded in the thread, and a
  large answer serialized there (`_InferCall`).
- Every other unary RPC is the same hop, run as a task on the loop.
- Streams (`ModelStreamInfer`, `Health.Watch`) hold a handler thread each, pulling the
  servicer's async generator one answer at a time (so grpc's flow control still holds it
  back); a request stream is read by a thread of its own. At most `--grpc-thread-streams` are
  open at once; more are answered RESOURCE_EXHAUSTED, so streams cannot take every thread.
- A client's cancel or deadline cancels the call's task on the loop (`add_callback`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health_pb2_grpc

from protocol.errors import TooLarge
from protocol.grpc.message_plans import MessagePlans
from protocol.proto import grpc_service_pb2 as pb
from protocol.proto.grpc_service_pb2_grpc import add_GRPCInferenceServiceServicer_to_server
from protocol.proto.traffic_service_pb2_grpc import add_TrafficServiceServicer_to_server
from protocol.types import InferRequest
from server.core.api import CoreAPI
from server.grpc import direct_infer
from server.grpc.direct_infer import DirectInfer
from server.grpc.listener import HealthServicer, add_port, server_options
from server.grpc.loop_bridge import InferFrontend, InferOnLoop, LoopBridge, LoopCall
from server.grpc.message_wait import MessageWatch, NoMessage, one_message_required
from server.grpc.services import (
    InferenceServicer,
    StreamLimits,
    Undecodable,
    add_service,
    decode_received,
    infer_call_status,
    traced,
    traceparent_of,
)
from server.grpc.traffic import TrafficServicer
from server.settings import ServerSettings

log = logging.getLogger(__name__)

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
STOP_POLL_SECONDS = 0.05


def too_many_streams(limit: int) -> TooLarge:
    """RESOURCE_EXHAUSTED, as grpcio answers calls past maximum_concurrent_rpcs."""
    return TooLarge(f"more than {limit} streaming calls open at once (--grpc-thread-streams)")


class StandInContext:
    """What the servicers read from grpc.aio's ServicerContext, over the synchronous one.

    `abort` records the status and raises grpc.aio.AbortError as grpc.aio does; the handler
    thread then ends the call with that status (`finish`)."""

    __slots__ = ("sync", "code", "details", "trailing")

    def __init__(self, sync: grpc.ServicerContext) -> None:
        self.sync = sync
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing: Any = ()

    def invocation_metadata(self) -> Any:
        return self.sync.invocation_metadata()

    def peer(self) -> str:
        return self.sync.peer()

    def time_remaining(self) -> float | None:
        return self.sync.time_remaining()

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> NoReturn:
        self.code, self.details, self.trailing = code, details, trailing_metadata
        raise grpc.aio.AbortError()

    def finish(self) -> NoReturn:
        """In the handler thread: end the call with the status `abort` recorded."""
        if self.trailing:
            self.sync.set_trailing_metadata(self.trailing)
        self.sync.abort(self.code or grpc.StatusCode.UNKNOWN, self.details)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover


class _InferCall(InferOnLoop):
    """A ModelInfer call whose handler thread waits on `lock` for its outcome."""

    __slots__ = ("lock",)

    def __init__(
        self, frontend: InferFrontend, received: bytes | InferRequest, traceparent: str
    ) -> None:
        super().__init__(frontend, received, traceparent)
        self.lock = threading.Lock()
        self.lock.acquire()

    def deliver(self) -> None:
        self.lock.release()

    def wait(self) -> bytes:
        """In the handler thread: the serialized answer (or its error raised here)."""
        self.lock.acquire()
        self.waited = True
        return self.serialized()


async def _next(agen: AsyncIterator[Any]) -> Any:
    return await agen.__anext__()


async def _close(agen: Any) -> None:
    try:
        await agen.aclose()
    except Exception:
        pass


class _Requests:
    """A synchronous request stream read on the loop as an async iterator, by a reader thread."""

    def __init__(self, iterator: Iterator[Any], readers: ThreadPoolExecutor) -> None:
        self.iterator = iterator
        self.readers = readers

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> Any:
        loop = asyncio.get_running_loop()
        item = await loop.run_in_executor(self.readers, next, self.iterator, _END)
        if item is _END:
            raise StopAsyncIteration
        return item


_END = object()


class ThreadedGrpcFrontend:
    """The running synchronous gRPC server; the same interface as listener.GrpcFrontend."""

    def __init__(self, core: CoreAPI, settings: ServerSettings) -> None:
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        self.bridge = LoopBridge(self.loop)
        threads = settings.grpc_threads or settings.grpc_max_concurrent_rpcs
        self.threads = threads
        self.watch = MessageWatch(settings.grpc_message_timeout_ms / 1000)
        # Streams hold a thread each: at least one thread is always left for unary calls.
        self.stream_limit = max(1, min(settings.grpc_thread_streams, threads - 1))
        self.streams = threading.BoundedSemaphore(self.stream_limit)
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="grpc-handler")
        self.readers = ThreadPoolExecutor(self.stream_limit, thread_name_prefix="grpc-reader")
        self.server = grpc.server(
            self.pool,
            options=server_options(settings),
            interceptors=_interceptors(settings),
            maximum_concurrent_rpcs=settings.grpc_max_concurrent_rpcs,
        )
        self.core = core
        self.plans = MessagePlans()
        self.offload_threshold = settings.grpc_offload_threshold
        # ModelInfer off grpc core's completion queue, when this grpcio allows it
        self.direct = (
            DirectInfer(
                self,
                self.server,
                self.bridge,
                self.watch,
                self.pool,
                settings.grpc_restricted_protocol,
            )
            if direct_infer.available(self.server)
            else None
        )
        self.inference = InferenceServicer(
            core, settings.grpc_offload_threshold, StreamLimits.of(settings)
        )
        self.health = HealthServicer(core)
        capture = _Capture(self)
        add_service(capture, add_GRPCInferenceServiceServicer_to_server, self.inference)
        add_service(capture, health_pb2_grpc.add_HealthServicer_to_server, self.health)
        add_service(capture, add_TrafficServiceServicer_to_server, TrafficServicer(core))
        self.port = 0

    # ModelInfer's deserializer (add_service's, which never raises), run in the handler thread
    parse_infer: Callable[[bytes], Any] = staticmethod(pb.ModelInferRequest.FromString)

    def decode(self, data: bytes, traceparent: str) -> InferRequest:
        """A ModelInferRequest's bytes -> the request (refused as INVALID_ARGUMENT when the
        message does not parse)."""
        plans = self.plans  # metadata seen before (protocol/grpc/message_plans.py)
        key = plans.key_of(data)
        if key is not None:
            planned = plans.planned(key, data)
            if planned is not None:
                return traced(self.core, planned, traceparent)
        message = self.parse_infer(data)
        if type(message) is Undecodable:
            raise message.error
        request = decode_received(self.core, message, traceparent)
        if key is not None:
            plans.keep(key, message, request)
        return request

    # ----- handlers -------------------------------------------------------------------------
    def first(self, requests: Iterator[Any], context: grpc.ServicerContext, method: str) -> Any:
        """The call's one request message (a unary call's message, or a server stream's)."""
        try:
            return self.watch.first(requests, context)
        except NoMessage:
            if context.is_active():  # half-closed without it, as grpcio answers that
                context.abort(grpc.StatusCode.UNIMPLEMENTED, one_message_required(method))
            context.abort(grpc.StatusCode.CANCELLED, "no request message")  # moot: it has ended
            raise AssertionError("unreachable: abort raises") from None  # pragma: no cover

    def model_infer(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        """ModelInfer, the message's bytes to the answer's (_InferCall says what runs where);
        every failure answered through the one error table (services.grpc_status)."""
        data = self.first(requests, context, MODEL_INFER)
        try:
            traceparent = traceparent_of(self.core, context)
            if len(data) <= self.offload_threshold:
                call = _InferCall(self, data, traceparent)
            else:
                call = _InferCall(self, self.decode(data, traceparent), "")
            bridge = self.bridge
            if not context.add_callback(lambda: bridge.cancel(call)):
                raise asyncio.CancelledError()  # the call has already ended
            bridge.submit(call)
            return call.wait()
        except (asyncio.CancelledError, Exception) as exc:
            code, details, trailing = infer_call_status(exc)
        if trailing:
            context.set_trailing_metadata(trailing)
        context.abort(code, details)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    def unary(self, method: Any, name: str) -> Callable:
        def handler(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            request = self.first(requests, context, name)
            stand_in = StandInContext(context)
            try:
                return self.bridge.run(lambda: method(request, stand_in), context)
            except grpc.aio.AbortError:
                stand_in.finish()
            except asyncio.CancelledError:
                context.abort(grpc.StatusCode.CANCELLED, "cancelled")

        return handler

    def streaming(self, method: Any, request_streaming: bool, name: str) -> Callable:
        def handler(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
            if not self.streams.acquire(blocking=False):
                error = too_many_streams(self.stream_limit)
                context.abort(grpc.StatusCode[error.grpc_status_name()], error.message)
            try:
                request = requests if request_streaming else self.first(requests, context, name)
                yield from self._pump(method, request, context, request_streaming)
            finally:
                self.streams.release()

        return handler

    def _pump(
        self,
        method: Callable[[Any, Any], Any],
        request: Any,
        context: grpc.ServicerContext,
        request_streaming: bool,
    ) -> Iterator[Any]:
        """Pull the servicer's async generator one answer at a time from this thread."""
        stand_in = StandInContext(context)
        if request_streaming:
            request = _Requests(request, self.readers)
        agen = method(request, stand_in)
        bridge = self.bridge
        # The step being waited for, and whether the call has ended: one callback for the
        # stream. Set before the check on either side, so a step begun as the call ends is
        # cancelled by the callback or by this thread (twice is harmless).
        current: list[LoopCall] = []
        ended: list[bool] = []

        def end() -> None:
            ended.append(True)
            if current:
                bridge.cancel(current[0])

        if not context.add_callback(end):
            end()
        try:
            while True:
                step = LoopCall(lambda: _next(agen))
                current[:] = [step]
                bridge.submit(step)
                if ended:
                    bridge.cancel(step)
                try:
                    item = step.wait()
                except StopAsyncIteration:
                    return
                except grpc.aio.AbortError:
                    stand_in.finish()
                except asyncio.CancelledError:
                    return
                yield item
        finally:
            # The step's task has ended (the thread waited for it): the generator may close.
            closing = LoopCall(lambda: _close(agen))
            self.bridge.submit(closing)
            closing.lock.acquire()

    # ----- start and stop -------------------------------------------------------------------
    async def start(self) -> None:
        self.port = add_port(self.server, self.settings)
        self.watch.start()
        self.server.start()
        if self.direct is not None:
            self.direct.start()
        log.info(
            "gRPC served by grpcio's synchronous server: %d threads, %d streams; ModelInfer %s",
            self.threads,
            self.stream_limit,
            "off the completion queue" if self.direct is not None else "in handler threads",
        )

    async def stop(self, grace: float | None) -> None:
        self.health.close()
        self.inference.close()
        done = self.server.stop(grace)
        # The handler threads need the loop until they end: wait without blocking it.
        while not done.is_set():
            await asyncio.sleep(STOP_POLL_SECONDS)
        self.watch.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.readers.shutdown(wait=False, cancel_futures=True)


class _Capture:
    """Stands in for the server while add_service registers a service: each aio handler is
    wrapped for the synchronous server, and the wrapped service registered on it."""

    def __init__(self, frontend: ThreadedGrpcFrontend) -> None:
        self.frontend = frontend

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # add_registered_method_handlers below registers both ways

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        wrapped = {name: self._wrap(service, name, h) for name, h in handlers.items()}
        if self.frontend.direct is not None and MODEL_INFER == f"/{service}/ModelInfer":
            del wrapped["ModelInfer"]  # grpc core hands it to server/grpc/direct_infer.py
        server = self.frontend.server
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
        server.add_registered_method_handlers(service, wrapped)

    def _wrap(self, service: str, name: str, handler: grpc.RpcMethodHandler) -> Any:
        frontend = self.frontend
        # Every handler is registered request-streaming: it runs when the call opens, so a
        # message that never comes is bounded (server/grpc/message_wait.py).
        method_name = f"/{service}/{name}"
        if method_name == MODEL_INFER:
            if handler.request_deserializer is not None:
                frontend.parse_infer = handler.request_deserializer
            return grpc.stream_unary_rpc_method_handler(frontend.model_infer)
        if handler.response_streaming:
            method = handler.stream_stream or handler.unary_stream
            return grpc.stream_stream_rpc_method_handler(
                frontend.streaming(method, handler.request_streaming, method_name),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.request_streaming:  # no such RPC in these services
            raise TypeError(f"{service}/{name}: stream-unary is not served")
        return grpc.stream_unary_rpc_method_handler(
            frontend.unary(handler.unary_unary, method_name),
            handler.request_deserializer,
            handler.response_serializer,
        )


def _interceptors(settings: ServerSettings) -> list[grpc.ServerInterceptor]:
    if not settings.grpc_restricted_protocol:
        return []
    from server.grpc.restricted import RestrictedProtocolThreadInterceptor

    return [RestrictedProtocolThreadInterceptor(settings.grpc_restricted_protocol)]
