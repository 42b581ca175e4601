"""The link between one frontend process and the model owner: messages over a Unix socket pair,
tensors through shared memory.

A message is any picklable tuple. It is pickled with protocol 5, so numpy arrays leave the pickle
as out-of-band buffers; buffers of SHM_MIN_BYTES and more in all are copied once into this side's
arena (server/multiprocess/arena.py) and only their place goes through the socket. The receiving
side rebuilds the arrays as views over its mapping of those pages: the model owner batches a
frontend's tensors straight out of shared memory, and a frontend encodes the owner's outputs the
same way. When the last view of a message is gone, the receiver tells the sender (a RELEASE message,
sent once per loop turn for all regions freed in it) and the sender reuses the space. Smaller
messages travel inline: for a few hundred bytes the socket copy costs less than the release message.

Messages sent in one loop turn leave as one frame at its end, one pickle of (BATCH, [messages])
(a lone message is pickled as itself), with all their tensors in one region of the arena: the
requests a frontend process decoded in one turn, or the answers of one batch, cost the receiver
one read, one unpickle and one admission pass (bench/FINDINGS.md, "the hand-over in frames").
The region comes back when the last view of any of its messages is gone.

Frame: HEAD (length of the rest, pickle length, arena offset or -1 for inline, buffer count),
the buffer lengths (u64 each), the pickle, then the buffers themselves when inline.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from server.multiprocess.arena import ALIGN, Arena, RingAllocator

log = logging.getLogger(__name__)

HEAD = struct.Struct("<IIqI")
_LENGTH = struct.Struct("<I")
SHM_MIN_BYTES = 4096  # below this, tensors ride inline (measured: bench/FINDINGS.md 9.9)
# Message tags (the first item of every message).
RELEASE = 0  # (RELEASE, [offsets]): regions of the receiver's arena the sender may reuse
INFER = 1  # frontend -> owner: (INFER, id, InferRequest)
CANCEL = 2  # frontend -> owner: (CANCEL, id): the client went away
RESULT = 3  # owner -> frontend: (RESULT, id, InferResponse)
ERROR = 4  # owner -> frontend: (ERROR, id, ServerError)
EXITING = 5  # owner -> frontend: (EXITING,): shutdown began; refuse new requests
BATCH = 6  # either way: (BATCH, [messages]): every message sent in one loop turn


def _span(size: int) -> int:
    """Room one buffer takes in a region: each starts aligned for any dtype."""
    return (size + ALIGN - 1) & ~(ALIGN - 1)


class FrontendLink(asyncio.Protocol):
    """One end of a frontend link. `on_message(message)` gets every message but RELEASE;
    `on_lost(exc)` is called once when the socket closes. `on_frame(messages)`, when given,
    gets the messages of one received frame together instead (RELEASE taken out), so that the
    owner admits them in one pass."""

    def __init__(
        self,
        outgoing: Arena,
        incoming: Arena,
        on_message: Callable[[tuple], None],
        on_lost: Callable[[Exception | None], None],
        on_frame: Callable[[list[tuple]], None] | None = None,
    ) -> None:
        self.outgoing = outgoing
        self.incoming = incoming
        self.allocator = RingAllocator(outgoing.size)
        self.on_message = on_message
        self.on_lost = on_lost
        self.on_frame = on_frame
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = 0
        self.closed = False
        self._buffer = bytearray()
        self._need = 0
        self._releases: list[int] = []
        self._messages: list[tuple] = []  # sent in this loop turn: one frame at its end

    # ----- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()
        self.thread = threading.get_ident()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            self.on_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._need:
                return  # a large inline frame still arriving: no copy until it is whole
            data = bytes(self._buffer)
            self._buffer.clear()
        view = memoryview(data)
        pos, size = 0, len(data)
        while size - pos >= 4:
            end = pos + 4 + _LENGTH.unpack_from(data, pos)[0]
            if end > size:
                break
            self._receive(view[pos:end])
            pos = end
        if pos < size:
            self._buffer += view[pos:]
            self._need = (4 + _LENGTH.unpack_from(data, pos)[0]) if size - pos >= 4 else 4

    # ----- sending -----------------------------------------------------------------------
    def send(self, message: tuple) -> None:
        """Queue `message`; every message of this loop turn leaves in one frame at its end.
        What it holds is pickled then, so it must not change meanwhile."""
        if self.closed or self.transport is None:
            return
        if not self._messages:
            self.loop.call_soon(self._flush)  # type: ignore[union-attr]
        self._messages.append(message)

    def _flush(self) -> None:
        messages, self._messages = self._messages, []
        if not messages or self.closed or self.transport is None:
            return
        try:
            parts = self._frame(messages[0] if len(messages) == 1 else (BATCH, messages))
        except Exception:  # one message that cannot be pickled must not take the others
            parts = []
            for message in messages:
                try:
                    parts += self._frame(message)
                except Exception:
                    log.exception("a message of tag %r could not be sent", message[0])
        self.transport.writelines(parts)

    def _frame(self, message: tuple) -> list[Any]:
        """The parts of one frame: tensors of SHM_MIN_BYTES and more in all go into one region
        of the outgoing arena (when it has room), smaller ones inline."""
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(message, 5, buffer_callback=buffers.append)
        if not buffers:
            return [HEAD.pack(HEAD.size - 4 + len(data), len(data), -1, 0), data]
        raws = [buffer.raw() for buffer in buffers]
        sizes = [raw.nbytes for raw in raws]
        offset = -1
        span = sum(_span(n) for n in sizes)
        if span >= SHM_MIN_BYTES:
            start = self.allocator.allocate(span)
            if start is not None:
                offset = start
                view = self.outgoing.view
                for raw, n in zip(raws, sizes, strict=False):
                    view[start : start + n] = raw
                    start += _span(n)
        lengths = struct.pack(f"<{len(sizes)}Q", *sizes)
        inline = sum(sizes) if offset < 0 else 0
        rest = HEAD.size - 4 + len(lengths) + len(data) + inline
        try:
            head = HEAD.pack(rest, len(data), offset, len(sizes))
        except struct.error:  # over 4 GiB: the caller sends its messages one by one
            if offset >= 0:
                self.allocator.release(offset)
            raise
        parts: list[Any] = [head, lengths, data]
        if offset < 0:
            parts += raws
        return parts

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # ----- receiving ---------------------------------------------------------------------
    def _receive(self, frame: memoryview) -> None:
        _, pickle_length, offset, count = HEAD.unpack_from(frame, 0)
        pos = HEAD.size
        sizes = struct.unpack_from(f"<{count}Q", frame, pos) if count else ()
        pos += 8 * count
        data = frame[pos : pos + pickle_length]
        pos += pickle_length
        if not count:
            message = pickle.loads(data)
        elif offset >= 0:
            base = np.frombuffer(self.incoming.map, np.uint8, sum(_span(n) for n in sizes), offset)
            weakref.finalize(base, self._released, offset)
            buffers: list[np.ndarray | memoryview] = []
            start = 0
            for n in sizes:
                buffers.append(base[start : start + n])
                start += _span(n)
            message = pickle.loads(data, buffers=buffers)
            del base, buffers
        else:
            buffers = []  # views over the frame itself
            for n in sizes:
                buffers.append(frame[pos : pos + n])
                pos += n
            message = pickle.loads(data, buffers=buffers)
        if message[0] == BATCH:
            messages = message[1]
            for item in messages:
                if item[0] == RELEASE:
                    self._release(item[1])
            if self.on_frame is not None:
                self.on_frame([item for item in messages if item[0] != RELEASE])
            else:
                for item in messages:
                    if item[0] != RELEASE:
                        self.on_message(item)
            return
        if message[0] == RELEASE:
            self._release(message[1])
        elif self.on_frame is not None:
            self.on_frame([message])
        else:
            self.on_message(message)

    def _release(self, starts: list[int]) -> None:
        for start in starts:
            self.allocator.release(start)

    def _released(self, offset: int) -> None:
        """The last view of a region is gone (on whichever thread dropped it)."""
        if threading.get_ident() == self.thread:
            self._queue_release(offset)
            return
        try:
            self.loop.call_soon_threadsafe(self._queue_release, offset)  # type: ignore[union-attr]
        except RuntimeError:  # the loop is closed: the process is ending
            pass

    def _queue_release(self, offset: int) -> None:
        if self.closed:
            return
        if not self._releases:
            self.loop.call_soon(self._flush_releases)  # type: ignore[union-attr]
        self._releases.append(offset)

    def _flush_releases(self) -> None:
        offsets, self._releases = self._releases, []
        if offsets:
            self.send((RELEASE, offsets))
