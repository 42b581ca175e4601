"""Shared-memory arenas between a frontend process and the process that owns the models.

Each direction of a frontend link has one arena: the writing side allocates a region, copies a
message's tensors into it and sends only their offsets; the reading side builds numpy views over
the same pages (no copy) and says when the last view is gone, which gives the region back.

The arena is a memfd (an anonymous file that lives only as long as some process maps it), handed
to the frontend process as an inherited descriptor: nothing is left in /dev/shm when a process is
killed, and no other process can open it by name.

Why not backends/python/wire/ring.py's RingWriter, the other memfd ring: a Python model's reader
copies each message out in order and publishes one read mark in the ring, so that writer may
wait or grow; here the reader keeps numpy views over the pages for as long as a request lives
and releases them in any order, and the writer never waits, so regions are tracked per start
and a full ring sends the tensors inline.
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict

ALIGN = 64  # every region starts on a cache line (and on any numpy dtype's alignment)


def _aligned(size: int) -> int:
    return max(ALIGN, (size + ALIGN - 1) & ~(ALIGN - 1))


class RingAllocator:
    """Regions handed out in order around a ring and given back in any order.

    Space is reclaimed from the oldest region onwards, so a region released early waits for
    the ones before it: cheap (no free list to search) and right for a stream of requests
    that mostly finish in the order they came. `allocate` never blocks: None means "no room
    now", and the caller sends that message's tensors inline instead.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.head = 0  # where the next region starts
        self.live: OrderedDict[int, int] = OrderedDict()  # start -> end, oldest first
        self.released: set[int] = set()

    def allocate(self, size: int) -> int | None:
        size = _aligned(size)
        if size > self.capacity:
            return None
        if not self.live:
            self.head = 0
            start = 0
        else:
            head, tail = self.head, next(iter(self.live))
            if head > tail:  # free: [head, capacity) and [0, tail)
                if head + size <= self.capacity:
                    start = head
                elif size <= tail:
                    start = 0
                else:
                    return None
            elif head < tail and head + size <= tail:  # wrapped: free is [head, tail)
                start = head
            else:  # head == tail with regions live: the ring is full
                return None
        self.live[start] = start + size
        self.head = start + size
        return start

    def release(self, start: int) -> None:
        """Give a region back (unknown starts are ignored: a link may be reset meanwhile)."""
        if start not in self.live:
            return
        self.released.add(start)
        live, released = self.live, self.released
        while live:
            oldest = next(iter(live))
            if oldest not in released:
                break
            released.discard(oldest)
            live.popitem(last=False)

    @property
    def used(self) -> int:
        return sum(end - start for start, end in self.live.items())


class Arena:
    """One mapped memfd; `fd` is what a child process inherits to map the same pages."""

    def __init__(self, size: int, fd: int | None = None) -> None:
        if fd is None:
            fd = os.memfd_create("ascend-serve-frontend", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
        self.fd = fd
        self.size = size
        self.map = mmap.mmap(fd, size)
        self.view = memoryview(self.map)

    def close_fd(self) -> None:
        """The mapping stays; the descriptor is only needed until the child has it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
