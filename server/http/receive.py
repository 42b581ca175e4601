"""Receiving an infer body of known length straight into its own buffer.

Why: uvloop hands a plain `asyncio.Protocol` each read as a fresh bytes (a copy out of its read
buffer), httptools hands `on_body` another fresh bytes, uvicorn appends it to a bytearray and the
reader joined the chunks: four copies of every tensor byte before decoding (bench/FINDINGS.md,
"HTTP bodies received into one buffer"). Here the transport's protocol is a `BufferedProtocol`
(`DirectReceiver`, wrapping uvicorn's httptools protocol): while the protocol has a `BodySink`
open, the kernel writes the rest of the body straight into that body's own array
(`get_buffer` returns its empty part) and the parser is bypassed; otherwise each read goes into
one scratch buffer per thread and on to the protocol's `data_received`, as before.

A sink's array is a fresh `np.empty` of exactly Content-Length bytes, never pooled: the tensors
decoded from it are views of it and may outlive the request (a batch, a response cache), and
the allocator already reuses its memory once the last view is gone (server/malloc.py keeps such
blocks in the heap instead of fresh mappings).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Protocol

import numpy as np

from server.http.body import BodyBudget

# Bodies over this size are received into a sink. One read of the scratch buffer (below) may
# hold the headers and the start of the body; what follows goes to the sink. Smaller bodies
# arrive with their headers in one read, so a sink would save nothing.
DIRECT_MIN = 64 * 1024
# One read between bodies: libuv's suggested read size, so a small request still arrives whole.
SCRATCH_SIZE = 64 * 1024

_scratch = threading.local()


def _scratch_buffer() -> memoryview:
    """This thread's read buffer (one event loop per thread reads into it, one read at a time:
    the protocol has parsed each read before the next one comes)."""
    view: memoryview | None = getattr(_scratch, "view", None)
    if view is None:
        view = _scratch.view = memoryview(bytearray(SCRATCH_SIZE))
    return view


class BodySink:
    """One body of known length, received into an array of exactly that size.

    `filled` counts the bytes in place; `charged` how many of them the reader has counted
    against the frontend's BodyBudget (it charges them as it wakes, as it did per chunk). The
    whole declared size is also reserved in the budget while the sink is open
    (`BodyBudget.reserved`), so the arrays allocated ahead of their bytes stay within the
    budget too; `open_sink` refuses a sink past it and the body is then read chunk by chunk,
    as before. `release()` gives both back, once."""

    __slots__ = ("array", "budget", "charged", "filled", "view")

    def __init__(self, size: int, budget: BodyBudget) -> None:
        self.array = np.empty(size, dtype=np.uint8)  # not zeroed: every byte is written once
        self.view = memoryview(self.array)  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ on Python 3.12+ only
        self.filled = 0
        self.charged = 0
        self.budget: BodyBudget | None = budget
        budget.reserved += size

    def release(self) -> None:
        """Give the reservation and the charged bytes back (once; later calls do nothing)."""
        budget, self.budget = self.budget, None
        if budget is not None:
            budget.reserved -= len(self.view)
            budget.held -= self.charged
            self.charged = 0

    def charge(self) -> None:
        """Count the bytes received since the last call against the budget; refuse the body
        (BodyBudgetExhausted) once the bodies in flight pass it."""
        budget = self.budget
        fresh = self.filled - self.charged
        if fresh and budget is not None:
            self.charged = self.filled
            budget.held += fresh
            if budget.held > budget.max_bytes:
                raise budget.exhausted()

    @property
    def size(self) -> int:
        return len(self.view)

    @property
    def complete(self) -> bool:
        return self.filled == len(self.view)

    def add(self, chunk: Any) -> None:
        """Bytes the parser gave (the part of the body read with the headers, or earlier)."""
        size = len(chunk)
        start = self.filled
        self.view[start : start + size] = chunk
        self.filled = start + size

    def window(self) -> memoryview:
        """Where the next read goes: the part of the array not yet received."""
        return self.view[self.filled :]

    def body(self) -> memoryview:
        """The whole body (call once complete)."""
        return self.view


def open_sink(size: int, budget: BodyBudget) -> BodySink | None:
    """A sink for a body of `size` bytes, or None when it is too small to need one or when
    the sinks already open reserve too much of the budget."""
    if size <= DIRECT_MIN or budget.reserved + size > budget.max_bytes:
        return None
    return BodySink(size, budget)


class ReceivingProtocol(Protocol):
    """What `DirectReceiver` needs of the protocol it wraps (InferHttpProtocol)."""

    direct_sink: BodySink | None

    def connection_made(self, transport: Any) -> None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def eof_received(self) -> bool | None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...
    def data_received(self, data: Any) -> None: ...
    def body_received(self, nbytes: int) -> None: ...


class DirectReceiver(asyncio.BufferedProtocol):
    """The transport's protocol: reads go into the open sink's array, or into the scratch
    buffer and on to the wrapped protocol's `data_received`.

    A separate object because uvloop takes `get_buffer` only from a protocol that is not an
    `asyncio.Protocol`, which uvicorn's is. Everything else is passed on unchanged;
    `transport.get_protocol()` is this object (`protocol` is the wrapped one).
    """

    __slots__ = ("protocol", "_reading", "_scratch")

    def __init__(self, protocol: ReceivingProtocol) -> None:
        self.protocol = protocol
        self._reading: memoryview | None = None  # the buffer handed out by get_buffer
        self._scratch = _scratch_buffer()  # built on the thread of the loop that reads

    def connection_made(self, transport: Any) -> None:
        self.protocol.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self.protocol.eof_received()

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()

    def get_buffer(self, sizehint: int) -> memoryview:
        sink = self.protocol.direct_sink
        buffer = sink.window() if sink is not None else self._scratch
        self._reading = buffer
        return buffer

    def buffer_updated(self, nbytes: int) -> None:
        buffer, self._reading = self._reading, None
        if buffer is None:
            return
        sink = self.protocol.direct_sink
        if sink is not None and buffer.obj is sink.array:
            self.protocol.body_received(nbytes)
        else:
            self.protocol.data_received(buffer[:nbytes])


def receiver_factory(protocol_class: Any) -> Any:
    """The callable uvicorn builds each connection's protocol with (its `http` setting): the
    given protocol class, wrapped in a DirectReceiver."""

    def build(**kwargs: Any) -> DirectReceiver:
        return DirectReceiver(protocol_class(**kwargs))

    return build
