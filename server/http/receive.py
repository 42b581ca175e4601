"""Receiving an infer body of known length straight into its own buffer.

Why: uvloop hands a plain `asyncio.Protocol` each read as a fresh bytes (a copy out of its read
buffer), httptools hands `on_body` another fresh bytes, uvicorn appends it to a bytearray and the
reader joined the chunks: four copies of every tensor byte before decoding (bench/FINDINGS.md,
"HTTP bodies received into one buffer"). Here, once a large body's headers are parsed, the
transport's protocol becomes a `BufferedProtocol` (`DirectReceiver`, wrapping uvicorn's httptools
protocol) until the body is complete: the kernel writes the rest of the body straight into that
body's own array (`get_buffer` returns its empty part) and the parser is bypassed. Between such
bodies the transport reads for uvicorn's protocol exactly as before.

A sink's array is a fresh `np.empty` of exactly Content-Length bytes, never pooled: the tensors
decoded from it are views of it and may outlive the request (a batch, a response cache), and
the allocator already reuses its memory once the last view is gone (server/malloc.py keeps such
blocks in the heap instead of fresh mappings).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Protocol

import numpy as np

from server.http.body import BodyBudget

# Bodies over this size are received into a sink. The read that holds the headers may hold the
# start of the body too (through the parser, copied into the sink); what follows goes to the
# sink. A smaller body mostly arrives with its headers in that read, so a sink saves little.
DIRECT_MIN = 64 * 1024
# The read buffer for a read that finds no sink open (not expected: the receiver is installed
# only while one is), so that it still reaches the parser.
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

    `filled` counts the bytes in place; `charged` how many of them are counted against the
    frontend's BodyBudget (the protocol charges each read as it takes it, so the reader wakes
    once, when the body is complete or refused: `refusal`). The part not yet received is
    reserved in the budget (`BodyBudget.reserved`; each charge moves bytes from there to
    `held`), so an array allocated ahead of its bytes counts in full against every other body:
    memory committed to bodies stays within the budget (tests/e2e/http/test_body_bounds.py
    measures it). `open_sink` refuses a sink that does not fit beside the others, and that body
    is read chunk by chunk, as before. `release()` gives both back, once."""

    __slots__ = ("array", "budget", "charged", "filled", "refusal", "view")

    def __init__(self, size: int, budget: BodyBudget) -> None:
        self.array = np.empty(size, dtype=np.uint8)  # not zeroed: every byte is written once
        self.view = memoryview(self.array)  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ on Python 3.12+ only
        self.filled = 0
        self.charged = 0
        self.refusal: Exception | None = None  # the budget refused the body part-way
        self.budget: BodyBudget | None = budget
        budget.reserved += size

    def release(self) -> None:
        """Give the reservation and the charged bytes back (once; later calls do nothing)."""
        budget, self.budget = self.budget, None
        if budget is not None:
            budget.reserved -= len(self.view) - self.charged
            budget.held -= self.charged
            self.charged = 0

    def charge(self) -> None:
        """Count the bytes received since the last call against the budget; refuse the body
        (BodyBudgetExhausted) once the bodies in flight pass it."""
        budget = self.budget
        fresh = self.filled - self.charged
        if fresh and budget is not None:
            self.charged = self.filled
            budget.held += fresh  # from the reservation: what is committed does not change
            budget.reserved -= fresh
            if budget.committed() > budget.max_bytes:
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
    if size <= DIRECT_MIN or budget.committed() + size > budget.max_bytes:
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
    """The transport's protocol while a body is received into a sink: reads go into the sink's
    array; should one come with no sink open, into the scratch buffer and on to the wrapped
    protocol's `data_received`.

    A separate object because uvloop takes `get_buffer` only from a protocol that is not an
    `asyncio.Protocol`, which uvicorn's is. The wrapped protocol installs it with
    `transport.set_protocol` when it opens a sink and takes the transport back when the body is
    complete, so the reads between bodies cost what they always did. Everything else is passed
    on unchanged; `protocol` is the wrapped one.
    """

    __slots__ = ("protocol", "_reading")

    def __init__(self, protocol: ReceivingProtocol) -> None:
        self.protocol = protocol
        self._reading: memoryview | None = None  # the buffer handed out by get_buffer

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
        buffer = sink.window() if sink is not None else _scratch_buffer()
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


def receive_stamps(start_ns: int) -> tuple:
    """A request's HTTP receive timestamps for its trace, the body just in; () when tracing
    is off (`start_ns` 0)."""
    if not start_ns:
        return ()
    return (("HTTP_RECV_START", start_ns), ("HTTP_RECV_END", time.monotonic_ns()))
