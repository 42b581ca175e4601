"""Schedulers of two models sharing one rate limiter: never more executions at once than the
resource allows (counted in the model), waiting requests stay pending and form their batch when
the turn comes, a model the resources cannot serve is refused at load, and with no limiter
(`--rate-limit off`) the rate_limiter fields change nothing."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from backends.base import Backend
from protocol.errors import Unavailable
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.types import InferRequest, Tensor
from scheduler.batcher import DynamicBatcher
from scheduler.clock import ManualClock
from scheduler.factory import create_scheduler
from scheduler.interface import LoadError, VersionSpec
from scheduler.queue_scheduler import DefaultScheduler, QueueScheduler
from scheduler.rate_limiter import RateLimiter, ResourceLimit
from scheduler.stats import VersionStatistics


class Meter:
    """Executions in progress across every model and instance thread, and their peak."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.batches: list[tuple[str, int]] = []  # (model, rows) as each began
        self.holds: dict[float, threading.Event] = {}  # request value -> gate it waits on

    def enter(self, model: str, rows: int) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.batches.append((model, rows))

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


class MeteredModel(Backend):
    backend_name = "fake_metered"
    default_model_filename = "model.fake"
    meter: Meter

    def load(self) -> None:
        pass

    def execute(self, inputs):
        x = inputs["INPUT0"]
        self.meter.enter(self.config.name, x.shape[0])
        try:
            gate = self.meter.holds.get(float(x.reshape(-1)[0]))
            if gate is not None:
                assert gate.wait(10), "the test never opened the gate"
            else:
                threading.Event().wait(0.002)  # long enough for the other model to overlap
            return {"OUTPUT0": x + 1}
        finally:
            self.meter.leave()

    def unload(self) -> None:
        pass


RESOURCE = 'rate_limiter { resources [{ name: "R" %s count: %d }] priority: %d }'


def spec(
    name: str,
    meter: Meter,
    extra: str = "",
    need: int = 1,
    priority: int = 1,
    group: str = "count: 2 kind: KIND_CPU",
    scope: str = "",
) -> VersionSpec:
    text = f"""
        name: "{name}" backend: "fake" max_batch_size: 8
        input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }}]
        output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }}]
        instance_group [{{ {group} {RESOURCE % (scope, need, priority)} }}]
        {extra}
    """
    config = text_format.Parse(text, ModelConfig())
    model = type("Metered", (MeteredModel,), {"meter": meter})
    return VersionSpec(name, 1, config, Path("/nonexistent"), Path("/nonexistent/1"), model)


def request(model: str, value: float) -> InferRequest:
    data = np.full((1, 1), value, np.float32)
    return InferRequest(
        model, id=str(value), batch_size=1, inputs=[Tensor("INPUT0", "FP32", (1, 1), data)]
    )


async def until(predicate) -> None:
    for _ in range(5000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never became true")


@pytest.fixture
async def made():
    schedulers: list[QueueScheduler] = []
    meter = Meter()

    async def make(name: str, limiter: RateLimiter | None, **kwargs) -> QueueScheduler:
        scheduler = create_scheduler(
            spec(name, meter, **kwargs), VersionStatistics(name, "1"), rate_limiter=limiter
        )
        assert isinstance(scheduler, QueueScheduler)
        await scheduler.start()
        schedulers.append(scheduler)
        return scheduler

    make.meter = meter  # type: ignore[attr-defined]
    yield make
    for gate in meter.holds.values():
        gate.set()
    for scheduler in schedulers:
        await scheduler.drain(1)
        await scheduler.stop()


async def test_two_models_sharing_one_copy_never_execute_at_once(made):
    limiter = RateLimiter()  # R's default: the most one instance asks, 1
    a = await made("a", limiter)
    b = await made("b", limiter)
    futures = [s.submit(request(s.spec.name, i)) for i in range(20) for s in (a, b)]
    answers = await asyncio.wait_for(asyncio.gather(*futures), 10)
    assert [float(r.outputs[0].data[0, 0]) for r in answers] == [
        i + 1 for i in range(20) for _ in "ab"
    ]
    assert made.meter.peak == 1
    executed = a.statistics.snapshot().execution_count + b.statistics.snapshot().execution_count
    assert executed == len(made.meter.batches)


async def test_two_copies_let_two_instances_run_and_no_more(made):
    limiter = RateLimiter([ResourceLimit("r", 2)])
    a = await made("a", limiter)
    b = await made("b", limiter)
    futures = [s.submit(request(s.spec.name, i)) for i in range(30) for s in (a, b)]
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    assert made.meter.peak <= 2


async def test_requests_waiting_for_the_resource_stay_pending_then_run_as_one_batch(made):
    limiter = RateLimiter()
    a = await made("a", limiter)
    b = await made("b", limiter, extra="dynamic_batching { }")
    assert isinstance(b, DynamicBatcher)
    gate = made.meter.holds[100.0] = threading.Event()
    held = a.submit(request("a", 100))
    await until(lambda: made.meter.now == 1)
    waiting = [b.submit(request("b", i)) for i in range(3)]
    await asyncio.sleep(0.05)
    assert b.statistics.snapshot().pending == 3  # counted as pending, as in Triton
    assert made.meter.batches == [("a", 1)]
    gate.set()
    await asyncio.wait_for(asyncio.gather(held, *waiting), 10)
    assert made.meter.batches == [("a", 1), ("b", 3)]  # formed when the turn came
    assert b.statistics.snapshot().pending == 0


async def test_an_instance_asking_more_than_the_server_gives_is_refused_at_load(made):
    limiter = RateLimiter([ResourceLimit("r", 1)])
    with pytest.raises(LoadError) as info:
        await made("big", limiter, need=2)
    assert info.value.message == (
        'Resource count for "R" is limited to 1 which will prevent scheduling of one or more '
        "model instances, the minimum required count is 2"
    )
    assert limiter.resources() == []


async def test_a_failed_load_leaves_the_limiter_and_the_scheduler_refuses_requests():
    meter = Meter()
    limiter = RateLimiter([ResourceLimit("r", 1)])
    scheduler = DefaultScheduler(
        spec("big", meter, need=3),
        VersionStatistics("big", "1"),
        clock=ManualClock(),
        rate_limiter=limiter,
    )
    with pytest.raises(LoadError):
        await scheduler.start()
    with pytest.raises(Unavailable):
        scheduler.submit(request("big", 1))


async def test_without_a_limiter_the_rate_limiter_fields_are_ignored(made):
    a = await made("a", None)
    b = await made("b", None)
    gate = made.meter.holds[100.0] = threading.Event()
    held = a.submit(request("a", 100))
    await until(lambda: made.meter.now == 1)
    answer = await asyncio.wait_for(b.submit(request("b", 1)), 10)  # runs beside the held one
    assert float(answer.outputs[0].data[0, 0]) == 2
    gate.set()
    await asyncio.wait_for(held, 10)


def sequence_request(model: str, corrid: int, step: int, last: int) -> InferRequest:
    made = request(model, corrid * 100 + step)
    made.parameters = {
        "sequence_id": corrid,
        "sequence_start": step == 0,
        "sequence_end": step == last,
    }
    return made


async def run_sequence(scheduler: QueueScheduler, corrid: int, steps: int) -> list[float]:
    name = scheduler.spec.name
    answers = []
    for step in range(steps):
        future = scheduler.submit(sequence_request(name, corrid, step, steps - 1))
        answer = await asyncio.wait_for(future, 10)
        answers.append(float(answer.outputs[0].data[0, 0]))
    return answers


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { max_candidate_sequences: 4 }"])
async def test_sequence_models_sharing_one_copy_never_execute_at_once(made, strategy):
    limiter = RateLimiter()
    extra = f"sequence_batching {{ {strategy} }}"
    a = await made("sa", limiter, extra=extra)
    b = await made("sb", limiter, extra=extra)
    runs = [run_sequence(s, corrid, 4) for corrid in (1, 2, 3) for s in (a, b)]
    answers = await asyncio.wait_for(asyncio.gather(*runs), 20)
    for (corrid, _), got in zip([(c, s) for c in (1, 2, 3) for s in "ab"], answers, strict=True):
        assert got == [corrid * 100 + step + 1 for step in range(4)]
    assert made.meter.peak == 1


@pytest.mark.parametrize(("scope", "peak"), [("", 2), ("global: true", 1)])
async def test_each_device_has_its_own_copies_unless_the_resource_is_global(made, scope, peak):
    limiter = RateLimiter()
    group = "count: 1 kind: KIND_GPU gpus: [ 0, 1 ]"
    m = await made("m", limiter, group=group, scope=scope)
    gates = [made.meter.holds.setdefault(float(i), threading.Event()) for i in range(2)]
    futures = [m.submit(request("m", float(i))) for i in range(2)]
    await until(lambda: made.meter.now == peak)  # one instance per device: both run, or one
    await asyncio.sleep(0.05)
    assert made.meter.now == peak
    for gate in gates:
        gate.set()
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    assert made.meter.peak == peak


async def test_a_device_whose_copies_are_taken_does_not_hold_back_a_free_one(made):
    limiter = RateLimiter()
    other = await made("o", limiter, group="count: 1 kind: KIND_GPU gpus: [ 0 ]")
    m = await made("m", limiter, group="count: 1 kind: KIND_GPU gpus: [ 0, 1 ]")
    gate = made.meter.holds[100.0] = threading.Event()
    held = other.submit(request("o", 100))  # takes device 0's one copy
    await until(lambda: made.meter.now == 1)
    futures = [m.submit(request("m", float(i))) for i in range(3)]
    await until(lambda: ("m", 1) in made.meter.batches)  # device 1's instance runs meanwhile
    assert not held.done()
    gate.set()
    await asyncio.wait_for(asyncio.gather(held, *futures), 10)
