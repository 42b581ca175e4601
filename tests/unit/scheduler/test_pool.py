"""The instance pool, the default scheduler and the factory, with a named fake model.

The fake model records, per instance, the thread each call ran on; a test can make a given
instance fail to load, and hold a request (by number) until it releases it.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from backends.base import Backend, BackendError
from protocol.errors import InternalError, Unavailable
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.types import InferRequest, Tensor
from scheduler.batcher import DynamicBatcher
from scheduler.clock import ManualClock
from scheduler.factory import create_scheduler
from scheduler.interface import VersionSpec
from scheduler.pool import BatchRun, InstancePool, LoadError, instance_specs
from scheduler.queue_scheduler import DefaultScheduler
from scheduler.stats import VersionStatistics


class Journal:
    """Calls made into the fake model, from whichever thread made them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, int]] = []  # (phase, instance, thread id)
        self.ran: list[tuple[str, int]] = []  # (instance, request number) as execution began
        self.fail_load: set[str] = set()
        self.fatal_on: set[int] = set()
        self.holds: dict[int, threading.Event] = {}

    def note(self, phase: str, instance: str) -> None:
        with self.lock:
            self.calls.append((phase, instance, threading.get_ident()))

    def threads(self, instance: str) -> set[int]:
        return {thread for _, name, thread in self.calls if name == instance}

    def phases(self, phase: str) -> list[str]:
        return sorted(name for p, name, _ in self.calls if p == phase)


class DoublerModel(Backend):
    """A named fake model: OUTPUT0 = 2 * INPUT0, OUTPUT1 = the row count as INT32."""

    backend_name = "fake_doubler"
    default_model_filename = "model.fake"
    journal: Journal

    def load(self) -> None:
        self.journal.note("load", self.instance.name)
        if self.instance.name in self.journal.fail_load:
            raise BackendError("no device for this instance")

    def execute(self, inputs):
        journal = self.journal
        journal.note("execute", self.instance.name)
        x = inputs["INPUT0"]
        number = int(x.reshape(-1)[0])
        with journal.lock:
            journal.ran.append((self.instance.name, number))
        gate = journal.holds.get(number)
        if gate is not None:
            assert gate.wait(10), "test never released the gate"
        if number in journal.fatal_on:
            raise BackendError("device lost", fatal=True)
        rows = x.shape[0] if x.ndim > 1 else 1
        return {"OUTPUT1": np.full((rows, 1), rows, np.int32), "OUTPUT0": x * 2}

    def unload(self) -> None:
        self.journal.note("unload", self.instance.name)


def make_spec(config_text: str, journal: Journal) -> VersionSpec:
    base = """
        name: "m" backend: "fake"
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }]
        output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] },
                { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 1 ] }]
    """
    config = text_format.Parse(base + config_text, ModelConfig())
    model = type("DoublerModel", (DoublerModel,), {"journal": journal})
    return VersionSpec("m", 1, config, Path("/nonexistent"), Path("/nonexistent/1"), model)


def request(number: int, rows: int = 1, batching: bool = True) -> InferRequest:
    shape = (rows, 2) if batching else (2,)
    data = np.full(shape, number, np.float32)
    return InferRequest(
        "m",
        id=f"r{number}",
        batch_size=rows if batching else 0,
        arrival_ns=0,
        inputs=[Tensor("INPUT0", "FP32", shape, data)],
    )


async def until(predicate) -> None:
    for _ in range(5000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never became true")


async def results(*futures):
    return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)


@pytest.fixture
def journal() -> Journal:
    made = Journal()
    yield made
    for gate in made.holds.values():
        gate.set()


async def started(spec: VersionSpec, stats: VersionStatistics | None = None) -> DefaultScheduler:
    scheduler = DefaultScheduler(spec, stats or VersionStatistics("m", "1"), clock=ManualClock())
    await scheduler.start()
    return scheduler


# -- instances ----------------------------------------------------------------------------------


def test_instance_groups_expand_to_named_instances_per_device(journal):
    spec = make_spec(
        """
        instance_group [{ name: "cpu" kind: KIND_CPU count: 2 },
                        { name: "npu" kind: KIND_GPU count: 2 gpus: [0, 3] },
                        { name: "warm" kind: KIND_CPU count: 1 passive: true }]
    """,
        journal,
    )
    specs = instance_specs(spec.config, spec.name)
    assert [(s.name, s.kind, s.device_id, s.index, passive) for s, passive in specs] == [
        ("cpu_0", "KIND_CPU", 0, 0, False),
        ("cpu_1", "KIND_CPU", 0, 1, False),
        ("npu_0", "KIND_GPU", 0, 2, False),
        ("npu_1", "KIND_GPU", 3, 3, False),
        ("npu_2", "KIND_GPU", 0, 4, False),
        ("npu_3", "KIND_GPU", 3, 5, False),
        ("warm_0", "KIND_CPU", 0, 6, True),
    ]


def test_an_unnamed_group_takes_the_model_name(journal):
    spec = make_spec("instance_group [{ kind: KIND_GPU count: 2 }]", journal)
    assert [(s.name, s.kind) for s, _ in instance_specs(spec.config, "m")] == [
        ("m_0", "KIND_GPU"),
        ("m_1", "KIND_GPU"),
    ]


async def test_each_instance_loads_executes_and_unloads_on_its_own_thread(journal):
    spec = make_spec("max_batch_size: 8 instance_group [{ count: 2 kind: KIND_CPU }]", journal)
    scheduler = await started(spec)
    journal.holds[1] = threading.Event()
    futures = [scheduler.submit(request(1)), scheduler.submit(request(2))]
    await until(lambda: len(journal.ran) == 2)  # one on each instance
    journal.holds[1].set()
    await results(*futures)
    await scheduler.drain(1)
    await scheduler.stop()
    assert journal.phases("load") == journal.phases("unload") == ["m_0", "m_1"]
    assert journal.phases("execute") == ["m_0", "m_1"]
    first, second = journal.threads("m_0"), journal.threads("m_1")
    assert len(first) == 1 and len(second) == 1 and first != second
    assert threading.get_ident() not in first | second


async def test_a_failing_instance_load_unloads_the_others_and_says_which(journal):
    journal.fail_load = {"m_1"}
    spec = make_spec("max_batch_size: 8 instance_group [{ count: 3 kind: KIND_CPU }]", journal)
    scheduler = DefaultScheduler(spec, VersionStatistics("m", "1"))
    with pytest.raises(LoadError) as info:
        await scheduler.start()
    assert info.value.message == "instance 'm_1' failed to load: no device for this instance"
    assert journal.phases("load") == ["m_0", "m_1", "m_2"]
    assert journal.phases("unload") == ["m_0", "m_2"]
    with pytest.raises(Unavailable):
        scheduler.submit(request(1))


# -- default scheduler ----------------------------------------------------------------------------


async def test_default_scheduler_runs_instances_in_parallel_one_request_each(journal):
    spec = make_spec("max_batch_size: 8 instance_group [{ count: 3 kind: KIND_CPU }]", journal)
    stats = VersionStatistics("m", "1")
    scheduler = await started(spec, stats)
    for number in (1, 2, 3):
        journal.holds[number] = threading.Event()
    futures = [scheduler.submit(request(n)) for n in (1, 2, 3, 4, 5)]
    await until(lambda: len(journal.ran) == 3)
    assert sorted(name for name, _ in journal.ran) == ["m_0", "m_1", "m_2"]
    assert sorted(n for _, n in journal.ran) == [1, 2, 3]
    assert stats.pending == 2  # 4 and 5 wait: every instance is busy
    for gate in journal.holds.values():
        gate.set()
    responses = await results(*futures)
    assert sorted(n for _, n in journal.ran[3:]) == [4, 5]  # each alone, never batched
    assert [r.outputs[0].data.tolist() for r in responses] == [[[2.0 * n] * 2] for n in range(1, 6)]
    assert stats.execution_count == 5 and stats.inference_count == 5
    await scheduler.drain(1)
    await scheduler.stop()


async def test_default_scheduler_takes_requests_oldest_first(journal):
    spec = make_spec("max_batch_size: 8", journal)
    scheduler = await started(spec)
    journal.holds[1] = threading.Event()
    futures = [scheduler.submit(request(n)) for n in range(1, 6)]
    await until(lambda: journal.ran)
    journal.holds[1].set()
    responses = await results(*futures)
    assert [n for _, n in journal.ran] == [1, 2, 3, 4, 5]
    assert [r.outputs[0].shape for r in responses] == [(1, 2)] * 5
    await scheduler.stop()


async def test_default_scheduler_answers_with_every_output_in_config_order(journal):
    spec = make_spec("max_batch_size: 8", journal)
    scheduler = await started(spec)
    (response,) = await results(scheduler.submit(request(3, rows=2)))
    assert (response.model_name, response.model_version, response.id) == ("m", "1", "r3")
    assert [(t.name, t.datatype, t.shape) for t in response.outputs] == [
        ("OUTPUT0", "FP32", (2, 2)),
        ("OUTPUT1", "INT32", (2, 1)),
    ]
    assert response.outputs[1].data.reshape(-1).tolist() == [2, 2]
    await scheduler.stop()


async def test_a_non_batching_model_counts_one_inference_per_request(journal):
    spec = make_spec("max_batch_size: 0", journal)
    stats = VersionStatistics("m", "1")
    scheduler = await started(spec, stats)
    responses = await results(*(scheduler.submit(request(n, batching=False)) for n in (1, 2)))
    assert [r.outputs[0].shape for r in responses] == [(2,), (2,)]
    assert stats.inference_count == 2 and stats.execution_count == 2
    assert list(stats.batch_stats) == [1]
    await scheduler.stop()


async def test_a_fatal_instance_gets_no_more_work_while_others_serve(journal):
    spec = make_spec("max_batch_size: 8 instance_group [{ count: 2 kind: KIND_CPU }]", journal)
    scheduler = await started(spec)
    journal.fatal_on = {1}
    (error,) = await results(scheduler.submit(request(1)))
    assert isinstance(error, InternalError) and error.message == "device lost"
    broken = journal.ran[0][0]
    assert scheduler.healthy()
    await results(*(scheduler.submit(request(n)) for n in (2, 3, 4)))
    assert [name for name, _ in journal.ran[1:]] == [n for n in ("m_0", "m_1") if n != broken] * 3
    journal.fatal_on = {5}
    await results(scheduler.submit(request(5)))
    assert not scheduler.healthy()
    with pytest.raises(Unavailable, match="'m' version 1 is not at ready state"):
        scheduler.submit(request(6))
    await scheduler.stop()


async def test_stop_without_drain_loses_nothing(journal):
    spec = make_spec("max_batch_size: 8", journal)
    stats = VersionStatistics("m", "1")
    scheduler = await started(spec, stats)
    journal.holds[1] = threading.Event()
    running, queued = scheduler.submit(request(1)), scheduler.submit(request(2))
    await until(lambda: journal.ran)
    stop = asyncio.ensure_future(scheduler.stop())
    await until(lambda: queued.done())
    journal.holds[1].set()
    await asyncio.wait_for(stop, 10)
    errors = await results(running, queued)
    assert all(isinstance(e, Unavailable) for e in errors)
    assert stats.pending == 0 and stats.fail.count == 2
    assert journal.phases("unload") == ["m_0"]


async def test_a_cancelled_request_is_counted_and_never_runs(journal):
    spec = make_spec("max_batch_size: 8", journal)
    stats = VersionStatistics("m", "1")
    scheduler = await started(spec, stats)
    journal.holds[1] = threading.Event()
    running, cancelled = scheduler.submit(request(1)), scheduler.submit(request(2))
    await until(lambda: journal.ran)
    cancelled.cancel()
    journal.holds[1].set()
    await results(running)
    await scheduler.drain(1)
    assert [n for _, n in journal.ran] == [1]
    assert stats.fail.count == 1 and stats.success.count == 1 and stats.pending == 0
    await scheduler.stop()


# -- the hot path: dispatch without a loop turn, one callback per batch -----------------------


async def test_a_request_that_finds_an_idle_instance_is_launched_inside_submit(journal):
    spec = make_spec("max_batch_size: 8", journal)
    stats = VersionStatistics("m", "1")
    scheduler = await started(spec, stats)
    journal.holds[1] = threading.Event()
    first = scheduler.submit(request(1))
    assert stats.pending == 0  # already handed to the instance, before any loop turn
    second = scheduler.submit(request(2))
    assert stats.pending == 1  # the only instance is busy
    journal.holds[1].set()
    async with asyncio.timeout(10):
        await first
    # The callback that answered the first request had already launched the second.
    assert stats.pending == 0
    await results(second)
    await scheduler.stop()


class BuggyDoubler(DoublerModel):
    """Breaks the instance thread's batch path itself (not the model's execute)."""

    @property
    def takes_request_lists(self) -> bool:  # read on the instance thread for every batch
        raise RuntimeError("bug in the batch path")


async def test_a_bug_on_the_instance_thread_fails_its_batch_not_the_thread(journal):
    spec = make_spec("max_batch_size: 8", journal)
    buggy = type("BuggyDoubler", (BuggyDoubler,), {"journal": journal})
    spec = VersionSpec(spec.name, 1, spec.config, spec.model_dir, spec.version_dir, buggy)
    stats = VersionStatistics("m", "1")
    scheduler = await started(spec, stats)
    errors = await results(scheduler.submit(request(1)), scheduler.submit(request(2)))
    assert [(type(e), e.message) for e in errors] == [(InternalError, "bug in the batch path")] * 2
    assert scheduler.healthy() and stats.fail.count == 2 and stats.pending == 0
    await scheduler.stop()
    assert journal.phases("unload") == ["m_0"]  # the thread lived on to unload
    assert journal.threads("m_0") and len(journal.threads("m_0")) == 1


async def test_execute_calls_back_once_on_the_loop_and_fails_after_unload(journal):
    spec = make_spec("max_batch_size: 8", journal)
    pool = InstancePool(spec, ManualClock())
    await pool.load()
    instance = pool.acquire()
    assert instance is not None
    calls: list[tuple[str, BatchRun, int]] = []

    def on_done(tag: str, result: BatchRun) -> None:
        calls.append((tag, result, threading.get_ident()))

    instance.execute([request(3)], [1], on_done, "first")
    await until(lambda: calls)
    await pool.unload()
    instance.execute([request(4)], [1], on_done, "late")
    await until(lambda: len(calls) == 2)
    await asyncio.sleep(0.01)
    (tag, ran, thread), (late_tag, late, late_thread) = calls
    assert (tag, ran.executed, ran.outcomes[0].outputs[0].data.tolist()) == (
        "first",
        True,
        [[6.0, 6.0]],
    )
    assert thread == late_thread == threading.get_ident()
    assert late_tag == "late" and not late.executed
    assert late.outcomes[0].error.message == "instance 'm_0' is unloaded"
    assert journal.phases("execute") == ["m_0"]  # the late batch never reached the model


# -- factory ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config_text, kind",
    [
        ("max_batch_size: 8 dynamic_batching {}", DynamicBatcher),
        ("max_batch_size: 8", DefaultScheduler),
        ("max_batch_size: 0", DefaultScheduler),
    ],
)
def test_factory_picks_the_batcher_only_for_dynamic_batching(journal, config_text, kind):
    stats = VersionStatistics("m", "1")
    scheduler = create_scheduler(make_spec(config_text, journal), stats)
    assert type(scheduler) is kind
    assert scheduler.statistics is stats


class GatheringDoubler(DoublerModel):
    """A backend that joins its batches itself (the NPU executor's shared arena)."""

    gathers_batches = True

    def gather(self, requests):
        numbers = [int(r["INPUT0"].reshape(-1)[0]) for r in requests]
        with self.journal.lock:
            self.journal.calls.append(("gather", str(numbers), threading.get_ident()))
        return {"INPUT0": np.concatenate([r["INPUT0"] for r in requests])}


async def test_a_backend_that_gathers_joins_every_batch_itself(journal):
    spec = make_spec("max_batch_size: 8 dynamic_batching {}", journal)
    model = type("GatheringDoubler", (GatheringDoubler,), {"journal": journal})
    spec = VersionSpec(spec.name, 1, spec.config, spec.model_dir, spec.version_dir, model)
    scheduler = create_scheduler(spec, VersionStatistics("m", "1"), clock=ManualClock())
    await scheduler.start()
    journal.holds[1] = threading.Event()
    first = scheduler.submit(request(1))
    await until(lambda: journal.ran)
    later = [scheduler.submit(request(n, rows=n - 1)) for n in (2, 3)]  # queue behind it
    journal.holds[1].set()
    responses = await results(first, *later)
    assert [r.outputs[0].data.tolist() for r in responses] == [
        [[2.0, 2.0]],
        [[4.0, 4.0]],
        [[6.0, 6.0], [6.0, 6.0]],
    ]
    gathers = [name for phase, name, _ in journal.calls if phase == "gather"]
    assert gathers == ["[1]", "[2, 3]"]  # single requests too: the backend's memory is the point
    await scheduler.stop()


async def test_an_answer_is_freed_when_its_caller_drops_it_without_the_collector(journal):
    """No reference cycle keeps an answered request (and its tensors) alive: the server runs
    the collector rarely (server/app.py), and the NPU executor reuses output buffers only once
    the answers pointing into them are gone."""
    import gc
    import weakref

    scheduler = await started(make_spec("max_batch_size: 8", journal))
    gc.disable()
    try:
        response = await scheduler.submit(request(1))
        output = weakref.ref(response.outputs[0].data)
        del response
        await until(lambda: output() is None)  # the instance thread lets go of it too
    finally:
        gc.enable()
        await scheduler.stop()


class LoopBegunDoubler(DoublerModel):
    """A request-list model that starts its batches from the loop (Backend.begin_requests):
    request 5 answers there, request 7 leaves its answer to the instance thread (what a Python
    model does when its worker died), request 9 cannot begin now (the thread runs it)."""

    takes_request_lists = True

    def execute_requests(self, requests, details=None):
        self.journal.note("execute", self.instance.name)
        return [
            {"OUTPUT0": r["INPUT0"] * 2, "OUTPUT1": np.ones((1, 1), np.int32)} for r in requests
        ]

    def begin_requests(self, requests, details, done):
        number = int(requests[0]["INPUT0"].reshape(-1)[0])
        if number == 9:
            return False
        self.journal.note("begin", self.instance.name)
        if number == 7:

            def on_the_thread():
                self.journal.note("finish", self.instance.name)
                return [Unavailable("the worker process was killed by SIGKILL")]

            asyncio.get_running_loop().call_soon(done, on_the_thread)
        else:
            answers = [{"OUTPUT0": r["INPUT0"] * 3} for r in requests]
            asyncio.get_running_loop().call_soon(done, answers)
        return True


async def test_a_batch_begun_on_the_loop_answers_without_the_instance_thread(journal):
    spec = make_spec("max_batch_size: 8", journal)
    model = type("LoopBegunDoubler", (LoopBegunDoubler,), {"journal": journal})
    spec = VersionSpec(spec.name, 1, spec.config, spec.model_dir, spec.version_dir, model)
    stats = VersionStatistics("m", "1")
    scheduler = await started(spec, stats)
    begun, left, refused = await results(
        scheduler.submit(request(5)), scheduler.submit(request(7)), scheduler.submit(request(9))
    )
    assert begun.outputs[0].data.tolist() == [[15.0, 15.0]]  # the loop's answer
    assert isinstance(left, Unavailable) and "SIGKILL" in left.message
    assert refused.outputs[0].data.tolist() == [[18.0, 18.0]]  # execute_requests, as before
    assert stats.success.count == 2 and stats.fail.count == 1 and stats.pending == 0
    loop_thread = threading.get_ident()
    by_phase = {phase: thread for phase, _, thread in journal.calls}
    assert by_phase["begin"] == loop_thread
    assert by_phase["finish"] != loop_thread and by_phase["execute"] != loop_thread
    await scheduler.stop()
