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
- `ModelInfer` takes raw bytes: the handler thread parses the message, queues the call for the
  loop and waits on a lock; the loop is woken once per burst of arrivals (one
  `call_soon_threadsafe` only when no drain is already scheduled), starts each call as a task,
  and the task's end releases the thread, which serializes the answer.
- Every other unary RPC is the same hop, without the fast parse.
- Streams (`ModelStreamInfer`, `Health.Watch`) hold a handler thread each, pulling the
  servicer's async generator one answer at a time (so grpc's flow control still holds it
  back); a request stream is read by a thread of its own. At most `--grpc-thread-streams` are
  open at once; more are answered RESOURCE_EXHAUSTED, so streams cannot take every thread.
- A client's cancel or deadline cancels the call's task on the loop (`add_callback`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health_pb2_grpc

from protocol.errors import TooLarge
from protocol.proto import grpc_service_pb2 as pb
from protocol.proto.grpc_service_pb2_grpc import add_GRPCInferenceServiceServicer_to_server
from protocol.proto.traffic_service_pb2_grpc import add_TrafficServiceServicer_to_server
from server.core.api import CoreAPI
from server.grpc.listener import HealthServicer, add_port, server_options
from server.grpc.message_wait import MessageWatch, NoMessage, one_message_required
from server.grpc.services import InferenceServicer, StreamLimits, add_service
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


class _Call:
    """One coroutine run on the loop for a handler thread that waits on `lock` for its end."""

    __slots__ = ("make", "lock", "task", "waited", "cancelled")

    def __init__(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self.make = make
        self.lock = threading.Lock()
        self.lock.acquire()
        self.task: asyncio.Task | None = None
        self.waited = False  # the thread has its outcome: a later cancel has nothing to do
        self.cancelled = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop."""
        self.task = task = loop.create_task(self.make())
        task.add_done_callback(self._done)
        if self.cancelled:
            task.cancel()

    def _done(self, task: asyncio.Task) -> None:
        self.lock.release()

    def cancel_on_loop(self) -> None:
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()

    def wait(self) -> Any:
        """In the handler thread: the coroutine's result (or its exception raised here)."""
        self.lock.acquire()
        self.waited = True
        assert self.task is not None
        return self.task.result()


class LoopBridge:
    """Hands calls from handler threads to the event loop, one wake per burst of arrivals."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: collections.deque[_Call] = collections.deque()
        self.scheduled = False

    def submit(self, call: _Call) -> None:
        """From a handler thread. The append comes before the check, and the drain clears the
        flag before it empties the queue, so no call is left behind without a drain."""
        self.pending.append(call)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self.scheduled = False
        pending, loop = self.pending, self.loop
        while pending:
            pending.popleft().start(loop)

    def run(self, make: Callable[[], Coroutine[Any, Any, Any]], context: Any) -> Any:
        """From a handler thread: run `make()` on the loop and wait for it; a client's cancel
        or deadline cancels it there."""
        call = _Call(make)
        if not context.add_callback(lambda: self._cancel(call)):
            call.cancelled = True  # the call has already ended: start it cancelled
        self.submit(call)
        return call.wait()

    def _cancel(self, call: _Call) -> None:
        if not call.waited:
            self.loop.call_soon_threadsafe(call.cancel_on_loop)


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
        """ModelInfer: parsed here, run on the loop, serialized here."""
        message = self.parse_infer(self.first(requests, context, MODEL_INFER))
        stand_in = StandInContext(context)
        infer: Any = self.inference.ModelInfer  # a coroutine function, given the stand-in
        try:
            response = self.bridge.run(lambda: infer(message, stand_in), context)
        except grpc.aio.AbortError:
            stand_in.finish()
        except asyncio.CancelledError:
            context.abort(grpc.StatusCode.CANCELLED, "cancelled")
        return response.SerializeToString()

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
        current: list[_Call] = []
        ended: list[bool] = []

        def end() -> None:
            ended.append(True)
            if current:
                bridge._cancel(current[0])

        if not context.add_callback(end):
            end()
        try:
            while True:
                step = _Call(lambda: _next(agen))
                current[:] = [step]
                bridge.submit(step)
                if ended:
                    bridge._cancel(step)
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
            closing = _Call(lambda: _close(agen))
            self.bridge.submit(closing)
            closing.lock.acquire()

    # ----- start and stop -------------------------------------------------------------------
    async def start(self) -> None:
        self.port = add_port(self.server, self.settings)
        self.watch.start()
        self.server.start()
        log.info(
            "gRPC served by grpcio's synchronous server: %d threads, %d streams",
            self.threads,
            self.stream_limit,
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
