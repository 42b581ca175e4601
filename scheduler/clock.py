"""The scheduler's sense of time, injectable so batching tests are deterministic.

A clock gives monotonic nanoseconds and a way to be called back at a moment on that scale.
`MonotonicClock` is the real one (event-loop timers, and for moments closer than the loop can
time a Linux timerfd the loop watches, or a fine timer thread where there is none);
`ManualClock` only moves when a test calls `advance()`, so delay and
timeout rules can be checked without sleeping.
"""

from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """What the schedulers need from time. `now_ns` may be called from instance threads."""

    def now_ns(self) -> int: ...

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` on the event loop once `now_ns() >= when_ns` (never synchronously)."""
        ...


# uvloop keeps timers in whole milliseconds: it fires a sub-half-millisecond delay at once (a
# dispatcher re-arming a 0.3 ms timer would spin until the moment passes) and rounds the rest to
# its cached millisecond clock, so a 100 µs queue delay became 1-2 ms. Moments closer than this
# go to the loop's timerfd instead (nanoseconds, the kernel's), or where there is none to the
# fine timer thread, which sleeps on a futex with microsecond resolution.
FINE_TIMER_LIMIT_NS = 2_000_000


class _FineTimer:
    """One moment on the fine timer thread; cancelled from the loop, fired on the loop."""

    __slots__ = ("when_ns", "callback", "loop", "cancelled")

    def __init__(
        self, when_ns: int, callback: Callable[[], None], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.when_ns = when_ns
        self.callback = callback
        self.loop = loop
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        """On the loop: a cancel may have come after the thread posted this."""
        if not self.cancelled:
            self.cancelled = True
            self.callback()


class _FineTimerThread:
    """A daemon thread that posts each timer to its loop (`call_soon_threadsafe`) when due.

    Why a thread: the event loop cannot wait less than a millisecond, and spinning it until a
    sub-millisecond moment would burn the CPU the frontends need. The thread costs one futex
    wake per timer; its lateness is the kernel's timer slack plus a wake of the loop (tens of
    microseconds), not a loop tick."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[int, int, _FineTimer]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, timer: _FineTimer) -> None:
        with self._cond:
            heapq.heappush(self._heap, (timer.when_ns, next(self._seq), timer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fine-timer", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is timer:
                self._cond.notify()  # earlier than what the thread sleeps for

    def _run(self) -> None:
        _tighten_timer_slack()
        heap = self._heap
        with self._cond:
            while True:
                while heap and heap[0][2].cancelled:
                    heapq.heappop(heap)
                if not heap:
                    self._cond.wait()
                    continue
                wait_ns = heap[0][0] - time.monotonic_ns()
                if wait_ns > 0:
                    self._cond.wait(wait_ns / 1e9)
                    continue
                timer = heapq.heappop(heap)[2]
                try:
                    timer.loop.call_soon_threadsafe(timer.fire)
                except RuntimeError:  # its loop is closed: nobody is left to call
                    pass


def _tighten_timer_slack() -> None:
    """Linux lets a sleeping thread wake up to 50 µs late by default (timer slack, to batch
    wake-ups); this thread exists to be punctual, so it asks for 1 µs. Best effort."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in nanoseconds
    except (OSError, AttributeError):
        pass


_FINE_TIMERS = _FineTimerThread()


class _TimerFd:
    """Linux timerfd: the kernel's own nanosecond timer, watched by the event loop itself.

    One per loop, armed for its earliest moment; when it expires the loop wakes from its own
    poll and runs the due callbacks there. Unlike the fine timer thread, no other thread wakes,
    takes the GIL and wakes the loop in turn (two context switches per moment saved, on a loop
    whose queue delay fires once per batch). Timer slack does not apply to it. Python 3.11 has
    no os.timerfd_*, so the two calls go through ctypes."""

    _libc: ctypes.CDLL | None = None

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        libc = _TimerFd._libc
        if libc is None:
            libc = _TimerFd._libc = ctypes.CDLL(None, use_errno=True)
            libc.timerfd_settime.argtypes = [
                ctypes.c_int,
                ctypes.c_int,
                ctypes.POINTER(_ITimerSpec),
                ctypes.c_void_p,
            ]
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._fd = fd
        self._settime = libc.timerfd_settime
        self._spec = _ITimerSpec()
        self._heap: list[tuple[int, int, _FineTimer]] = []
        self._seq = itertools.count()
        self._armed_ns = 0  # the moment the timerfd expires at (0: disarmed)
        try:
            loop.add_reader(fd, self._expired)
        except BaseException:
            os.close(fd)
            raise

    def add(self, timer: _FineTimer) -> None:
        heapq.heappush(self._heap, (timer.when_ns, next(self._seq), timer))
        if self._armed_ns == 0 or timer.when_ns < self._armed_ns:
            self._arm(timer.when_ns)

    def _arm(self, when_ns: int) -> None:
        spec = self._spec
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(when_ns, 1_000_000_000)
        self._settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None)
        self._armed_ns = when_ns

    def _expired(self) -> None:
        """On the loop: run what is due (in deadline order), arm for the next moment."""
        try:
            os.read(self._fd, 8)
        except BlockingIOError:  # re-armed after it expired: nothing to take
            pass
        self._armed_ns = 0
        heap = self._heap
        now = time.monotonic_ns()
        try:
            while heap and (heap[0][2].cancelled or heap[0][0] <= now):
                timer = heapq.heappop(heap)[2]
                timer.fire()  # a cancelled one does nothing
        finally:  # even past a callback that raised (the loop reports it): the rest still fire
            if heap and (self._armed_ns == 0 or heap[0][0] < self._armed_ns):
                self._arm(heap[0][0])

    def __del__(self) -> None:
        try:
            os.close(self._fd)
        except (OSError, AttributeError):
            pass


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _ITimerSpec(ctypes.Structure):
    _fields_ = [("it_interval", _TimeSpec), ("it_value", _TimeSpec)]


_CLOCK_MONOTONIC = 1  # time.monotonic_ns's clock on Linux
_TFD_TIMER_ABSTIME = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = getattr(os, "O_CLOEXEC", 0o2000000)
# Per loop: its timerfd, or None where there is none (not Linux, a loop without add_reader):
# those loops use the fine timer thread.
_TIMER_FDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _TimerFd | None] = (
    weakref.WeakKeyDictionary()
)


def _timer_fd(loop: asyncio.AbstractEventLoop) -> _TimerFd | None:
    try:
        return _TIMER_FDS[loop]
    except KeyError:
        pass
    made: _TimerFd | None
    try:
        made = _TimerFd(loop) if sys.platform.startswith("linux") else None
    except (OSError, AttributeError, NotImplementedError, RuntimeError):
        made = None
    _TIMER_FDS[loop] = made
    return made


class MonotonicClock:
    """time.monotonic_ns, and event-loop timers (the loop's timerfd, or the fine timer thread,
    for moments under FINE_TIMER_LIMIT_NS away): the clock every server instance uses.
    `use_timerfd=False` keeps to the thread (a benchmark's old way)."""

    def __init__(self, use_timerfd: bool = True) -> None:
        self._use_timerfd = use_timerfd
        # the builtin itself, not a method around it: read several times per request
        self.now_ns: Callable[[], int] = time.monotonic_ns

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle:
        loop = asyncio.get_running_loop()
        delay_ns = when_ns - time.monotonic_ns()
        if delay_ns <= 0:
            return loop.call_soon(callback)
        if delay_ns < FINE_TIMER_LIMIT_NS:
            timer = _FineTimer(when_ns, callback, loop)
            timer_fd = _timer_fd(loop) if self._use_timerfd else None
            if timer_fd is not None:
                timer_fd.add(timer)
            else:
                _FINE_TIMERS.add(timer)
            return timer
        return loop.call_later(delay_ns / 1e9, callback)


class _ManualTimer:
    __slots__ = ("when_ns", "callback", "cancelled")

    def __init__(self, when_ns: int, callback: Callable[[], None]) -> None:
        self.when_ns = when_ns
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that stands still until `advance()`; timers fire in deadline order."""

    def __init__(self, start_ns: int = 0) -> None:
        self._now = start_ns
        self._timers: list[tuple[int, int, _ManualTimer]] = []
        self._seq = itertools.count()

    def now_ns(self) -> int:
        return self._now

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle:
        timer = _ManualTimer(when_ns, callback)
        if when_ns <= self._now:
            # Due already: still asynchronous, as with a real loop timer.
            asyncio.get_running_loop().call_soon(self._fire, timer)
        else:
            heapq.heappush(self._timers, (when_ns, next(self._seq), timer))
        return timer

    def advance(self, ns: int) -> None:
        """Move time forward by `ns` and run every timer that became due, oldest first."""
        self.advance_to(self._now + ns)

    def advance_to(self, when_ns: int) -> None:
        if when_ns < self._now:
            raise ValueError("a monotonic clock cannot go back")
        while self._timers and self._timers[0][0] <= when_ns:
            due, _, timer = heapq.heappop(self._timers)
            self._now = max(self._now, due)
            self._fire(timer)
        self._now = when_ns

    def next_timer_ns(self) -> int | None:
        """The earliest pending deadline, for tests that want to jump straight to it."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    @staticmethod
    def _fire(timer: _ManualTimer) -> None:
        if not timer.cancelled:
            timer.cancelled = True
            timer.callback()
