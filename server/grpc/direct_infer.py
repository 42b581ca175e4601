"""ModelInfer taken straight off grpc core's completion queue, with no handler thread (`threads`).

Why: grpcio's synchronous server runs each call through a handler thread that is woken by the
pool's queue, again by its message's Condition and again by the answer's lock; answering canned
bytes that way costs ~220 µs of CPU per call on a 2-core host, against ~87 µs for the same
answers taken off the completion queue by one thread (bench/FINDINGS.md, section 34). So
ModelInfer, the one RPC whose cost matters, is registered with grpc core by this module and
requested with callables as tags: grpcio's own polling thread (`_serve`) calls them with each
completion, and they only start the next operation or hand the call to the loop. The loop
decodes, admits and encodes as before (server/grpc/loop_bridge.py) and sends the answer itself.

What grpcio's server did for these calls, done here the same way:
- `maximum_concurrent_rpcs` (--grpc-max-concurrent-rpcs): the same counter, under grpcio's lock,
  answered with grpcio's RESOURCE_EXHAUSTED text;
- a call whose message does not come within --grpc-message-timeout is cancelled by the watch
  (server/grpc/message_wait.py); one half-closed without it is answered UNIMPLEMENTED with
  grpcio's text;
- --grpc-restricted-protocol's header check, before the message is read (UNAVAILABLE);
- a client's cancel or deadline (grpc core ends the call) drops the request on the loop;
- a graceful stop: grpc core reports the server's shutdown only once these calls have ended too.

This reaches into grpcio's private `_server` state (the completion queue, the core server and
the tag protocol of `_serve`); `available()` checks it is there, and without it ModelInfer is
served by a handler thread as every other RPC is.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from grpc._cython import cygrpc  # type: ignore[attr-defined]

from server.grpc.loop_bridge import InferFrontend, InferOnLoop, LoopBridge
from server.grpc.message_wait import MessageWatch, one_message_required
from server.grpc.restricted import refusal_text
from server.grpc.services import infer_call_status, traceparent_of
from server.restricted import Restriction, grpc_category

log = logging.getLogger(__name__)

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
# grpcio's own answer to a call past maximum_concurrent_rpcs
CONCURRENCY_EXCEEDED = "Concurrent RPC limit exceeded!"
_NOTHING: tuple[None, tuple] = (None, ())  # what a tag tells grpcio's `_serve`: no state of its


def available(server: grpc.Server) -> bool:
    """Whether this grpcio exposes what the direct path needs (checked once, at start)."""
    state = getattr(server, "_state", None)
    return (
        hasattr(server, "_cy_server")
        and state is not None
        and all(hasattr(state, name) for name in ("completion_queue", "lock", "stage"))
        and hasattr(state, "active_rpc_count")
        and hasattr(state, "maximum_concurrent_rpcs")
    )


def _ignored(event: Any) -> tuple[None, tuple]:
    return _NOTHING


def _tag(method: Callable[[Any, Any], None]) -> Callable[[Any, Any], tuple[None, tuple]]:
    """A completion's callable tag. grpcio's polling thread calls it unguarded, and a raise
    there would end that thread and with it the server: every failure is logged, and the
    call is cancelled so that its client is not left waiting."""

    @functools.wraps(method)
    def tag(self: Any, event: Any) -> tuple[None, tuple]:
        try:
            method(self, event)
        except Exception:
            log.exception("ModelInfer: a completion failed; the call is cancelled")
            call = getattr(event, "call", None) or getattr(self, "call", None)
            if call is not None:
                _cancel(call)
        return _NOTHING

    return tag


def _cancel(call: Any) -> None:
    try:
        call.cancel()
    except Exception:  # the call has ended already
        pass


def _send(call: Any, ops: list[Any]) -> None:
    """Start the answer's operations (from the loop or a pool thread). A call that has ended
    meanwhile (cancelled, deadline) fails them quietly in grpc core."""
    try:
        call.start_server_batch(ops, _ignored)
    except Exception:
        log.debug("ModelInfer: the answer could not be sent", exc_info=True)


def _status_ops(
    code: grpc.StatusCode, details: str, trailing: Any = (), message: bytes | None = None
) -> list[Any]:
    ops: list[Any] = [cygrpc.SendInitialMetadataOperation(None, 0)]
    if message is not None:
        ops.append(cygrpc.SendMessageOperation(message, 0))
    status = code.value[0]
    ops.append(cygrpc.SendStatusFromServerOperation(trailing or None, status, details.encode(), 0))
    return ops


class DirectInfer:
    """Requests ModelInfer calls from grpc core and answers them without a handler thread."""

    def __init__(
        self,
        frontend: InferFrontend,
        server: grpc.Server,
        bridge: LoopBridge,
        watch: MessageWatch,
        pool: ThreadPoolExecutor,
        restrictions: Mapping[str, Restriction],
    ) -> None:
        self.frontend = frontend
        self.bridge = bridge
        self.watch = watch
        self.pool = pool  # decodes and serializes what is over the offload threshold
        self.state = server._state  # type: ignore[attr-defined]
        self.core_server = server._cy_server  # type: ignore[attr-defined]
        category = grpc_category(MODEL_INFER)
        self.restriction = restrictions.get(category) if category else None
        self.core_server.register_method(MODEL_INFER)  # before the server starts

    def start(self) -> None:
        """After the server has started: ask grpc core for the first call."""
        self._request()

    def _request(self) -> None:
        queue = self.state.completion_queue
        self.core_server.request_registered_call(queue, queue, MODEL_INFER, self._arrived)

    # ----- in grpcio's polling thread ---------------------------------------------------------
    @_tag
    def _arrived(self, event: Any) -> None:
        """A call's headers are in: ask for the next one, then take its message."""
        if not event.success:
            return  # the server is shutting down
        state = self.state
        if state.stage.value == "started":
            try:
                self._request()
            except Exception:  # the server began to stop meanwhile: no next call to ask for
                log.debug("ModelInfer: no next call requested", exc_info=True)
        call = event.call
        metadata = event.invocation_metadata or ()
        if self.restriction is not None and not self._allowed(metadata):
            self._refuse(call, grpc.StatusCode.UNAVAILABLE, refusal_text(self.restriction))
            return
        with state.lock:
            limit = state.maximum_concurrent_rpcs
            if limit is not None and state.active_rpc_count >= limit:
                exceeded = True
            else:
                exceeded = False
                state.active_rpc_count += 1
        if exceeded:
            self._refuse(call, grpc.StatusCode.RESOURCE_EXHAUSTED, CONCURRENCY_EXCEEDED)
            return
        direct = DirectCall(self, call, metadata)
        try:
            call.start_server_batch((cygrpc.ReceiveCloseOnServerOperation(0),), direct.call_closed)
        except Exception:
            self.ended()  # no close will come to count it out
            raise
        call.start_server_batch((cygrpc.ReceiveMessageOperation(0),), direct.message_in)
        self.watch.expect(direct, call)

    def _allowed(self, metadata: Any) -> bool:
        restriction = self.restriction
        assert restriction is not None
        for key, value in metadata:
            if key == restriction.header:
                return restriction.allows(value if isinstance(value, str) else None)
        return False

    def _refuse(self, call: Any, code: grpc.StatusCode, details: str) -> None:
        _send(call, [cygrpc.ReceiveCloseOnServerOperation(0), *_status_ops(code, details)])

    def ended(self) -> None:
        with self.state.lock:
            self.state.active_rpc_count -= 1


class DirectCall(InferOnLoop):
    """One ModelInfer call off the completion queue: its message is handed to the loop, whose
    outcome (`deliver`) is sent from the loop, or from a pool thread for a large answer."""

    __slots__ = ("calls", "call", "metadata")

    def __init__(self, calls: DirectInfer, call: Any, metadata: Any) -> None:
        super().__init__(calls.frontend, b"", "")
        self.calls = calls
        self.call = call
        self.metadata = metadata

    def invocation_metadata(self) -> Any:
        return self.metadata

    # ----- in grpcio's polling thread ---------------------------------------------------------
    @_tag
    def message_in(self, event: Any) -> None:
        calls = self.calls
        calls.watch.arrived(self)
        data = event.batch_operations[0].message() if event.success else None
        if data is None:  # half-closed without it (moot when the call was cancelled)
            text = one_message_required(MODEL_INFER)
            _send(self.call, _status_ops(grpc.StatusCode.UNIMPLEMENTED, text))
            return
        frontend = self.frontend
        self.traceparent = traceparent_of(frontend.core, self)
        if len(data) <= frontend.offload_threshold:
            self.received = data
            calls.bridge.submit(self)
        else:
            calls.pool.submit(self._decode, data)

    @_tag
    def call_closed(self, event: Any) -> None:
        """The call has ended: answered, or cancelled by the client, its deadline or the
        server's stop."""
        self.calls.ended()
        if event.batch_operations[0].cancelled() and not self.waited:
            self.calls.bridge.cancel(self)

    # ----- in a pool thread -----------------------------------------------------------------
    def _decode(self, data: bytes) -> None:
        try:
            self.received = self.frontend.decode(data, self.traceparent)
        except Exception as exc:
            self._send_error(exc)
            return
        self.calls.bridge.submit(self)

    def _send_serialized(self) -> None:
        try:
            answer = self.serialized()
        except Exception as exc:
            self._send_error(exc)
            return
        _send(self.call, _status_ops(grpc.StatusCode.OK, "", (), answer))

    # ----- on the loop ----------------------------------------------------------------------
    def deliver(self) -> None:
        self.waited = True
        answer, error = self.answer, self.error
        if error is not None:
            self._send_error(error)
        elif type(answer) is bytes:
            _send(self.call, _status_ops(grpc.StatusCode.OK, "", (), answer))
        else:
            try:
                self.calls.pool.submit(self._send_serialized)
            except RuntimeError:  # the pool has stopped with the server: nobody to answer
                _cancel(self.call)

    def _send_error(self, error: BaseException) -> None:
        self.waited = True
        code, details, trailing = infer_call_status(error)
        _send(self.call, _status_ops(code, details, trailing))
