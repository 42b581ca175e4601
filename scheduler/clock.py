"""The scheduler's sense of time, injectable so batching tests are deterministic.

A clock gives monotonic nanoseconds and a way to be called back at a moment on that scale.
`MonotonicClock` is the real one (event-loop timers); `ManualClock` only moves when a test calls
`advance()`, so delay and timeout rules can be checked without sleeping.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Callable, Optional, Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """What the schedulers need from time. `now_ns` may be called from instance threads."""

    def now_ns(self) -> int: ...

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` on the event loop once `now_ns() >= when_ns` (never synchronously)."""
        ...


# uvloop keeps timers in whole milliseconds and fires a sub-half-millisecond delay at once, so a
# dispatcher re-arming a 0.3 ms timer would spin until the moment passes. Waiting for at least
# one tick instead may send a batch up to a millisecond late, never early.
_MIN_TIMER_S = 0.001


class MonotonicClock:
    """time.monotonic_ns and event-loop timers: the clock every server instance uses."""

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> TimerHandle:
        delay_s = max(0, when_ns - time.monotonic_ns()) / 1e9
        if 0 < delay_s < _MIN_TIMER_S:
            delay_s = _MIN_TIMER_S
        return asyncio.get_running_loop().call_later(delay_s, callback)


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

    def next_timer_ns(self) -> Optional[int]:
        """The earliest pending deadline, for tests that want to jump straight to it."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    @staticmethod
    def _fire(timer: _ManualTimer) -> None:
        if not timer.cancelled:
            timer.cancelled = True
            timer.callback()
