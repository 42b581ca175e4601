"""`max_inflight_requests` on an ensemble (scheduler/ensemble.py, scheduler/inflight_limit.py)
with a fake core: the number of requests inside never passes the limit, the others wait in
order and all answer, a cancelled waiter leaves the line, the counts reach the statistics."""

from __future__ import annotations

import asyncio

import pytest

from protocol.errors import Unavailable
from scheduler.inflight_limit import InflightLimit
from tests.unit.scheduler.test_ensemble_scheduler import (
    DIAMOND,
    FakeCore,
    make_scheduler,
    request_for,
)

CHAIN = """
name: "chain"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling {
  %s
  step [
    { model_name: "add1" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "a" } },
    { model_name: "slow" input_map { key: "X" value: "a" } output_map { key: "Y" value: "OUT" } }
  ]
}
"""


class GatedCore(FakeCore):
    """`add1` is quick; `slow` waits for the test to open its gate. Counts what is between the
    two: requests that finished add1 and have not finished slow."""

    def __init__(self) -> None:
        super().__init__()
        self.delay = 0
        self.gate = asyncio.Event()
        self.between = 0
        self.peak_between = 0
        self.models["slow"] = lambda X: {"Y": X * 2}
        self.order: list[float] = []

    async def infer(self, request):  # type: ignore[no-untyped-def]
        if request.model_name == "slow":
            await self.gate.wait()
        response = await super().infer(request)
        if request.model_name == "add1":
            self.between += 1
            self.peak_between = max(self.peak_between, self.between)
            self.order.append(float(request.inputs[0].data[0, 0]))
        else:
            self.between -= 1
        return response


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.mark.parametrize("limit, expected_peak", [(3, 3), (0, 20)])
async def test_a_slow_last_step_holds_back_the_first(limit: int, expected_peak: int) -> None:
    core = GatedCore()
    field = f"max_inflight_requests: {limit}" if limit else ""
    scheduler = make_scheduler(core, CHAIN % field)
    await scheduler.start()
    futures = [scheduler.submit(request_for(float(i))) for i in range(20)]
    await settle()
    stats = scheduler.statistics
    assert core.between == expected_peak  # the first step ran this many times, no more
    assert scheduler.inflight == expected_peak and stats.ensemble_inflight == expected_peak
    assert stats.pending == 20 - expected_peak  # waiting to enter
    core.gate.set()
    responses = await asyncio.gather(*futures)
    assert core.peak_between == expected_peak
    assert [r.outputs[0].data.tolist() for r in responses] == [
        [[(i + 1) * 2.0] * 2] for i in range(20)
    ]
    assert core.order == [float(i) for i in range(20)]  # first come, first served
    assert stats.ensemble_inflight == 0 and stats.pending == 0
    assert stats.success.count == 20


async def test_the_wait_counts_as_the_ensembles_queue_time() -> None:
    core = GatedCore()
    scheduler = make_scheduler(core, CHAIN % "max_inflight_requests: 1")
    await scheduler.start()
    first, second = scheduler.submit(request_for(1.0)), scheduler.submit(request_for(2.0))
    await settle()
    await asyncio.sleep(0.02)
    core.gate.set()
    await asyncio.gather(first, second)
    stats = scheduler.statistics
    assert stats.queue.count == 2 and stats.queue.ns > 0  # the second one waited


async def test_a_cancelled_waiter_leaves_the_line_and_takes_no_place() -> None:
    core = GatedCore()
    scheduler = make_scheduler(core, CHAIN % "max_inflight_requests: 1")
    await scheduler.start()
    inside = scheduler.submit(request_for(0.0))
    waiting = [scheduler.submit(request_for(float(i))) for i in (1, 2)]
    await settle()
    waiting[0].cancel()
    await settle()
    assert scheduler.statistics.pending == 1 and scheduler.inflight == 1
    core.gate.set()
    await inside
    with pytest.raises(asyncio.CancelledError):
        await waiting[0]
    assert (await waiting[1]).outputs[0].data.tolist() == [[6.0, 6.0]]
    assert core.order == [0.0, 2.0]
    assert scheduler.inflight == 0 and scheduler.statistics.pending == 0
    assert scheduler.statistics.fail.count == 1  # the cancelled one, as CANCELED


async def test_a_failed_request_gives_its_place_back() -> None:
    from protocol.errors import InvalidArgument

    core = GatedCore()
    core.fail["add1"] = InvalidArgument("bad")
    scheduler = make_scheduler(core, CHAIN % "max_inflight_requests: 1")
    await scheduler.start()
    for _ in range(3):
        with pytest.raises(InvalidArgument):
            await scheduler.submit(request_for())
    assert scheduler.inflight == 0


async def test_drain_with_waiters_fails_them_as_unloaded() -> None:
    core = GatedCore()
    scheduler = make_scheduler(core, CHAIN % "max_inflight_requests: 1")
    await scheduler.start()
    futures = [scheduler.submit(request_for(float(i))) for i in range(3)]
    await settle()
    await scheduler.drain(0.01)
    for future in futures:
        with pytest.raises(Unavailable, match="unloaded"):
            await future
    assert scheduler.inflight == 0 and scheduler.statistics.pending == 0


async def test_parallel_steps_of_one_request_take_one_place() -> None:
    core = FakeCore()
    scheduler = make_scheduler(core, DIAMOND.replace("step [", "max_inflight_requests: 1 step ["))
    await scheduler.start()
    responses = await asyncio.gather(*(scheduler.submit(request_for(1.0)) for _ in range(3)))
    assert all(r.outputs[0].data.tolist() == [[10.0, 10.0]] for r in responses)
    assert core.peak == 2  # times2 and times3 of one request together, never two requests


async def test_the_limit_hands_a_place_cancelled_in_passing_to_the_next() -> None:
    seen: list[tuple[int, int]] = []
    limit = InflightLimit(1, lambda holders, waiters: seen.append((holders, waiters)))
    await limit.acquire()
    second = asyncio.ensure_future(limit.acquire())
    third = asyncio.ensure_future(limit.acquire())
    await settle()
    limit.release()  # the place goes to `second`...
    second.cancel()  # ...which is cancelled before it runs: the place moves on to `third`
    await settle()
    assert second.cancelled() and third.done()
    assert limit.holders == 1 and limit.waiting == 0
    limit.release()
    assert limit.holders == 0 and seen[-1] == (0, 0)


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        InflightLimit(-1)


def test_a_statistics_reset_after_warm_up_keeps_the_levels() -> None:
    """Warm-up's reset clears counts, not levels: a sequence model's live sequences and an
    ensemble's in-flight requests are still what they were."""
    from scheduler.stats import VersionStatistics

    stats = VersionStatistics("m", "1")
    stats.sequences_changed(2)
    stats.ensemble_inflight_changed(3)
    stats.pending_changed(1)
    stats.reset()
    assert (stats.sequences_active, stats.ensemble_inflight, stats.pending) == (2, 3, 1)
