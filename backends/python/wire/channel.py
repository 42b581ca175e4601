"""One socket shared by several waiting threads, in either process.

A plain call waits for its reply on the socket itself. Decoupled responses, BLS requests and
their answers arrive between replies, and any thread may be waiting for one of them, so reading
is shared: whichever waiting thread finds nobody reading becomes the reader, reads messages and
routes each one, either to the thread that waits for it (its key) or to an inline handler for
the small notices that wait for nobody (acks, cancellations, responses to hand on). When the
reader's own message comes it stops reading and another waiter takes over. With one thread
waiting (a model without any of this) that thread simply reads its reply, as before; where
only one thread can ever wait (the server's side of a model that is not decoupled) no turns
are taken at all.

Used by both processes: the standard library and framing.py only.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from backends.python.wire.framing import ChannelClosed, Receiver, send_message

Message = tuple[dict[str, Any], list[int]]
# Returns the key of the thread the message is for, or None when it was handled inline.
Router = Callable[[dict[str, Any], list[int]], Hashable | None]


class Channel:
    """Send from any thread (one lock); receive by key (see the module docstring)."""

    def __init__(self, sock: socket.socket, route: Router, shared: bool = True) -> None:
        """`shared=False` when the owner guarantees one waiting thread at a time (the server's
        side of a model that is not decoupled: only calls read, one at a time under the
        call lock); waiting then skips taking turns."""
        self.sock = sock
        self._receiver = Receiver(sock)
        self._route = route
        self._shared = shared
        self._send_lock = threading.Lock()
        # A plain Lock taken with `with` costs a fraction of a Condition's Python-level
        # __enter__/__exit__; the Condition on it is used only when a thread must sleep, and
        # woken only when one sleeps (`_sleeping`), so a lone waiter (every plain model) pays
        # two lock round trips per message and nothing else.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sleeping = 0
        self._reading = False
        self._inbox: dict[Hashable, deque[Message]] = {}
        self._broken: BaseException | None = None
        self._timeout: float | None = None  # the socket's, changed only when a wait needs

    @property
    def shared(self) -> bool:
        """Whether several threads may wait on this channel (then only `wait` may read)."""
        return self._shared

    def send(self, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
        with self._send_lock:
            send_message(self.sock, message, fds)

    @property
    def send_lock(self) -> threading.Lock:
        """Held around a ring pack and its send, so messages leave in the order packed."""
        return self._send_lock

    def send_locked(self, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
        """`send` for a caller already holding `send_lock`."""
        send_message(self.sock, message, fds)

    @property
    def receiver(self) -> Receiver:
        """The socket's reader, for an owner that reads replies itself (an event loop watching
        the socket of a channel that is not shared)."""
        return self._receiver

    def wait(self, key: Hashable, timeout: float | None = None) -> Message:
        """The next message routed to `key`. Raises ChannelClosed when the other side went,
        TimeoutError when `timeout` passed first (the channel is then unusable)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._shared:  # the only reader: nothing to take turns with
            if self._broken is not None:
                raise ChannelClosed(str(self._broken))
            return self._read_until(key, deadline)
        with self._lock:
            if self._reading or self._inbox or self._broken is not None:
                queued = self._wait_turn(key, deadline)
                if queued is not None:
                    return queued
            else:  # nobody reads and nothing waits to be taken: read at once (a plain model)
                self._reading = True
        try:
            return self._read_until(key, deadline)
        finally:
            with self._lock:
                self._reading = False
                if self._sleeping:  # one of them reads next
                    self._cond.notify_all()

    def _wait_turn(self, key: Hashable, deadline: float | None) -> Message | None:
        """Called holding the lock: a message queued for `key`, or None once this thread
        has become the reader."""
        while True:
            queued = self._inbox.get(key)
            if queued:
                message = queued.popleft()
                if not queued:
                    del self._inbox[key]
                return message
            if self._broken is not None:
                raise ChannelClosed(str(self._broken))
            if not self._reading:
                self._reading = True
                return None
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"no message for {key!r} before the deadline")
            self._sleeping += 1
            try:
                self._cond.wait(remaining)
            finally:
                self._sleeping -= 1

    def _read_until(self, key: Hashable, deadline: float | None) -> Message:
        receiver, route = self._receiver, self._route
        while True:
            if deadline is not None or self._timeout is not None:
                self._set_timeout(deadline)
            try:
                message, fds = receiver.recv()
            except TimeoutError:
                raise
            except (ChannelClosed, OSError) as exc:
                with self._lock:
                    self._broken = exc
                raise ChannelClosed(str(exc)) from exc
            target = route(message, fds)
            if target == key:
                return message, fds
            if target is not None:
                with self._lock:
                    self._inbox.setdefault(target, deque()).append((message, fds))
                    if self._sleeping:
                        self._cond.notify_all()

    def untimed(self) -> None:
        """Leave the socket without a timeout (blocking, no poll before each operation), as an
        owner reading it with `Receiver.recv_nowait` needs: a timed wait leaves one set."""
        if self._timeout is not None:
            self.sock.settimeout(None)
            self._timeout = None

    def _set_timeout(self, deadline: float | None) -> None:
        """The socket's timeout for the time left (two fcntl calls: only when it changes)."""
        remaining = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
        if remaining != self._timeout:
            self.sock.settimeout(remaining)
            self._timeout = remaining

    def drop(self, key: Hashable) -> None:
        """Forget what is queued for a key nobody will wait for again."""
        with self._lock:
            self._inbox.pop(key, None)

    def close(self) -> None:
        """Wake every waiter with ChannelClosed (the socket is shut by the owner)."""
        with self._lock:
            if self._broken is None:
                self._broken = ChannelClosed("the channel was closed")
            self._cond.notify_all()
