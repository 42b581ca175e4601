"""Shared-memory rings for the messages that do not wait for a reply.

The request/reply arenas (backends/python/wire/framing.py) are rewritten by every call, which is
safe only because each call waits for its answer. Decoupled responses and BLS traffic go out
while other work is in flight, so each side also owns a ring: the writer copies a message's
tensors into the next free stretch and sends the refs on the socket; the reader copies them out (in
the order the messages arrive, which is the order they were written) and publishes how far it
has read in the ring's first eight bytes. The writer reuses space only behind that mark, so a
tensor is never overwritten before it has been read, and no tensor is ever pickled (BYTES
tensors, which have no fixed layout, are).

A message bigger than the ring gets a bigger ring: its file descriptor rides with the message,
and every earlier message, in the old ring, is read before it (one socket, in order).

Why not server/multiprocess/arena.py's RingAllocator, the other memfd ring: that one serves
zero-copy views that the reader gives back in any order (a message on the link per region) and
never blocks (no room: the tensors go inline), while here the reader copies every message out in
the order written and only publishes a read mark in the ring itself, so the writer can wait for
room or grow the ring and every message's tensors stay off the socket.

Used by both processes, so it imports only the standard library, numpy and framing.py.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from backends.python.wire.framing import (
    ALIGN,
    ArenaReader,
    TensorRef,
    map_anonymous,
    plan_group,
    round_up,
    write_planned,
)

HEADER_BYTES = 64  # the reader's position (uint64) at offset 0, the rest unused
_POSITION = struct.Struct("<Q")
DEFAULT_RING_BYTES = 8 << 20
FULL_POLL_S = 0.0005


class RingFull(TimeoutError):
    """The reader did not free enough space in time."""


class RingWriter:
    """This process's ring. `pack` is thread-safe; callers must send the messages in the order
    `pack` returned them, so `pack` and the send happen under the caller's one lock."""

    def __init__(
        self, capacity: int = DEFAULT_RING_BYTES, wait_s: float = 30.0, grow_when_full: bool = False
    ) -> None:
        self._capacity = round_up(capacity, mmap.PAGESIZE)
        self._wait_s = wait_s
        self._grow_when_full = grow_when_full  # for a writer that must never block (a loop)
        self._map: mmap.mmap | None = None
        self._fd = -1
        self._head = 0
        self.lock = threading.Lock()

    def pack(self, group: Mapping[str, Any]) -> tuple[list[TensorRef], int, int | None]:
        """Copy the tensors in; returns their refs, the position to publish once they are read,
        and a new ring's file descriptor to send along (or None). Raises RingFull."""
        plan, size = plan_group(group)
        size = max(size, ALIGN)
        new_fd = None
        if self._map is None or size > self._capacity:
            new_fd = self._replace(max(size * 2, self._capacity))
        start = self._reserve(size)
        if start is None:  # full: grow (a writer that must not wait) or give up
            if not self._grow_when_full:
                raise RingFull(
                    f"the shared-memory ring ({self._capacity} bytes) stayed full "
                    f"for {self._wait_s:g} s: the reader is not keeping up"
                )
            new_fd = self._replace(self._capacity * 2)
            start = self._reserve(size)
            assert start is not None
        assert self._map is not None
        refs = write_planned(self._map, plan, HEADER_BYTES + start % self._capacity)
        return refs, self._head, new_fd

    def _reserve(self, size: int) -> int | None:
        """The ring position of `size` free contiguous bytes, waiting for the reader up to
        wait_s (not at all when growing instead); None when they did not come free."""
        capacity = self._capacity
        offset = self._head % capacity
        skip = capacity - offset if offset + size > capacity else 0
        needed = self._head + skip + size - capacity
        deadline = None if self._grow_when_full else time.monotonic() + self._wait_s
        while self._read_position() < needed:
            if deadline is None or time.monotonic() > deadline:
                return None
            time.sleep(FULL_POLL_S)
        start = self._head + skip
        self._head = start + size
        return start

    def _read_position(self) -> int:
        assert self._map is not None
        return _POSITION.unpack_from(self._map, 0)[0]

    def _replace(self, capacity: int) -> int:
        capacity = round_up(capacity, mmap.PAGESIZE)
        fd, mapped = map_anonymous(HEADER_BYTES + capacity)
        self.close()
        self._fd, self._map, self._capacity, self._head = fd, mapped, capacity, 0
        return fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._map = None


class RingReader(ArenaReader):
    """The other process's ring, mapped here. Only the thread reading the socket uses it."""

    def take(self, refs: list[TensorRef], end: int) -> dict[str, np.ndarray]:
        """Copies of the tensors, then their space handed back to the writer."""
        try:
            return {ref[0]: self.copy(ref) for ref in refs}
        finally:
            self.release(end)

    def release(self, end: int) -> None:
        if self._map is not None:
            _POSITION.pack_into(self._map, 0, end)
