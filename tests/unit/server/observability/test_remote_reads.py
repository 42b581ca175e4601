"""Reads from other processes run off the loop before a scrape's render (remote_reads.py)."""

from __future__ import annotations

import asyncio
import threading

from server.observability.metrics import ServerMetrics
from server.observability.remote_reads import RemoteReads


async def test_the_loop_keeps_turning_while_a_read_blocks() -> None:
    release = threading.Event()
    reads = RemoteReads(timeout_s=10)
    reads.add(lambda: release.wait(5))
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while not release.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    ticker = asyncio.create_task(tick())
    refresh = asyncio.create_task(reads.refresh())
    await asyncio.sleep(0.2)
    assert not refresh.done()  # the scrape waits for its read ...
    assert ticks > 5  # ... and the loop goes on meanwhile
    release.set()
    await asyncio.wait_for(refresh, 5)
    await ticker


async def test_scrapes_meanwhile_share_one_read_and_a_late_read_is_not_waited_for() -> None:
    release = threading.Event()
    calls: list[str] = []

    def read() -> None:
        calls.append(threading.current_thread().name)
        release.wait(5)

    reads = RemoteReads(timeout_s=0.2)
    reads.add(read)
    await asyncio.gather(reads.refresh(), reads.refresh(), reads.refresh())  # each ~0.2 s
    assert calls == ["metrics-remote-reads"]  # one read, in its own thread, still running
    release.set()
    for _ in range(100):
        if reads._running is None:
            break
        await asyncio.sleep(0.01)
    await reads.refresh()  # the next scrape starts a new read
    assert len(calls) == 2


class _Remote:
    """A collector whose readings come from elsewhere; the first read fails."""

    def __init__(self) -> None:
        self.reads = 0
        self.value = 0.0

    def read_remote(self) -> None:
        self.reads += 1
        if self.reads == 1:
            raise OSError("an executor went away")
        self.value = 7.0

    def describe(self) -> list:
        return []

    def collect(self) -> list:
        from prometheus_client.core import GaugeMetricFamily

        return [GaugeMetricFamily("remote_gauge", "read from elsewhere", value=self.value)]


async def test_a_scrape_renders_what_the_last_read_found_and_survives_a_failed_read() -> None:
    metrics = ServerMetrics()
    remote = _Remote()
    metrics.add_collector(remote)  # type: ignore[arg-type]
    first = (await metrics.scrape()).decode()
    assert "remote_gauge 0" in first  # the failed read left the last (initial) value
    second = (await metrics.scrape()).decode()
    assert "remote_gauge 7" in second and remote.reads == 2
