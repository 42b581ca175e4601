"""The server's side of what a Python model sends besides `execute` replies: the answers of
decoupled requests, BLS requests, and custom metrics (the worker's side is worker/bridge.py).

Messages arrive on whichever thread reads the worker's channel; their tensors are copied out
of the worker's ring at once (so the ring never waits on a slow client) and handed to the
event loop: answers into the request's ResponseStream, BLS requests into the server's one
infer path through the BackendHost. A stream acks each answer its consumer takes (the model's
sender waits for that credit) and passes a cancellation on to the model.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from protocol import errors
from protocol.datatypes import numpy_to_wire
from protocol.stream import ResponseStream, StreamItem
from protocol.types import InferRequest, RequestedOutput, Tensor

if TYPE_CHECKING:  # pragma: no cover
    from backends.base import BackendHost
    from backends.python.process import WorkerProcess

log = logging.getLogger(__name__)

# pb_utils.TritonError codes -> the error the client receives, and back.
ERROR_CODES: dict[int, type[errors.ServerError]] = {
    0: errors.UnknownError,
    1: errors.InternalError,
    2: errors.NotFound,
    3: errors.InvalidArgument,
    4: errors.Unavailable,
    5: errors.Unsupported,
    6: errors.AlreadyExists,
    7: errors.Cancelled,
}
_CODE_OF = {cls: code for code, cls in ERROR_CODES.items()}

BLS_DECOUPLED_ERROR = (
    "Model '{model}' is decoupled: call it with exec(decoupled=True) or "
    "async_exec(decoupled=True), which return an iterator over its responses"
)
NO_HOST_ERROR = "BLS is not available: this model was loaded without the server's infer path"


def error_from_code(code: int, message: str) -> errors.ServerError:
    """The error a model answered (a TritonError's code and text), marked as the model's."""
    error = ERROR_CODES.get(code, errors.InternalError)(message)
    error.from_model = True
    return error


def _code_of(error: errors.ServerError) -> int:
    for cls in type(error).__mro__:
        if cls in _CODE_OF:
            return _CODE_OF[cls]
    return 1


@dataclass(slots=True)
class _Sink:
    stream: ResponseStream
    worker: WorkerProcess


class StreamRouter:
    """One per Python backend (instance); shared by the worker processes it starts."""

    def __init__(self, model: str, host: BackendHost | None) -> None:
        self.model = model
        self.host = host
        self._sinks: dict[int, _Sink] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        # BLS calls running on the loop, by (worker pid, call id), so the caller can stop one.
        self._calls: dict[tuple[int, int], concurrent.futures.Future] = {}

    # ----- decoupled requests (instance thread) -------------------------------------------------

    def open(self, worker: WorkerProcess, requests: Sequence[InferRequest]) -> list[int]:
        """Register each request's stream; returns the ids the worker answers them by."""
        rids = []
        for request in requests:
            rid = next(self._ids)
            stream: ResponseStream = request.stream
            sink = _Sink(stream, worker)
            stream.attach(
                partial(self._notify, sink, "ack", rid), partial(self._cancelled, sink, rid)
            )
            with self._lock:
                self._sinks[rid] = sink
            if stream.cancelled:  # before the hook was set: the worker learns it all the same
                self._cancelled(sink, rid)
            rids.append(rid)
        return rids

    def close(self, rids: Sequence[int]) -> None:
        """Forget requests that execute did not take (their futures carry the error)."""
        with self._lock:
            for rid in rids:
                self._sinks.pop(rid, None)

    def fail_all(self, worker: WorkerProcess, error: errors.ServerError) -> None:
        """The worker died: every request it still owed answers ends with `error`."""
        with self._lock:
            lost = [(rid, sink) for rid, sink in self._sinks.items() if sink.worker is worker]
            for rid, _ in lost:
                del self._sinks[rid]
        for _, sink in lost:
            sink.stream.push_threadsafe(StreamItem(error=error, final=True))

    # ----- on the loop -------------------------------------------------------------------------

    def _notify(self, sink: _Sink, op: str, rid: int) -> None:
        try:
            sink.worker.post({"op": op, "rid": rid})
        except OSError:
            pass  # the worker is gone; its supervisor fails the stream

    def _cancelled(self, sink: _Sink, rid: int) -> None:
        with self._lock:
            self._sinks.pop(rid, None)
        self._notify(sink, "cancel", rid)

    # ----- messages (on the channel's reading thread) --------------------------------------------

    def handle(self, worker: WorkerProcess, message: dict, fds: list[int]) -> None:
        op = message.get("op")
        if op == "response":
            self._on_response(worker, message, fds)
        elif op == "bls":
            self._on_bls(worker, message, fds)
        elif op == "bls_cancel":
            with self._lock:
                call = self._calls.pop((worker.pid, message["bid"]), None)
            if call is not None:
                call.cancel()  # the call's request is cancelled on the loop
        elif op == "metric":
            if self.host is not None:
                self.host.custom_metric(message)
        elif op == "metric_declare":  # the model waits for the answer
            update = {**message, "model": self.model}
            error = None if self.host is None else self.host.declare_metric(update)
            try:
                worker.post({"op": "metric_answer", "mid": message.get("mid"), "error": error})
            except OSError:
                pass  # the worker is gone
        else:
            log.warning(
                "python model '%s': unexpected message '%s' from its worker", self.model, op
            )

    def _on_response(self, worker: WorkerProcess, message: dict, fds: list[int]) -> None:
        outputs = worker.take(message["refs"], message["end"], fds)
        rid = message["rid"]
        with self._lock:
            sink = self._sinks.get(rid)
            if sink is not None and message["final"]:
                del self._sinks[rid]
        if sink is None:
            return  # cancelled meanwhile: dropped
        error = message.get("error")
        item = StreamItem(
            None if message.get("empty") else outputs,
            error_from_code(*error) if error else None,
            message["final"],
            message.get("params") or {},
        )
        sink.stream.push_threadsafe(item)

    def _on_bls(self, worker: WorkerProcess, message: dict, fds: list[int]) -> None:
        inputs = worker.take(message.pop("refs"), message["end"], fds)
        host = self.host
        if host is None or host.loop is None:
            self._answer(worker, message["bid"], None, errors.Unavailable(NO_HOST_ERROR), True)
            return
        key = (worker.pid, message["bid"])
        call = asyncio.run_coroutine_threadsafe(self._bls(worker, message, inputs), host.loop)
        with self._lock:
            self._calls[key] = call
        call.add_done_callback(lambda _: self._forget_call(key))

    def _forget_call(self, key: tuple[int, int]) -> None:
        with self._lock:
            self._calls.pop(key, None)

    # ----- BLS (on the loop) ---------------------------------------------------------------------

    async def _bls(
        self, worker: WorkerProcess, message: dict, inputs: Mapping[str, np.ndarray]
    ) -> None:
        bid = message["bid"]
        host = self.host
        assert host is not None
        try:
            request = _bls_request(message, inputs)
            decoupled = host.is_decoupled(request.model_name, request.model_version)
            if decoupled and not message["decoupled"]:
                raise errors.InvalidArgument(BLS_DECOUPLED_ERROR.format(model=request.model_name))
            async for item in host.stream(request):
                tensors = None if item.response is None else item.response
                if item.error is not None or tensors is not None:
                    final = item.final and not decoupled
                    self._answer(worker, bid, tensors, item.error, final)
                    if final:
                        return
            self._answer(worker, bid, None, None, True)  # decoupled: the empty final one
        except errors.ServerError as exc:
            self._answer(worker, bid, None, exc, True)
        except asyncio.CancelledError:  # the caller stopped reading: close its call
            self._answer(worker, bid, None, errors.Cancelled("the BLS call was cancelled"), True)
            raise
        except Exception as exc:
            log.exception("BLS call from python model '%s' failed", self.model)
            self._answer(worker, bid, None, errors.InternalError(str(exc)), True)

    def _answer(
        self,
        worker: WorkerProcess,
        bid: int,
        response: Any,
        error: errors.ServerError | None,
        final: bool,
    ) -> None:
        tensors: dict[str, np.ndarray] = {}
        params = None
        if response is not None:
            tensors = {tensor.name: tensor.data for tensor in response.outputs}
            params = dict(response.parameters) or None
        try:
            worker.post(
                {
                    "op": "bls_response",
                    "bid": bid,
                    "final": final,
                    "params": params,
                    "error": (_code_of(error), error.message) if error else None,
                },
                tensors,
            )
        except OSError:
            pass  # the worker is gone


def _bls_request(message: dict, inputs: Mapping[str, np.ndarray]) -> InferRequest:
    """A BLS call as the one internal request type."""
    version = message.get("version", -1)
    tensors = []
    for name, array in inputs.items():
        tensors.append(Tensor(name, numpy_to_wire(array.dtype), tuple(array.shape), array))
    parameters = dict(message.get("params") or {})
    if message.get("timeout"):
        parameters["timeout"] = int(message["timeout"])
    outputs = message.get("outputs")
    return InferRequest(
        message["model"],
        str(version) if version is not None and int(version) >= 0 else "",
        message.get("id") or "",
        tensors,
        [RequestedOutput(name) for name in outputs] if outputs else None,
        parameters,
    )
