"""What a metrics scrape must read from other processes, read off the event loop.

The NPU collector asks every executor process for its devices' readings, and an executor
answers only when its GIL is free: behind a model load that holds it (seconds), or never on a
device that hangs. Rendered on the loop, one scrape during a 3 s load froze every frontend for
3.4 s (`/v2/health/live` included). So the reads run first, in one thread of their own; scrapes
that arrive meanwhile wait for the same read, and none waits longer than
`METRICS_REMOTE_READ_TIMEOUT_S`: past it the page is rendered with the readings of the last
read that finished.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

METRICS_REMOTE_READ_TIMEOUT_S = 2.0  # a scrape's wait for other processes' readings


class RemoteReads:
    """Blocking `read_remote()` calls of the collectors that have one, run one read at a time."""

    def __init__(self, timeout_s: float = METRICS_REMOTE_READ_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._readers: list[Callable[[], None]] = []
        self._running: asyncio.Future | None = None

    def add(self, reader: Callable[[], None]) -> None:
        self._readers.append(reader)

    async def refresh(self) -> None:
        """Run the reads in their thread (or join the one already running), for at most
        `timeout_s`; a read that fails or is late leaves the last readings in place."""
        if not self._readers:
            return
        if self._running is None:
            loop = asyncio.get_running_loop()
            running = loop.create_future()
            self._running = running
            # a daemon thread, not a pool's: interpreter exit never waits for a read stuck
            # on an executor that only exit's own handlers stop
            threading.Thread(
                target=self._read_all,
                args=(loop, running),
                name="metrics-remote-reads",
                daemon=True,
            ).start()
        try:
            await asyncio.wait_for(asyncio.shield(self._running), self.timeout_s)
        except asyncio.TimeoutError:  # (not the builtin on 3.10)
            log.warning(
                "metrics: other processes' readings took over %g s; rendering the last ones",
                self.timeout_s,
            )

    def _read_all(self, loop: asyncio.AbstractEventLoop, running: asyncio.Future) -> None:
        for reader in self._readers:
            try:
                reader()
            except Exception:  # one collector's failure must not take the page
                log.exception("metrics: a remote read failed")
        try:
            loop.call_soon_threadsafe(self._ended, running)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def _ended(self, running: asyncio.Future) -> None:
        self._running = None
        running.set_result(None)  # only set here; scrapes wait on it through a shield
