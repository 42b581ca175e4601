"""The dynamic batcher's rules, driven through its public API with a manual clock and a fake model.

Every request carries its own number in every row of INPUT0, so the fake model can record which
requests (rows) ran together; it answers INPUT0 + 1. Time only moves when a test advances the
clock, so "still waiting" is checked with the pending count, never with sleeps.
"""
from __future__ import annotations

import asyncio
import gc
import weakref
import threading
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from backends.base import Backend, BackendError
from protocol.errors import InternalError, Unavailable
from protocol.model_config_pb2 import ModelConfig
from protocol.types import InferRequest, Tensor
from scheduler.batcher import BatchQueue, DynamicBatcher
from scheduler.clock import ManualClock
from scheduler.default import Entry
from scheduler.interface import VersionSpec
from scheduler.stats import FailureReason, VersionStatistics

MS = 1_000_000  # ns


class Recorder:
    """What the fake model saw, and the knobs a test turns (shared with the instance threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[list[int]] = []  # row ids of each batch as it began executing
        self.batches: list[list[int]] = []  # row ids of each batch as it finished executing
        self.instances: list[str] = []  # instance that ran each finished batch
        self.holds: dict[int, threading.Event] = {}  # request id -> gate its batch waits on
        self.fail_on: set[int] = set()
        self.fatal = False
        self.request_lists: list[int] = []

    def hold(self, request_id: int) -> threading.Event:
        gate = self.holds[request_id] = threading.Event()
        return gate

    def release_all(self) -> None:
        for gate in self.holds.values():
            gate.set()


class AddOneModel(Backend):
    """A named fake model: OUTPUT0 = INPUT0 + 1, recording each executed batch."""

    backend_name = "fake_add_one"
    default_model_filename = "model.fake"
    recorder: Recorder

    def load(self) -> None:
        pass

    def execute(self, inputs):
        x = inputs["INPUT0"]
        self.run([int(v) for v in (x[:, 0] if x.ndim > 1 else x)])
        return {"OUTPUT0": x + 1}

    def run(self, ids: list[int]) -> None:
        """Record the batch, wait on a test's gate, fail when told to."""
        rec = self.recorder
        with rec.lock:
            rec.started.append(ids)
        for request_id in ids:
            gate = rec.holds.get(request_id)
            if gate is not None:
                assert gate.wait(10), "test never released the gate"
        with rec.lock:
            rec.batches.append(ids)
            rec.instances.append(self.instance.name)
        if rec.fail_on & set(ids):
            raise BackendError("boom", fatal=rec.fatal)


class RequestListModel(AddOneModel):
    """Takes the requests one by one, as a Python model does; id 13 fails alone."""

    backend_name = "fake_request_list"
    takes_request_lists = True

    def execute_requests(self, requests):
        self.recorder.request_lists.append(len(requests))
        self.run([int(r["INPUT0"].reshape(-1)[0]) for r in requests])
        return [ValueError("unlucky") if int(r["INPUT0"].reshape(-1)[0]) == 13
                else {"OUTPUT0": r["INPUT0"] + 1} for r in requests]


class Observer:
    """A MetricsObserver that remembers what it was told."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.pending: list[int] = []
        self.batch_sizes: list[int] = []

    def request_succeeded(self, *args) -> None:
        pass

    def request_failed(self, reason: str, total_ns: int) -> None:
        self.failures.append(reason)

    def batch_executed(self, batch_size: int) -> None:
        self.batch_sizes.append(batch_size)

    def pending_changed(self, delta: int) -> None:
        self.pending.append(delta)


def make_config(batching: str, *, max_batch_size: int = 8, dims: str = "2",
                instances: int = 1, extra: str = "") -> ModelConfig:
    text = f"""
        name: "m" backend: "fake" max_batch_size: {max_batch_size}
        input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dims} ] {extra} }}]
        output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dims} ] }}]
        instance_group [{{ kind: KIND_CPU count: {instances} }}]
        dynamic_batching {{ {batching} }}
    """
    return text_format.Parse(text, ModelConfig())


class Harness:
    def __init__(self, config: ModelConfig, model: type[AddOneModel]) -> None:
        self.clock = ManualClock(start_ns=1_000 * MS)
        self.recorder = Recorder()
        self.observer = Observer()
        self.stats = VersionStatistics("m", "1", observer=self.observer)
        backend_cls = type(model.__name__, (model,), {"recorder": self.recorder})
        spec = VersionSpec("m", 1, config, Path("/nonexistent"), Path("/nonexistent/1"),
                           backend_cls)
        self.scheduler = DynamicBatcher(spec, self.stats, clock=self.clock)

    def request(self, number: int, rows: int = 1, width: int = 2, priority: int = 0,
                timeout_us: int = 0) -> InferRequest:
        data = np.full((rows, width), number, dtype=np.float32)
        return InferRequest("m", id=str(number), batch_size=rows, priority=priority,
                            timeout_us=timeout_us, arrival_ns=self.clock.now_ns(),
                            inputs=[Tensor("INPUT0", "FP32", data.shape, data)])

    def submit(self, number: int, **kwargs) -> asyncio.Future:
        return self.scheduler.submit(self.request(number, **kwargs))

    async def settle(self) -> None:
        """Let the dispatcher act on everything that happened so far."""
        for _ in range(10):
            await asyncio.sleep(0)

    async def advance(self, ns: int) -> None:
        self.clock.advance(ns)
        await self.settle()

    async def running(self, *ids: int) -> None:
        """Wait until a batch with exactly these row ids is executing (thread side)."""
        await self._until(lambda: list(ids) in self.recorder.started)

    async def executions(self, count: int) -> None:
        """Wait until the loop has handled `count` finished executions."""
        await self._until(lambda: self.stats.execution_count >= count)

    async def _until(self, predicate) -> None:
        for _ in range(5000):
            if predicate():
                return
            await asyncio.sleep(0.001)
        raise AssertionError("condition never became true")

    @property
    def pending(self) -> int:
        return self.stats.pending


async def results(*futures: asyncio.Future):
    return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)


@pytest.fixture
async def batcher():
    made: list[Harness] = []

    async def make(batching: str = "", model: type[AddOneModel] = AddOneModel,
                   **config_kwargs) -> Harness:
        harness = Harness(make_config(batching, **config_kwargs), model)
        await harness.scheduler.start()
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.recorder.release_all()
        await harness.scheduler.drain(0)
        await harness.scheduler.stop()


async def busy(h: Harness, number: int = 0) -> asyncio.Future:
    """Occupy the (first free) instance with request `number` until the test releases it."""
    h.recorder.hold(number)
    future = h.submit(number)
    await h.settle()
    if h.pending:  # a lone request waits for the queue delay: let it run out
        await h.advance(h.clock.next_timer_ns() - h.clock.now_ns())
    await h.running(number)
    return future


def row_values(response) -> list[float]:
    return response.outputs[0].data[:, 0].tolist()


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
    futures = [h.submit(1, width=2), h.submit(2, width=3), h.submit(3, width=3),
               h.submit(4, width=2)]
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
    for number, width in ((1, 2), (2, 3)):
        data = np.zeros((1, width), np.float32)
        request = InferRequest("m", batch_size=1,
                               inputs=[Tensor("INPUT0", "FP32", data.shape, data)])
        entries.append(Entry(request, loop.create_future(), 1, 0))
        queue.push(entries[-1])
    batch, _ = queue.take(0, flush=False)
    assert batch == entries


async def test_priority_levels_go_first_and_fifo_within_a_level(batcher):
    h = await batcher("priority_levels: 2 default_priority_level: 2", max_batch_size=2)
    zero = await busy(h)
    futures = [h.submit(1, priority=2), h.submit(2, priority=2), h.submit(3, priority=1),
               h.submit(4, priority=0), h.submit(5, priority=1)]
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


async def test_queue_size_limit_is_per_priority_level(batcher):
    h = await batcher("priority_levels: 2 default_priority_level: 2 "
                      "priority_queue_policy { key: 1 value: { max_queue_size: 1 } }")
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
    assert h.pending == 0
    h.recorder.release_all()
    await results(zero, h.submit(2))
    assert h.recorder.batches == [[0], [2]]


async def test_timeout_delay_moves_the_request_behind_unexpired_ones(batcher):
    h = await batcher("default_queue_policy { timeout_action: DELAY "
                      "default_timeout_microseconds: 1000 }", max_batch_size=1)
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
    h = await batcher("default_queue_policy { default_timeout_microseconds: 10000 "
                      f"allow_timeout_override: {str(allow).lower()} }}")
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
    h = await batcher(f"preserve_ordering: {str(preserve).lower()}", instances=2,
                      max_batch_size=1)
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
    h = await batcher("default_queue_policy { default_timeout_microseconds: 1000 "
                      "max_queue_size: 3 }")
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
    assert sorted(h.observer.failures) == sorted([FailureReason.REJECTED] * 3 +
                                                 [FailureReason.CANCELED])
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



async def test_answered_requests_are_not_kept_alive_behind_a_waiting_one():
    """A starved low-priority request holds the earliest deadline; the requests that pass it
    must still be freed once answered, not kept until their own (long) timeouts."""
    config = make_config("priority_levels: 2 default_priority_level: 2 "
                         "default_queue_policy { default_timeout_microseconds: 60000000 }",
                         max_batch_size=10)
    queue = BatchQueue(config)
    loop = asyncio.get_running_loop()

    def entry(priority: int) -> Entry:
        data = np.zeros((1, 2), np.float32)
        request = InferRequest("m", batch_size=1, priority=priority,
                               inputs=[Tensor("INPUT0", "FP32", data.shape, data)])
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


async def test_the_real_clock_runs_out_the_delay():
    """Smoke test of the default MonotonicClock: a lone request still gets its answer."""
    config = make_config("preferred_batch_size: [4] max_queue_delay_microseconds: 1000")
    recorder = Recorder()
    spec = VersionSpec("m", 1, config, Path("/nonexistent"), Path("/nonexistent/1"),
                       type("AddOneModel", (AddOneModel,), {"recorder": recorder}))
    scheduler = DynamicBatcher(spec, VersionStatistics("m", "1"))
    await scheduler.start()
    data = np.full((1, 2), 7, np.float32)
    future = scheduler.submit(InferRequest("m", batch_size=1,
                                           inputs=[Tensor("INPUT0", "FP32", (1, 2), data)]))
    (response,) = await results(future)
    assert row_values(response) == [8.0]
    await scheduler.drain(1)
    await scheduler.stop()
