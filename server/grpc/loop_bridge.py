"""The hop from grpcio's threads to the event loop, shared by both ways `threads` serves calls.

Why one module: a call may come from a handler thread of grpcio's synchronous server
(server/grpc/threaded.py) or straight off grpc core's completion queue
(server/grpc/direct_infer.py), and in both the loop is woken once per burst of arrivals and
admits the burst's inference requests together. What differs is only how an answer leaves:
a handler thread waits on a lock for it, a completion-queue call is answered by the loop itself.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from protocol.errors import GRPC_INFER_RPC
from protocol.grpc import codec
from protocol.types import InferRequest, InferResponse
from scheduler.queue_scheduler import admission_group

if TYPE_CHECKING:
    from server.core.api import CoreAPI


class InferFrontend(Protocol):
    """What an inference call reads of the frontend that received it."""

    core: CoreAPI
    offload_threshold: int

    def decode(self, data: bytes, traceparent: str) -> InferRequest: ...


class _LoopWork(Protocol):
    waited: bool

    def start(self, loop: asyncio.AbstractEventLoop) -> None: ...

    def cancel_on_loop(self) -> None: ...


class LoopCall:
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


class InferOnLoop(abc.ABC):
    """One ModelInfer call admitted on the loop with no task; `deliver` hands its outcome on.

    A small message (up to --grpc-offload-threshold bytes) arrives as its bytes, and the loop
    parses, decodes, admits (`core.infer_nowait`), encodes and serializes it: Python work handed
    to another thread costs more than the work, as that thread must win the GIL back from a busy
    loop (FINDINGS 32). A larger one arrives parsed and decoded by a thread, and an answer with
    more output bytes than the threshold is handed on as its InferResponse, for a thread to
    serialize: no work proportional to a tensor's size runs on the loop."""

    __slots__ = (
        "frontend",
        "received",
        "traceparent",
        "request_id",
        "future",
        "answer",
        "error",
        "ended",
        "waited",
    )

    def __init__(
        self, frontend: InferFrontend, received: bytes | InferRequest, traceparent: str
    ) -> None:
        self.frontend = frontend
        self.received = received
        self.traceparent = traceparent
        self.request_id = ""
        self.future: asyncio.Future | None = None
        self.answer: bytes | InferResponse | None = None
        self.error: BaseException | None = None
        self.ended = False  # on the loop: the outcome is set and delivered
        self.waited = False  # the outcome has left: a later cancel has nothing to do

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop (a cancel that came first has ended it)."""
        if self.ended:
            return
        received, frontend = self.received, self.frontend
        try:
            if type(received) is bytes:
                request = frontend.decode(received, self.traceparent)
            else:
                assert isinstance(received, InferRequest)
                request = received
            self.request_id = request.id
            self.future = frontend.core.infer_nowait(request, self._end, GRPC_INFER_RPC)
        except Exception as exc:  # undecodable, or a bad shared-memory reference
            self._end(None, exc)

    def _end(self, response: InferResponse | None, error: BaseException | None) -> None:
        if self.ended:
            return
        self.ended = True
        if response is not None and not large_answer(response, self.frontend.offload_threshold):
            try:
                answer = codec.encode_infer_answer(response, self.request_id)
                self.answer = answer.SerializeToString()
            except Exception as exc:
                error = exc
        else:
            self.answer = response
        self.error = error
        self.deliver()

    @abc.abstractmethod
    def deliver(self) -> None:
        """On the loop, once: `answer` (bytes, or a large InferResponse) or `error` is set.
        A handler thread's call releases its waiting thread, a completion-queue call sends."""

    def serialized(self) -> bytes:
        """Off the loop: the answer's bytes (a large answer serialized here), or its error
        raised."""
        if self.error is not None:
            raise self.error
        answer = self.answer
        if isinstance(answer, bytes):
            return answer
        assert isinstance(answer, InferResponse)
        return codec.encode_infer_answer(answer, self.request_id).SerializeToString()

    def cancel_on_loop(self) -> None:
        """The client cancelled or its deadline passed: the request is dropped if it has not
        run (the scheduler counts it CANCELED), and the call is answered CANCELLED."""
        if self.future is not None and not self.ended:
            self.future.cancel()
        self._end(None, asyncio.CancelledError())


def large_answer(response: InferResponse, threshold: int) -> bool:
    """More output bytes than `threshold` to convert or copy: serialized off the loop."""
    size = 0
    for tensor in response.outputs:
        data = tensor.data
        if isinstance(data, np.ndarray):
            size += 8 * data.size if data.dtype == object else data.nbytes
    return size > threshold


class LoopBridge:
    """Hands calls from grpcio's threads to the event loop, one wake per burst of arrivals."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: collections.deque[_LoopWork] = collections.deque()
        self.scheduled = False

    def submit(self, call: _LoopWork) -> None:
        """From any thread. The append comes before the check, and the drain clears the
        flag before it empties the queue, so no call is left behind without a drain."""
        self.pending.append(call)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        """The burst's calls, in order; the inference requests among them admitted together
        (one dispatch pass per model version at the end, as a frontend process's frame)."""
        self.scheduled = False
        pending, loop = self.pending, self.loop
        if len(pending) == 1:
            pending.popleft().start(loop)
            return
        with admission_group():
            while pending:
                pending.popleft().start(loop)

    def run(self, make: Callable[[], Coroutine[Any, Any, Any]], context: Any) -> Any:
        """From a handler thread: run `make()` on the loop and wait for it; a client's cancel
        or deadline cancels it there."""
        call = LoopCall(make)
        if not context.add_callback(lambda: self.cancel(call)):
            call.cancelled = True  # the call has already ended: start it cancelled
        self.submit(call)
        return call.wait()

    def cancel(self, call: _LoopWork) -> None:
        """From any thread: cancel the call on the loop unless its outcome has left."""
        if not call.waited:
            self.loop.call_soon_threadsafe(call.cancel_on_loop)
