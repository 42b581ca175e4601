"""A time bound on how long a call of grpcio's synchronous server may wait for its request.

Why: that server gives a call its handler thread when the call's headers arrive. A unary
handler is called only once the message is in, and grpcio waits for it without a bound, so a
client that opens calls and never sends their messages holds threads for as long as it likes
(bench/FINDINGS.md, section 23). server/grpc/threaded.py therefore registers every unary RPC as
a request-streaming one: its handler runs at once, takes the one message through `first`, and
this watch cancels a call whose message has not arrived `timeout` seconds after its handler
started (grpc core then ends the call, CANCELLED, and the thread is free again).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

import grpc

# How often the watch looks, as a share of the timeout (and at most once a second).
LOOKS_PER_TIMEOUT = 4
MAX_LOOK_SECONDS = 1.0


class NoMessage(Exception):
    """The call ended (the client half-closed, cancelled, or the watch cancelled it) before its
    request message arrived."""


def one_message_required(method: str) -> str:
    """grpcio's own text for a unary call half-closed without its message (UNIMPLEMENTED)."""
    return f'"{method}" requires exactly one request message.'


class Cancellable(Protocol):
    """A call the watch can end: grpcio's ServicerContext, or grpc core's own call."""

    def cancel(self) -> Any: ...


class MessageWatch:
    """Cancels calls whose request message is late; one daemon thread for the whole server.

    A call costs one dict insert and one delete; the thread wakes a few times per timeout
    whether or not calls are waiting, and never takes a lock a handler thread waits on."""

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout = timeout_seconds  # 0: no bound
        self.waiting: dict[int, tuple[float, Cancellable]] = {}
        self.closed = threading.Event()
        self.cancelled = 0  # calls the watch has ended (tests and logs read it)
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.timeout > 0 and self.thread is None:
            self.thread = threading.Thread(
                target=self._watch, name="grpc-message-watch", daemon=True
            )
            self.thread.start()

    def close(self) -> None:
        self.closed.set()

    def expect(self, key: object, call: Cancellable) -> None:
        """A call, named by `key`, waits for its message from now on (direct_infer.py)."""
        if self.timeout > 0:
            self.waiting[id(key)] = (time.monotonic() + self.timeout, call)

    def arrived(self, key: object) -> None:
        """The call's message is in, or the call has ended."""
        self.waiting.pop(id(key), None)

    def first(self, requests: Iterator[Any], context: Cancellable) -> Any:
        """In the handler thread: the call's request message; NoMessage when it ends without
        one. What else the client streams after it is never read (the call is unary)."""
        self.expect(context, context)
        try:
            return next(requests)
        except (StopIteration, grpc.RpcError):
            raise NoMessage() from None
        finally:
            self.arrived(context)

    def _watch(self) -> None:
        period = min(self.timeout / LOOKS_PER_TIMEOUT, MAX_LOOK_SECONDS)
        while not self.closed.wait(period):
            now = time.monotonic()
            for key, (deadline, call) in self.waiting.copy().items():
                if deadline <= now and self.waiting.pop(key, None) is not None:
                    self.cancelled += 1
                    call.cancel()
