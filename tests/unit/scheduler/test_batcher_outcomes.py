"""Dynamic batcher outcomes: cancellation, backend errors, response ordering, request-list
backends, statistics and the pending count, and drain. Harness: tests/support/batcher_harness.py."""

from __future__ import annotations

import asyncio

import pytest

from protocol.errors import InternalError, Unavailable
from scheduler.stats import FailureReason
from tests.support.batcher_harness import MS, RequestListModel, busy, results, row_values

# -- cancellation, errors, ordering -----------------------------------------------------------


async def test_a_cancelled_request_never_executes(batcher):
    h = await batcher("")
    zero = await busy(h)
    cancelled, kept = h.submit(1), h.submit(2)
    await h.settle()
    cancelled.cancel()
    await h.settle()
    assert h.pending == 1
    assert h.observer.failures == [FailureReason.CANCELED]
    h.recorder.release_all()
    responses = await results(zero, kept)
    assert h.recorder.batches == [[0], [2]]
    assert row_values(responses[1]) == [3.0]
    assert h.stats.fail.count == 1 and h.stats.success.count == 2


async def test_a_request_cancelled_while_waiting_for_the_delay_never_executes(batcher):
    h = await batcher("max_queue_delay_microseconds: 1000")
    future = h.submit(1)
    await h.settle()
    future.cancel()
    await h.advance(1 * MS)
    assert h.pending == 0 and h.recorder.started == []
    await results(h.submit(2, rows=8))
    assert h.recorder.batches == [[2] * 8]


async def test_an_error_reaches_every_request_of_its_batch(batcher):
    h = await batcher("")
    zero = await busy(h)
    h.recorder.fail_on = {2}
    one, two = h.submit(1), h.submit(2)
    h.recorder.release_all()
    ok, err1, err2 = await results(zero, one, two)
    assert row_values(ok) == [1.0]
    for err in (err1, err2):
        assert isinstance(err, InternalError) and err.message == "boom"
    assert h.observer.failures == [FailureReason.BACKEND] * 2
    assert h.scheduler.healthy()
    (after,) = await results(h.submit(3))
    assert row_values(after) == [4.0]


async def test_a_fatal_error_takes_the_instance_out_of_service(batcher):
    h = await batcher("")
    zero = await busy(h)
    h.recorder.fail_on, h.recorder.fatal = {0}, True
    queued = h.submit(1)
    h.recorder.release_all()
    err0, err1 = await results(zero, queued)
    assert err0.message == "boom"
    assert isinstance(err1, Unavailable)
    assert err1.message == "'m' version 1 is not at ready state"
    assert not h.scheduler.healthy()
    with pytest.raises(Unavailable):
        h.submit(2)
    assert h.pending == 0
    assert h.recorder.batches == [[0]]


@pytest.mark.parametrize("preserve", [True, False])
async def test_preserve_ordering_holds_later_responses_back(batcher, preserve):
    h = await batcher(f"preserve_ordering: {str(preserve).lower()}", instances=2, max_batch_size=1)
    h.recorder.hold(1)
    first, second = h.submit(1), h.submit(2)
    await h.running(1)
    await h.executions(1)  # request 2 ran on the other instance and came back
    await h.settle()
    assert h.recorder.batches == [[2]]
    assert second.done() is not preserve
    assert not first.done()
    h.recorder.release_all()
    await results(first, second)


async def test_request_list_backend_gets_requests_not_a_concatenation(batcher):
    h = await batcher("", model=RequestListModel)
    zero = await busy(h)
    futures = [h.submit(12), h.submit(13), h.submit(14)]
    h.recorder.release_all()
    ok0, ok12, err13, ok14 = await results(zero, *futures)
    assert h.recorder.request_lists == [1, 3]
    assert [row_values(r) for r in (ok0, ok12, ok14)] == [[1.0], [13.0], [15.0]]
    assert isinstance(err13, InternalError) and err13.message == "unlucky"
    assert h.observer.failures == [FailureReason.BACKEND]
    assert h.stats.execution_count == 2 and h.stats.inference_count == 4


# -- statistics, drain ----------------------------------------------------------------------------


async def test_statistics_and_pending_count_are_exact(batcher):
    h = await batcher("max_queue_delay_microseconds: 5000")
    first = h.submit(1)
    await h.advance(2 * MS)
    second = h.submit(2, rows=3)
    await h.settle()
    assert h.pending == 2 and h.observer.pending == [1, 1]
    await h.advance(3 * MS)  # the first request has waited the full delay
    assert h.pending == 0 and h.observer.pending == [1, 1, -2]
    await results(first, second)
    stats = h.stats
    assert stats.success.count == 2 and stats.queue.count == 2
    assert stats.queue.ns == 5 * MS + 3 * MS  # arrival -> start of execution, per request
    assert stats.success.ns == 5 * MS + 3 * MS  # the fake clock did not move while executing
    assert stats.compute_input.count == stats.compute_infer.count == stats.compute_output.count == 2
    assert stats.inference_count == 4 and stats.execution_count == 1
    assert list(stats.batch_stats) == [4]
    assert stats.batch_stats[4].compute_infer.count == 1
    assert h.observer.batch_sizes == [4]
    assert stats.fail.count == 0


async def test_pending_returns_to_zero_after_every_way_out(batcher):
    h = await batcher(
        "default_queue_policy { default_timeout_microseconds: 1000 max_queue_size: 3 }"
    )
    zero = await busy(h)
    timed_out, cancelled, failed = h.submit(1), h.submit(2), h.submit(3)
    with pytest.raises(Unavailable):
        h.submit(4)
    cancelled.cancel()
    await h.settle()
    assert h.pending == 2
    h.recorder.fail_on = {3}
    await h.advance(1 * MS)  # 1 and 3 both time out
    assert h.pending == 0
    h.recorder.release_all()
    await results(zero, timed_out, failed)
    assert sum(h.observer.pending) == 0
    assert sorted(h.observer.failures) == sorted(
        [FailureReason.REJECTED] * 3 + [FailureReason.CANCELED]
    )
    assert h.stats.fail.count == 4 and h.stats.success.count == 1


async def test_drain_refuses_new_requests_and_finishes_queued_ones(batcher):
    h = await batcher("max_queue_delay_microseconds: 10000000")
    zero = await busy(h)
    queued = [h.submit(1), h.submit(2)]
    drain = asyncio.ensure_future(h.scheduler.drain(30))
    await h.settle()
    with pytest.raises(Unavailable) as info:
        h.submit(3)
    assert info.value.message == "'m' version 1 is not at ready state"
    assert not drain.done()
    h.recorder.release_all()
    responses = await results(zero, *queued)
    await asyncio.wait_for(drain, 10)  # without waiting out the 10 s delay
    assert h.recorder.batches == [[0], [1, 2]]
    assert [row_values(r) for r in responses] == [[1.0], [2.0], [3.0]]
    assert h.pending == 0


async def test_drain_timeout_fails_what_is_left(batcher):
    h = await batcher("")
    zero = await busy(h)
    queued = h.submit(1)
    drain = asyncio.ensure_future(h.scheduler.drain(1.0))
    await h.settle()
    await h.advance(1_000 * MS - 1)
    assert not drain.done() and not queued.done()
    await h.advance(1)
    await asyncio.wait_for(drain, 10)
    errors = await results(zero, queued)
    assert [e.message for e in errors] == ["'m' version 1 is not at ready state"] * 2
    assert h.pending == 0
    assert h.observer.failures == [FailureReason.OTHER] * 2
    h.recorder.release_all()
    await h.scheduler.stop()
    assert h.recorder.batches == [[0]]  # the running batch finished; nothing else ran
