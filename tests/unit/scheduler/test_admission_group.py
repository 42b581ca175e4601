"""Requests admitted together (scheduler/queue_scheduler.py's admission_group, the model owner
admitting one frame of a frontend process) share one dispatch pass, when the group ends.
Harness: tests/support/batcher_harness.py."""

from __future__ import annotations

import pytest

from protocol.errors import InvalidArgument
from scheduler.queue_scheduler import admission_group
from tests.support.batcher_harness import results, row_values

TRITON_CASE = "preferred_batch_size: [2, 6] max_queue_delay_microseconds: 10000000"


async def test_one_at_a_time_the_second_arrival_seals_a_batch_of_two(batcher):
    h = await batcher(TRITON_CASE)
    futures = [h.submit(n) for n in range(1, 7)]
    await results(*futures[:4])
    assert h.recorder.batches[0] == [1, 2]  # the preferred 2, sealed by the second arrival


async def test_requests_admitted_in_one_group_form_one_batch_when_it_ends(batcher):
    h = await batcher(TRITON_CASE)
    with admission_group():
        futures = [h.submit(n) for n in range(1, 7)]
        assert h.pending == 6 and not h.recorder.batches  # no pass inside the group
    responses = await results(*futures)
    assert h.recorder.batches == [[1, 2, 3, 4, 5, 6]]  # the preferred 6, in one batch
    assert [row_values(r) for r in responses] == [[float(n + 1)] for n in range(1, 7)]


async def test_a_refused_request_inside_a_group_leaves_the_others_admitted(batcher):
    h = await batcher(TRITON_CASE)
    with admission_group():
        with admission_group():  # nested: joins the outer group
            first = h.submit(1)
        with pytest.raises(InvalidArgument, match="batch"):
            h.submit(2, rows=99)  # more rows than max_batch_size: refused at once
        second = h.submit(3)
        assert not h.recorder.batches
    await results(first, second)
    assert h.recorder.batches == [[1, 3]]
