"""Each emulated device's queue of executions, shared by every process that opens the device.

On a card, contexts and streams of several processes share the device's AI cores: the runtime
of each process keeps its own resources (hicann/runtime docs/zh/design/architecture.md, "multi-
process isolation", its diagram showing two processes' Device 0 on one NPU), and the executions
they submit run one after another on the device, whichever process submitted them. So the
timeline is kept in wall-clock time (CLOCK_MONOTONIC, the same clock in every process), not in
which host thread happens to hold a lock: an execution submitted while the device is busy
starts when the one before it ends, even if its own thread is waiting for the GIL then.

The device's memory is physical too: what every process holds there counts against it (the
runtime of each keeps its own allocations; a process that ended has given its back). With
`Config.timeline_dir` set, each device's timeline and that memory table are a small file there
(`device-<id>`, read and written under `flock`), so the executor processes of one server
share their devices; without it both live in this process only. A hung execution blocks the
device (every later execution waits) until it is released, or until the process that ran it
has ended (the driver reclaims the device then).
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Cell = tuple[float, float, int]  # free_at, busy seconds scheduled so far, pid of a hung one
_CELL = struct.Struct("=ddq")  # free_at, busy seconds scheduled so far, pid of a hung execution
# After the cell, from _TABLE_AT: the device memory each process holds, (pid, bytes) per slot.
_SLOT = struct.Struct("=qq")
_TABLE_AT, _SLOTS = 32, 64
# Then the last utilisation reading, by any process: (when, busy seconds up to then).
_WINDOW = struct.Struct("=dd")
_WINDOW_AT = _TABLE_AT + _SLOT.size * _SLOTS


class DeviceTimeline:
    """When the device is free next, and how long it has been busy; optionally in a file."""

    def __init__(self, device: int, directory: str | None = None) -> None:
        self.device = device
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._cell: Cell = (0.0, 0.0, 0)
        self._window = (time.monotonic(), 0.0)
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            path = os.path.join(directory, f"device-{device}")
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            self._update(self._open_window)

    # -- storage ------------------------------------------------------------------------------
    def _read(self) -> Cell:
        if self._fd is None:
            return self._cell
        raw = os.pread(self._fd, _CELL.size, 0)
        return _CELL.unpack(raw) if len(raw) == _CELL.size else (0.0, 0.0, 0)

    def _write(self, cell: Cell) -> None:
        if self._fd is None:
            self._cell = cell
        else:
            os.pwrite(self._fd, _CELL.pack(*cell), 0)

    def _update(self, change: Callable[[Cell, float], tuple[Cell | None, Any]]) -> Any:
        """Read, change and write the cell atomically across threads and processes."""
        with self._lock:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                cell = self._read()
                cell, result = change(cell, time.monotonic())
                if cell is not None:
                    self._write(cell)
                return result
            finally:
                if self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    # -- the device ---------------------------------------------------------------------------
    def reserve(self, seconds: float) -> float | None:
        """Queue an execution of `seconds`: its end time, or None while a hung one holds the
        device."""

        def change(cell: Cell, now: float) -> tuple[Cell | None, Any]:
            free_at, busy, hung = _settled(cell)
            if hung:
                return None, None
            end = max(now, free_at) + seconds
            return (end, busy + seconds, 0), end

        return self._update(change)

    def block(self) -> bool:
        """A hung execution takes the device from the end of what is queued before it; False
        when another hung one holds it already."""

        def change(cell: Cell, now: float) -> tuple[Cell | None, Any]:
            free_at, busy, hung = _settled(cell)
            if hung:
                return None, False
            return (max(now, free_at), busy, os.getpid()), True

        return self._update(change)

    def unblock(self) -> None:
        """This process's hung execution ended (released): the device is free from now."""

        def change(cell: Cell, now: float) -> tuple[Cell | None, Any]:
            if cell[2] != os.getpid():
                return None, None
            return _freed(cell, now), None

        self._update(change)

    # -- utilisation ------------------------------------------------------------------------------
    def _open_window(self, cell: Cell, now: float) -> tuple[Cell | None, Any]:
        """The first process to open the device starts its utilisation window (with the lock)."""
        assert self._fd is not None
        raw = os.pread(self._fd, _WINDOW.size, _WINDOW_AT)
        if len(raw) < _WINDOW.size or _WINDOW.unpack(raw)[0] == 0.0:
            os.pwrite(self._fd, _WINDOW.pack(now, _busy_through(_settled(cell), now)), _WINDOW_AT)
        return None, None

    def utilisation(self) -> float:
        """The device's busy fraction since the last reading (by any process that shares it:
        the device's own figure, whoever asks), or since it was first opened."""

        def change(cell: Cell, now: float) -> tuple[Cell | None, Any]:
            through = _busy_through(_settled(cell), now)
            if self._fd is None:
                then, before = self._window
                self._window = (now, through)
            else:
                then, before = _WINDOW.unpack(os.pread(self._fd, _WINDOW.size, _WINDOW_AT))
                os.pwrite(self._fd, _WINDOW.pack(now, through), _WINDOW_AT)
            return None, (through - before) / max(now - then, 1e-9)

        return self._update(change)

    # -- the device's memory --------------------------------------------------------------------
    def charge(self, own: int, capacity: int) -> tuple[bool, int]:
        """This process now holds `own` bytes of the device's memory, if that and what the other
        live processes hold fit `capacity` (a decrease always fits): (it fits, the others'
        bytes). The memory is physical, so every process that opened the device shares it;
        a process that ended has given its memory back (the driver reclaims it)."""
        if self._fd is None:
            return own <= capacity, 0
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                raw = os.pread(self._fd, _SLOT.size * _SLOTS, _TABLE_AT)
                raw = raw.ljust(_SLOT.size * _SLOTS, b"\0")
                slots = [_SLOT.unpack_from(raw, i * _SLOT.size) for i in range(_SLOTS)]
                me, others, mine_at, free_at = os.getpid(), 0, -1, -1
                for index, (pid, held) in enumerate(slots):
                    if pid == me:
                        mine_at = index
                    elif pid and _alive(pid):
                        others += held
                    elif free_at < 0:
                        free_at = index
                grows = mine_at < 0 or own > slots[mine_at][1]
                if grows and others + own > capacity:
                    return False, others
                at = mine_at if mine_at >= 0 else free_at
                if at >= 0:
                    os.pwrite(
                        self._fd, _SLOT.pack(me if own else 0, own), _TABLE_AT + at * _SLOT.size
                    )
                return True, others
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _busy_through(cell: Cell, now: float) -> float:
    """The seconds the device has been busy up to `now` (queued work not yet run excluded)."""
    free_at, busy, hung = cell
    through = busy - max(0.0, free_at - now)
    if hung:  # busy since the hang began, and still
        through += max(0.0, now - free_at)
    return through


def _settled(cell: Cell) -> Cell:
    """A hang held by a process that has ended no longer holds the device."""
    hung = cell[2]
    if hung and hung != os.getpid() and not _alive(hung):
        return _freed(cell, time.monotonic())
    return cell


def _freed(cell: Cell, now: float) -> Cell:
    """The cell once its hang ends at `now`: busy from the hang's start until then."""
    free_at, busy, _ = cell
    return max(now, free_at), busy + max(0.0, now - free_at), 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
