"""The worker's side of what a model does besides answering `execute`: response senders
(decoupled models), cancellation, BLS calls and custom metrics.

pb_utils calls in here (the worker hands it this object at start); everything leaves on the
worker's channel (backends/python/wire/channel.py) with tensors in the worker's ring
(backends/python/wire/ring.py), and BLS answers come back through the server's ring.

Flow control: a decoupled request may have at most `window` responses that the server has not
yet handed to its client. `send` blocks while that many are outstanding (the server acks each
one as its client takes it), so a slow client holds the model back instead of growing the
server's memory; after `send_timeout_s` without progress `send` raises. A cancelled request
(its client went away) never blocks: what it sends is dropped.

Used in the worker process only: the standard library, numpy and the other worker modules.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from backends.python.wire.channel import Channel
from backends.python.wire.ring import RingFull, RingReader, RingWriter

FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class SendError(Exception):
    """A misuse of a response sender; pb_utils raises it as TritonModelException."""


@dataclass
class _Request:
    """One request's sender state (decoupled: `rid` is the server's id for it)."""

    rid: int
    decoupled: bool
    outputs: frozenset[str] | None  # the outputs the client asked for; None: all
    window: int
    sent: int = 0
    acked: int = 0
    closed: bool = False
    cancelled: bool = False
    # Non-decoupled models: the one response sent through the sender, answered with execute.
    collected: Any = None
    # A Condition for a decoupled request (acks and cancellations wake its sender); a plain
    # Lock for the others, which nothing from the server ever reaches.
    lock: Any = field(default_factory=threading.Condition)


class WorkerBridge:
    def __init__(
        self,
        channel: Channel,
        ring: RingWriter,
        replies: RingReader,
        window: int,
        send_timeout_s: float,
    ) -> None:
        self.channel = channel
        self.ring = ring
        self.replies = replies
        self.window = window
        self.send_timeout_s = send_timeout_s
        self._requests: dict[int, _Request] = {}
        # Cancellations that overtook their request's execute (rids not registered yet).
        self._early: set[int] = set()
        self._last_rid = 0
        self._bls_ids = itertools.count(1)
        self._metric_ids = itertools.count(1)
        self._abandoned: set[int] = set()  # BLS calls whose caller stopped reading
        self._lock = threading.Lock()

    # ----- requests --------------------------------------------------------------------------

    def register(self, rid: int, decoupled: bool, outputs: list[str] | None) -> _Request:
        """A request's sender state. Only a decoupled request is registered (by the server's
        id, for its acks and cancellation); any other request's id is known only here, so
        nothing can reach it and it costs one small object (no lock round trip, no
        Condition, nothing to forget)."""
        if not decoupled:
            return _Request(rid, False, None, self.window, lock=threading.Lock())
        state = _Request(
            rid, decoupled, frozenset(outputs) if outputs is not None else None, self.window
        )
        with self._lock:
            self._requests[rid] = state
            if rid > 0:
                self._last_rid = max(self._last_rid, rid)
                if rid in self._early:
                    state.cancelled = True
                self._early = {early for early in self._early if early > rid}
        return state

    def forget(self, rid: int) -> None:
        with self._lock:
            self._requests.pop(rid, None)

    def on_notice(self, message: dict) -> None:
        """An ack or a cancellation from the server (on the reading thread)."""
        rid = message["rid"]
        with self._lock:
            state = self._requests.get(rid)
            if state is None:
                if message["op"] == "cancel" and rid > self._last_rid:
                    self._early.add(rid)
                return
        with state.lock:
            if message["op"] == "ack":
                state.acked += message.get("n", 1)
            else:
                state.cancelled = True
            state.lock.notify_all()

    def is_cancelled(self, rid: int) -> bool:
        with self._lock:
            state = self._requests.get(rid)
        return state is not None and state.cancelled

    # ----- responses ----------------------------------------------------------------------------

    def send(self, state: _Request, response: Any, flags: int) -> None:
        """pb_utils' ResponseSender.send, with Triton's checks and texts."""
        if flags not in (0, FINAL):
            raise SendError("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise SendError(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        with state.lock:
            if not state.decoupled:
                if response is not None and state.sent > 0:
                    raise SendError(
                        "Unable to send response. Non-decoupled model cannot send "
                        "more than one response."
                    )
                if response is None and flags == FINAL and state.sent == 0:
                    raise SendError(
                        "Unable to send response. Non-decoupled model cannot send "
                        "complete final before sending a response."
                    )
            if state.closed:
                raise SendError("Unable to send response. Response sender has been closed.")
            if flags == FINAL:
                state.closed = True
            state.sent += 1
            if not state.decoupled:
                if response is not None:
                    state.collected = response
                return
            if state.cancelled:
                self._finish(state, flags)
                return
            if response is not None:
                self._wait_for_room(state)
        self._post(state, response, flags)

    def _wait_for_room(self, state: _Request) -> None:
        """Called holding state.lock: block while `window` responses are unread."""
        deadline = time.monotonic() + self.send_timeout_s
        while state.sent - 1 - state.acked >= state.window and not state.cancelled:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                state.sent -= 1
                raise SendError(
                    f"Unable to send response. The client has not read the last "
                    f"{state.window} responses within {self.send_timeout_s:g} s."
                )
            state.lock.wait(remaining)

    def _post(self, state: _Request, response: Any, flags: int) -> None:
        outputs: dict[str, np.ndarray] = {}
        error = None
        params = None
        if response is not None:
            if response.has_error():
                err = response.error()
                error = (err.code(), err.message())
            for tensor in response.output_tensors():
                if state.outputs is None or tensor.name() in state.outputs:
                    outputs[tensor.name()] = tensor.as_numpy()
            params = response._parameter_dict()
        with self.channel.send_lock:
            try:
                refs, end, fd = self.ring.pack(outputs)
            except RingFull as exc:
                raise SendError(f"Unable to send response. {exc}") from None
            self.channel.send_locked(
                {
                    "op": "response",
                    "rid": state.rid,
                    "refs": refs,
                    "end": end,
                    "error": error,
                    "params": params,
                    "final": flags == FINAL,
                    "empty": response is None,
                },
                [fd] if fd is not None else (),
            )
        self._finish(state, flags)

    def _finish(self, state: _Request, flags: int) -> None:
        if flags == FINAL:
            self.forget(state.rid)

    # ----- BLS ------------------------------------------------------------------------------

    def infer(
        self, request: Any, decoupled: bool, make_response: Callable[[dict], Any]
    ) -> Iterator[Any]:
        """Send a BLS request; yield each answer (pb_utils.InferenceResponse) until the last."""
        bid = next(self._bls_ids)
        inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
        names = request.requested_output_names()
        key = ("bls", bid)
        with self.channel.send_lock:
            refs, end, fd = self.ring.pack(inputs)
            self.channel.send_locked(
                {
                    "op": "bls",
                    "bid": bid,
                    "model": request.model_name(),
                    "version": request.model_version(),
                    "refs": refs,
                    "end": end,
                    "outputs": list(names) if names else None,
                    "id": request.request_id(),
                    "params": request._parameter_dict(),
                    "timeout": request.timeout(),
                    "decoupled": decoupled,
                },
                [fd] if fd is not None else (),
            )
        finished = False
        try:
            while True:
                message, _ = self.channel.wait(key)
                finished = message["final"]
                yield make_response(message)
                if finished:
                    return
        finally:
            if not finished:  # the caller stopped early: the server cancels the call
                with self._lock:
                    self._abandoned.add(bid)
                try:
                    self.channel.send({"op": "bls_cancel", "bid": bid})
                except OSError:
                    pass
            self.channel.drop(key)

    def take_bls_answer(self, message: dict, fds: list[int]) -> tuple[str, int] | None:
        """On the reading thread: copy an answer's tensors out of the server's ring (or only
        hand the space back, for a call its caller abandoned)."""
        if fds:
            self.replies.adopt(fds[0])
        bid = message["bid"]
        with self._lock:
            abandoned = bid in self._abandoned
            if abandoned and message["final"]:
                self._abandoned.discard(bid)
        if abandoned:
            self.replies.release(message["end"])
            return None
        message["tensors"] = self.replies.take(message.pop("refs"), message["end"])
        return ("bls", bid)

    # ----- custom metrics ---------------------------------------------------------------------

    def metric(self, update: dict) -> None:
        """A custom metric series' new value, for the server's /metrics."""
        self.channel.send({"op": "metric", **update})

    def declare_metric(self, update: dict) -> str | None:
        """A custom metric family or series, checked by the server: None when accepted, else
        the reason it refused it (pb_utils raises it). Waits for the answer, as Triton's stub
        does (the server answers as it reads: during a call, or at once for a decoupled
        model)."""
        mid = next(self._metric_ids)
        key = ("metric", mid)
        try:
            self.channel.send({"op": "metric_declare", "mid": mid, **update})
            message, _ = self.channel.wait(key)
        finally:
            self.channel.drop(key)
        error = message.get("error")
        return None if error is None else str(error)
