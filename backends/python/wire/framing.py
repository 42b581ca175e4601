"""The wire between the server and a Python model's worker process.

Control messages are small pickled dicts on a Unix stream socket, each framed by a 4-byte
length. Tensor data never travels on the socket: each side owns one growable shared-memory
arena (an anonymous memfd, mmap'd by both processes) and copies its tensors into it once; the
other side maps the same memory and reads them in place. When an arena must grow, its owner
makes a bigger one and passes the new file descriptor along with the next message
(SCM_RIGHTS), so there are no names in /dev/shm to leak when a process is killed.

Fixed-size tensors are raw bytes in the arena. BYTES tensors (numpy object arrays) are pickled
into the arena instead, since their elements have no fixed layout.

Used by both processes, so it imports only the standard library and numpy.
"""

from __future__ import annotations

import array
import mmap
import os
import pickle
import socket
import struct
import tempfile
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

HEADER = struct.Struct("<I")
MAX_FDS = 4
_FD_SPACE = socket.CMSG_LEN(MAX_FDS * array.array("i").itemsize)
ALIGN = 64
MIN_ARENA = 1 << 20

# One tensor in an arena: (name, numpy dtype string or "" when pickled, shape, offset, nbytes).
TensorRef = tuple[str, str, tuple[int, ...], int, int]


class ChannelClosed(ConnectionError):
    """The other process closed its end (it exited, or was killed)."""


# ----- messages -----------------------------------------------------------------------------


def send_message(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    """Send one framed message; `fds` ride along with its first byte, and the message says how
    many there are (several messages may be in flight, so a read can bring another's fds)."""
    body = dict(message)
    if fds:
        body["nfds"] = len(fds)
    payload = pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL)
    data = HEADER.pack(len(payload)) + payload
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sent = sock.sendmsg([data], ancillary)
        if sent < len(data):
            sock.sendall(memoryview(data)[sent:])
    else:
        sock.sendall(data)


class Receiver:
    """Reads framed messages from one socket with as few system calls as possible: one
    `recvmsg` usually brings a whole small message (header and payload), where reading the
    header and then the payload took two. Bytes read past a message stay for the next one.

    File descriptors arrive with the first byte of the message they were sent with, so they
    queue up in arrival order and each message takes as many as its `nfds` says: a read that
    brings the start of the next message (and its descriptors) along gives them to that one."""

    CHUNK = 4096  # a small message whole; a bigger read allocates more than it saves

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()
        self._fds: deque[int] = deque()

    def recv(self) -> tuple[dict[str, Any], list[int]]:
        buffer = self._buffer
        fds = self._fds
        while len(buffer) < HEADER.size:
            self._fill(fds, self.CHUNK)
        (length,) = HEADER.unpack_from(buffer)
        end = HEADER.size + length
        if len(buffer) < end:
            self._fill_exactly(end - len(buffer))
        return self._take(end)

    def recv_nowait(self) -> tuple[dict[str, Any], list[int]] | None:
        """The next message if it is whole once what the socket holds now is read, else
        None (its bytes so far stay buffered): for an event loop woken by the socket's
        readiness, which must never wait for the rest. Reads with MSG_DONTWAIT, so the socket
        stays blocking for the threads that use `recv`."""
        end = self._whole_end()
        if not end:
            while self._fill(self._fds, self.CHUNK, socket.MSG_DONTWAIT) == self.CHUNK:
                pass  # a full chunk: more may be there
            end = self._whole_end()
            if not end:
                return None
        return self._take(end)

    def _whole_end(self) -> int:
        """Where the buffer's first message ends, if all of it is buffered; else 0."""
        buffer = self._buffer
        if len(buffer) < HEADER.size:
            return 0
        end = HEADER.size + HEADER.unpack_from(buffer)[0]
        return end if len(buffer) >= end else 0

    def _take(self, end: int) -> tuple[dict[str, Any], list[int]]:
        """The message that fills the buffer up to `end`, with its file descriptors."""
        buffer = self._buffer
        message = pickle.loads(buffer[HEADER.size : end])
        del buffer[:end]
        count = message.pop("nfds", 0)
        if not count:
            return message, []
        fds = self._fds
        return message, [fds.popleft() for _ in range(min(count, len(fds)))]

    def _fill(self, fds: deque[int], size: int, flags: int = 0) -> int:
        """One read into the buffer; the bytes it brought (0: none yet, with MSG_DONTWAIT)."""
        try:
            chunk, got_fds = _recv_with_fds(self.sock, size, flags)
        except OSError as exc:
            if isinstance(exc, TimeoutError):
                raise
            if flags and isinstance(exc, BlockingIOError):
                return 0
            raise ChannelClosed(str(exc)) from exc
        if not chunk:
            raise ChannelClosed("the other process closed the channel")
        self._buffer += chunk
        fds.extend(got_fds)
        return len(chunk)

    def _fill_exactly(self, missing: int) -> None:
        """The rest of a large payload, straight into the buffer."""
        buffer = self._buffer
        start = len(buffer)
        buffer.extend(bytes(missing))
        view = memoryview(buffer)[start:]
        received = 0
        try:
            while received < missing:
                try:
                    count = self.sock.recv_into(view[received:])
                except OSError as exc:
                    if isinstance(exc, TimeoutError):
                        raise
                    raise ChannelClosed(str(exc)) from exc
                if count == 0:
                    raise ChannelClosed("the other process closed the channel mid-message")
                received += count
        finally:
            view.release()
            if received < missing:
                del buffer[start + received :]


def _recv_with_fds(sock: socket.socket, size: int, flags: int) -> tuple[bytes, list[int]]:
    """`socket.recv_fds`, which before Python 3.13 drops its `flags` (MSG_DONTWAIT)."""
    data, ancillary, _flags, _addr = sock.recvmsg(size, _FD_SPACE, flags)
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Receive one framed message (and its file descriptors) when no other message follows
    it on the socket yet; a channel carrying several uses one `Receiver`."""
    return Receiver(sock).recv()


# ----- shared-memory arenas -----------------------------------------------------------------


def _anonymous_file() -> int:
    """A file descriptor for memory shared by fd passing only (nothing named to clean up)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("ascend-serve-tensors", getattr(os, "MFD_CLOEXEC", 0))
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, path = tempfile.mkstemp(prefix="ascend-serve-", dir=folder)
    os.unlink(path)
    return fd


def round_up(value: int, step: int) -> int:
    """`value` up to a multiple of `step` (alignment, page size)."""
    return (value + step - 1) // step * step


# Where each tensor of a group goes: (name, array or pickled bytes, offset, nbytes).
Plan = list[tuple[str, Any, int, int]]


def plan_group(group: Mapping[str, Any], offset: int = 0) -> tuple[Plan, int]:
    """Lay a group's tensors out from `offset` (aligned); returns the plan and the end."""
    plan: Plan = []
    for name, value in group.items():
        array_value = np.asarray(value)
        if array_value.dtype == object:
            blob: Any = pickle.dumps(array_value, protocol=pickle.HIGHEST_PROTOCOL)
            nbytes = len(blob)
        else:
            blob = array_value
            nbytes = array_value.nbytes
        plan.append((name, blob, offset, nbytes))
        offset = round_up(offset + nbytes, ALIGN)
    return plan, offset


def write_planned(mapped: mmap.mmap, plan: Plan, base: int = 0) -> list[TensorRef]:
    """Copy a planned group into shared memory at `base`; returns its refs."""
    refs: list[TensorRef] = []
    for name, blob, offset, nbytes in plan:
        start = base + offset
        if isinstance(blob, bytes):
            mapped[start : start + nbytes] = blob
            refs.append((name, "", (), start, nbytes))
        else:
            if nbytes:
                if blob.flags.c_contiguous:  # its bytes as they are: one copy, no view made
                    mapped[start : start + nbytes] = blob
                else:
                    target = np.ndarray(blob.shape, blob.dtype, buffer=mapped, offset=start)
                    target[...] = blob
                    del target
            refs.append((name, blob.dtype.str, tuple(blob.shape), start, nbytes))
    return refs


def map_anonymous(size: int) -> tuple[int, mmap.mmap]:
    """A new anonymous shared file of `size` bytes and its mapping."""
    fd = _anonymous_file()
    try:
        os.ftruncate(fd, size)
        return fd, mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise


class ArenaWriter:
    """The arena this process writes tensors into; grows (by replacement) when needed."""

    def __init__(self, min_size: int = MIN_ARENA) -> None:
        self._min_size = min_size
        self._fd = -1
        self._map: mmap.mmap | None = None
        self.size = 0

    def pack(
        self, groups: Sequence[Mapping[str, np.ndarray]]
    ) -> tuple[list[list[TensorRef]], int | None]:
        """Copy every tensor of every group into the arena.

        Returns each group's refs, and the new arena's file descriptor when the arena was
        replaced (the reader must map it before reading the refs; send it with the message).
        """
        plans: list[Plan] = []
        offset = 0
        for group in groups:
            plan, offset = plan_group(group, offset)
            plans.append(plan)
        new_fd = self._reserve(offset)
        assert self._map is not None
        return [write_planned(self._map, plan) for plan in plans], new_fd

    def _reserve(self, needed: int) -> int | None:
        if self._map is not None and needed <= self.size:
            return None
        size = round_up(max(needed, 2 * self.size, self._min_size), mmap.PAGESIZE)
        fd, mapped = map_anonymous(size)
        self.close()
        self._fd, self._map, self.size = fd, mapped, size
        return fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._map = None  # views handed out keep the old mapping alive until they go
        self.size = 0


class ArenaReader:
    """The other process's arena, mapped here for reading."""

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None

    def adopt(self, fd: int) -> None:
        """Map a newly received arena (taking ownership of `fd`, which is closed here)."""
        try:
            size = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def view(self, ref: TensorRef) -> np.ndarray:
        """The tensor in place (valid until the writer's next pack); BYTES are unpickled."""
        name, dtype, shape, offset, nbytes = ref
        if self._map is None:
            raise ChannelClosed(f"tensor '{name}' refers to an arena that was never received")
        if not dtype:
            return pickle.loads(memoryview(self._map)[offset : offset + nbytes])
        if nbytes == 0:
            return np.empty(shape, dtype=np.dtype(dtype))
        return np.ndarray(shape, np.dtype(dtype), buffer=self._map, offset=offset)

    def copy(self, ref: TensorRef) -> np.ndarray:
        """The tensor as an array of its own, safe to keep after the writer's next pack."""
        value = self.view(ref)
        return value if not ref[1] else value.copy()

    def copier(self, end: int) -> Callable[[TensorRef], np.ndarray]:
        """`copy` for the tensors of one pack that end by `end`: the arena's first `end`
        bytes are copied once, and each tensor is an array over that copy. A pack starts at
        offset 0, so this is one copy per batch instead of a view and a copy per tensor."""
        mapped = self._map
        if mapped is None or end <= 0 or end > len(mapped):
            return self.copy
        bulk = np.empty(end, np.uint8)
        bulk[:] = np.frombuffer(mapped, np.uint8, end)

        def copy(ref: TensorRef) -> np.ndarray:
            name, dtype, shape, offset, nbytes = ref
            if not dtype or not nbytes or offset + nbytes > end:  # BYTES, empty, elsewhere
                return self.copy(ref)
            return np.ndarray(shape, np.dtype(dtype), buffer=bulk, offset=offset)

        return copy

    def close(self) -> None:
        self._map = None
