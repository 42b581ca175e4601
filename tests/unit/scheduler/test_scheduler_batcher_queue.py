"""Dynamic batcher queueing: priority levels, the queue policy (max queue size, timeouts,
timeout actions and overrides), and what the priority queue keeps alive.
Harness: batcher_harness.py."""

from __future__ import annotations

import asyncio
import gc
import weakref

import numpy as np
import pytest
from batcher_harness import MS, busy, make_config, results, row_values

from protocol.errors import Overloaded, Unavailable
from protocol.types import InferRequest, Tensor
from scheduler.batcher import BatchQueue
from scheduler.queue_scheduler import Entry
from scheduler.stats import FailureReason, RejectionReason

# -- priorities ---------------------------------------------------------------------------------


async def test_priority_levels_go_first_and_fifo_within_a_level(batcher):
    h = await batcher("priority_levels: 2 default_priority_level: 2", max_batch_size=2)
    zero = await busy(h)
    futures = [
        h.submit(1, priority=2),
        h.submit(2, priority=2),
        h.submit(3, priority=1),
        h.submit(4, priority=0),
        h.submit(5, priority=1),
    ]
    h.recorder.release_all()
    await results(zero, *futures)
    assert h.recorder.batches == [[0], [3, 5], [1, 2], [4]]


# -- queue policy -------------------------------------------------------------------------------


async def test_a_full_queue_rejects_at_once_without_blocking(batcher):
    h = await batcher("default_queue_policy { max_queue_size: 1 }")
    zero = await busy(h)  # running, so no longer queued
    queued = h.submit(1)
    with pytest.raises(Unavailable) as info:
        h.submit(2)
    assert info.value.message == "Exceeds maximum queue size"
    assert info.value.http_status() == 503
    assert h.pending == 1
    assert h.observer.failures == [FailureReason.REJECTED]
    h.recorder.release_all()
    await results(zero, queued)
    assert h.recorder.batches == [[0], [1]]
    assert h.pending == 0


async def test_a_full_queue_says_when_to_retry_and_counts_why(batcher):
    h = await batcher("default_queue_policy { max_queue_size: 20 }", max_batch_size=1)
    for number in range(1, 9):  # 8 requests run, one every 250 ms: about 4 per second
        await results(h.submit(number))
        await h.advance(250 * MS)
    zero = await busy(h)
    queued = [h.submit(number) for number in range(10, 30)]
    with pytest.raises(Overloaded) as info:
        h.submit(30)
    assert isinstance(info.value, Unavailable)  # UNAVAILABLE, as before, plus the hint
    assert info.value.message == "Exceeds maximum queue size"
    assert info.value.retry_after == 5  # 20 queued, 9 drained in the last 2 s: 20 / 4.5
    await h.advance(11_000 * MS)  # nothing left the queue for longer than the 10 s window
    with pytest.raises(Overloaded) as info:
        h.submit(31)
    assert info.value.retry_after == 10
    assert h.observer.rejections == [RejectionReason.QUEUE_FULL] * 2
    assert h.observer.failures == [FailureReason.REJECTED] * 2
    h.recorder.release_all()
    await results(zero, *queued)


async def test_queue_size_limit_is_per_priority_level(batcher):
    h = await batcher(
        "priority_levels: 2 default_priority_level: 2 "
        "priority_queue_policy { key: 1 value: { max_queue_size: 1 } }"
    )
    zero = await busy(h)
    futures = [h.submit(1, priority=1), h.submit(2, priority=2), h.submit(3, priority=2)]
    with pytest.raises(Unavailable, match="Exceeds maximum queue size"):
        h.submit(4, priority=1)
    h.recorder.release_all()
    await results(zero, *futures)
    assert h.recorder.batches == [[0], [1, 2, 3]]


async def test_timeout_reject_fails_the_request_and_it_never_runs(batcher):
    h = await batcher("default_queue_policy { default_timeout_microseconds: 1000 }")
    zero = await busy(h)
    late = h.submit(1, timeout_us=1000)
    await h.advance(1 * MS - 1)
    assert not late.done()
    await h.advance(1)
    (error,) = await results(late)
    assert isinstance(error, Unavailable) and error.message == "Request timeout expired"
    assert h.observer.failures == [FailureReason.REJECTED]
    assert h.observer.rejections == [RejectionReason.QUEUE_TIMEOUT]
    assert h.pending == 0
    h.recorder.release_all()
    await results(zero, h.submit(2))
    assert h.recorder.batches == [[0], [2]]


async def test_timeout_delay_moves_the_request_behind_unexpired_ones(batcher):
    h = await batcher(
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 }",
        max_batch_size=1,
    )
    zero = await busy(h)
    delayed = h.submit(1)
    await h.advance(1 * MS)
    fresh = h.submit(2)
    h.recorder.release_all()
    responses = await results(zero, delayed, fresh)
    assert h.recorder.batches == [[0], [2], [1]]
    assert [row_values(r) for r in responses] == [[1.0], [2.0], [3.0]]
    assert h.observer.failures == []


@pytest.mark.parametrize("allow", [True, False])
async def test_a_shorter_request_timeout_applies_only_when_override_is_allowed(batcher, allow):
    h = await batcher(
        "default_queue_policy { default_timeout_microseconds: 10000 "
        f"allow_timeout_override: {str(allow).lower()} }}"
    )
    zero = await busy(h)
    short = h.submit(1, timeout_us=1000)
    default = h.submit(2, timeout_us=0)
    longer = h.submit(3, timeout_us=50_000)  # longer than the default: the default applies
    await h.advance(1 * MS)
    assert short.done() is allow
    assert not default.done() and not longer.done()
    await h.advance(9 * MS)
    errors = await results(short, default, longer)
    assert [e.message for e in errors] == ["Request timeout expired"] * 3
    h.recorder.release_all()
    await results(zero)
    assert h.recorder.batches == [[0]]


async def test_answered_requests_are_not_kept_alive_behind_a_waiting_one():
    """A starved low-priority request holds the earliest deadline; the requests that pass it
    must still be freed once answered, not kept until their own (long) timeouts."""
    config = make_config(
        "priority_levels: 2 default_priority_level: 2 "
        "default_queue_policy { default_timeout_microseconds: 60000000 }",
        max_batch_size=10,
    )
    queue = BatchQueue(config)
    loop = asyncio.get_running_loop()

    def entry(priority: int) -> Entry:
        data = np.zeros((1, 2), np.float32)
        # As admission leaves it: level and queue timeout resolved by the queue policy.
        request = InferRequest(
            "m",
            batch_size=1,
            priority=priority,
            timeout_us=60_000_000,
            inputs=[Tensor("INPUT0", "FP32", data.shape, data)],
        )
        return Entry(request, loop.create_future(), 1, 0)

    starved = entry(2)
    queue.push(starved)
    inputs = []
    for _ in range(30):
        passing = [entry(1) for _ in range(10)]
        inputs.extend(weakref.ref(e.request.inputs[0].data) for e in passing)
        for e in passing:
            queue.push(e)
        batch, _ = queue.take(0, flush=False)
        assert batch == passing
        del batch, passing, e
    gc.collect()
    assert sum(ref() is not None for ref in inputs) <= 150
    assert queue.take(0, flush=False)[0] == [starved]
