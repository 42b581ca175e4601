"""A first-come, first-served gate for at most N holders at once, on the event loop.

Ensembles use it for `max_inflight_requests` (scheduler/ensemble.py): a request holds a place
from its first step to its answer, and the requests past the limit wait here, before their
first step, in the order they came. Waiting costs one future, so a waiting request holds only
the inputs it arrived with, never the intermediate tensors of a step. A waiter that is
cancelled (its client went away, the version is unloaded) leaves the line; a place handed to
it at the moment it was cancelled passes on to the next one, so no place is ever lost.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

Changed = Callable[[int, int], None]  # (holders, waiters) after every change


class InflightLimit:
    """At most `limit` holders (0: no limit, but holders are still counted)."""

    def __init__(self, limit: int, changed: Changed | None = None) -> None:
        if limit < 0:
            raise ValueError(f"an in-flight limit cannot be negative ({limit})")
        self.limit = limit
        self.holders = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._changed = changed

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        """Take a place, waiting in line while `limit` are taken."""
        if not self.limit or (self.holders < self.limit and not self._waiters):
            self.holders += 1
            self._notify()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._notify()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a place as it was cancelled: pass it on
            else:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                self._notify()
            raise

    def release(self) -> None:
        """Give a place back: to the first waiter still waiting, else free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the place moves on; `holders` stays
                self._notify()
                return
        self.holders -= 1
        self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed(self.holders, len(self._waiters))
