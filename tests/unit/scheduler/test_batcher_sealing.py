"""Dynamic batcher: when a batch is sealed and what goes into it (preferred sizes, the queue
delay, max batch size, multi-row and ragged requests). Harness: tests/support/batcher_harness.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from protocol.types import InferRequest, Tensor
from scheduler.batcher import BatchQueue, DynamicBatcher
from scheduler.interface import VersionSpec
from scheduler.queue_scheduler import Entry
from scheduler.stats import VersionStatistics
from tests.support.batcher_harness import (
    MS,
    AddOneModel,
    Recorder,
    busy,
    make_config,
    results,
    row_values,
)

# -- preferred sizes and the queue delay (qa/L0_batcher cases: max 8, preferred [2, 6]) --------

TRITON_CASE = "preferred_batch_size: [2, 6] max_queue_delay_microseconds: 10000000"


@pytest.mark.parametrize("rows", [2, 6, 7])
async def test_lone_preferred_or_oversized_request_runs_at_once(batcher, rows):
    h = await batcher(TRITON_CASE)
    future = h.submit(1, rows=rows)
    (response,) = await results(future)
    assert h.recorder.batches == [[1] * rows]
    assert row_values(response) == [2.0] * rows
    assert h.stats.batch_stats[rows].compute_infer.count == 1


@pytest.mark.parametrize("rows", [1, 3])
async def test_lone_small_request_waits_the_full_delay_then_runs_alone(batcher, rows):
    h = await batcher(TRITON_CASE)
    future = h.submit(1, rows=rows)
    await h.advance(10_000 * MS - 1)
    assert h.pending == 1 and not future.done()
    await h.advance(1)
    await results(future)
    assert h.recorder.batches == [[1] * rows]


async def test_arrival_that_completes_a_preferred_size_sends_at_once(batcher):
    h = await batcher(TRITON_CASE)
    first = h.submit(1)
    await h.settle()
    assert h.pending == 1
    second = h.submit(2)
    responses = await results(first, second)
    assert h.recorder.batches == [[1, 2]]
    assert [row_values(r) for r in responses] == [[2.0], [3.0]]


async def test_largest_preferred_size_is_sent_and_the_rest_waits(batcher):
    h = await batcher("preferred_batch_size: [2, 4] max_queue_delay_microseconds: 5000")
    first = await busy(h)
    rest = [h.submit(n) for n in range(1, 6)]
    h.recorder.release_all()
    await results(first, *rest[:4])
    assert h.recorder.batches == [[0], [1, 2, 3, 4]]
    assert h.pending == 1
    await h.advance(5 * MS)
    await results(rest[4])
    assert h.recorder.batches[-1] == [5]


async def test_a_batch_that_can_be_sealed_is_launched_inside_submit(batcher):
    h = await batcher(TRITON_CASE)
    first = h.submit(1)
    assert h.pending == 1  # waits: no preferred size yet, and the delay has not run out
    second = h.submit(2)
    assert h.pending == 0  # [1, 2] is a preferred size: handed over before submit returned
    await results(first, second)
    assert h.recorder.batches == [[1, 2]]


async def test_requests_arriving_in_the_turn_the_delay_runs_out_share_its_batch(batcher):
    h = await batcher("max_queue_delay_microseconds: 1000")
    first = h.submit(1)
    await h.settle()
    h.clock.advance(1 * MS)  # the delay runs out; the timer's pass comes on the next loop turn
    later = [h.submit(2), h.submit(3)]  # arrivals of this same turn are not cut off
    await results(first, *later)
    assert h.recorder.batches == [[1, 2, 3]]


async def test_the_next_batch_starts_in_the_callback_that_answers_the_last(batcher):
    h = await batcher("")
    zero = await busy(h)
    one, two = h.submit(1), h.submit(2)
    assert h.pending == 2
    h.recorder.release_all()
    async with asyncio.timeout(10):
        await zero
    assert h.pending == 0  # [1, 2] was launched before request 0's answer was set
    await results(one, two)
    assert h.recorder.batches == [[0], [1, 2]]


async def test_a_batch_due_when_the_instance_frees_takes_that_turn_s_arrivals(batcher):
    """The answer that frees the instance comes back mid-turn: a batch due only by its delay
    is sealed by the timer's pass after it, so what else arrives in that turn joins it."""
    h = await batcher("max_queue_delay_microseconds: 1000")
    zero = await busy(h)
    first = h.submit(1)
    await h.advance(1 * MS)  # due now, but no instance is free
    assert h.pending == 1
    later: list[asyncio.Future] = []
    zero.add_done_callback(lambda _: later.append(h.submit(2)))  # runs in the answer's turn
    h.recorder.release_all()
    await results(zero, first)
    await results(*later)
    assert h.recorder.batches == [[0], [1, 2]]


@pytest.mark.parametrize(
    ("config", "max_batch_size"),
    [
        ("preferred_batch_size: [2, 6] max_queue_delay_microseconds: 1000", 8),  # preferred
        ("max_queue_delay_microseconds: 1000", 2),  # full: it cannot grow
    ],
)
async def test_a_due_batch_of_a_preferred_size_starts_in_the_answer_s_callback(
    batcher, config, max_batch_size
):
    """Due by its delay while the instance was busy, and already a size worth sending: the
    batch is not left for the timer's pass, which comes loop turns later while the freed
    instance waits (bench/FINDINGS.md 39)."""
    h = await batcher(config, max_batch_size=max_batch_size)
    zero = await busy(h)
    one, two = h.submit(1), h.submit(2)
    await h.advance(1 * MS)  # due now, but no instance is free
    assert h.pending == 2
    seen: list[int] = []
    zero.add_done_callback(lambda _: seen.append(h.pending))  # the answer's own turn
    h.recorder.release_all()
    await results(zero, one, two)
    assert seen == [0]  # handed over in the callback that answered request 0
    assert h.recorder.batches == [[0], [1, 2]]


async def test_a_preferred_batch_not_yet_due_starts_in_the_answer_s_callback(batcher):
    h = await batcher(TRITON_CASE)
    zero = await busy(h)
    one, two = h.submit(1), h.submit(2)
    h.recorder.release_all()
    async with asyncio.timeout(10):
        await zero
    assert h.pending == 0
    await results(one, two)
    assert h.recorder.batches == [[0], [1, 2]]


async def test_zero_delay_sends_what_is_there(batcher):
    h = await batcher("preferred_batch_size: [4]")
    await results(h.submit(1))
    assert h.recorder.batches == [[1]]


# -- batch composition --------------------------------------------------------------------------


async def test_max_batch_size_caps_every_batch(batcher):
    h = await batcher("", max_batch_size=2)
    futures = [await busy(h)] + [h.submit(n) for n in range(1, 6)]
    h.recorder.release_all()
    await results(*futures)
    assert h.recorder.batches == [[0], [1, 2], [3, 4], [5]]


async def test_batches_grow_while_the_instance_is_busy(batcher):
    h = await batcher("")
    futures = [await busy(h)] + [h.submit(n) for n in range(1, 5)]
    await h.settle()
    assert h.pending == 4
    h.recorder.release_all()
    responses = await results(*futures)
    assert h.recorder.batches == [[0], [1, 2, 3, 4]]
    assert [row_values(r) for r in responses] == [[1.0], [2.0], [3.0], [4.0], [5.0]]
    assert [r.id for r in responses] == ["0", "1", "2", "3", "4"]
    assert {r.model_version for r in responses} == {"1"}


async def test_a_multi_row_request_is_never_split(batcher):
    h = await batcher("", max_batch_size=4)
    zero = await busy(h)
    three, two, one = h.submit(1, rows=3), h.submit(2, rows=2), h.submit(3, rows=1)
    h.recorder.release_all()
    _, r3, r2, r1 = await results(zero, three, two, one)
    assert h.recorder.batches == [[0], [1, 1, 1], [2, 2, 3]]
    assert r3.outputs[0].shape == (3, 2) and row_values(r3) == [2.0, 2.0, 2.0]
    assert r2.outputs[0].shape == (2, 2) and row_values(r2) == [3.0, 3.0]
    assert r1.outputs[0].shape == (1, 2) and row_values(r1) == [4.0]
    assert h.stats.inference_count == 7


async def test_only_requests_of_equal_shape_share_a_batch(batcher):
    h = await batcher("", dims="-1")
    zero = await busy(h)
    futures = [
        h.submit(1, width=2),
        h.submit(2, width=3),
        h.submit(3, width=3),
        h.submit(4, width=2),
    ]
    h.recorder.release_all()
    responses = await results(zero, *futures)
    # The first request of another shape closes the batch; the queue is not reordered.
    assert h.recorder.batches == [[0], [1], [2, 3], [4]]
    assert [r.outputs[0].shape for r in responses[1:]] == [(1, 2), (1, 3), (1, 3), (1, 2)]


async def test_ragged_inputs_may_share_a_batch():
    config = make_config("", dims="-1", extra="allow_ragged_batch: true")
    queue = BatchQueue(config)
    loop = asyncio.get_running_loop()
    entries = []
    for width in (2, 3):
        data = np.zeros((1, width), np.float32)
        request = InferRequest(
            "m", batch_size=1, inputs=[Tensor("INPUT0", "FP32", data.shape, data)]
        )
        entries.append(Entry(request, loop.create_future(), 1, 0))
        queue.push(entries[-1])
    batch, _ = queue.take(0, flush=False)
    assert batch == entries


async def test_the_real_clock_runs_out_the_delay():
    """Smoke test of the default MonotonicClock: a lone request still gets its answer."""
    config = make_config("preferred_batch_size: [4] max_queue_delay_microseconds: 1000")
    recorder = Recorder()
    spec = VersionSpec(
        "m",
        1,
        config,
        Path("/nonexistent"),
        Path("/nonexistent/1"),
        type("AddOneModel", (AddOneModel,), {"recorder": recorder}),
    )
    scheduler = DynamicBatcher(spec, VersionStatistics("m", "1"))
    await scheduler.start()
    data = np.full((1, 2), 7, np.float32)
    future = scheduler.submit(
        InferRequest("m", batch_size=1, inputs=[Tensor("INPUT0", "FP32", (1, 2), data)])
    )
    (response,) = await results(future)
    assert row_values(response) == [8.0]
    await scheduler.drain(1)
    await scheduler.stop()
