"""Shared harness for the dynamic batcher tests (test_scheduler_batcher_*.py): the batcher's
rules are driven through its public API with a manual clock and a fake model.

Every request carries its own number in every row of INPUT0, so the fake model can record which
requests (rows) ran together; it answers INPUT0 + 1. Time only moves when a test advances the
clock, so "still waiting" is checked with the pending count, never with sleeps.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
from google.protobuf import text_format

from backends.base import Backend, BackendError
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.types import InferRequest, Tensor
from scheduler.batcher import DynamicBatcher
from scheduler.clock import ManualClock
from scheduler.interface import VersionSpec
from scheduler.stats import VersionStatistics

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
        return [
            ValueError("unlucky")
            if int(r["INPUT0"].reshape(-1)[0]) == 13
            else {"OUTPUT0": r["INPUT0"] + 1}
            for r in requests
        ]


class Observer:
    """A MetricsObserver that remembers what it was told."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.pending: list[int] = []
        self.batch_sizes: list[int] = []
        self.rejections: list[str] = []

    def requests_succeeded(self, batch) -> None:
        if batch.first:
            self.first_responses = getattr(self, "first_responses", 0) + len(batch.answered)

    def request_failed(self, reason: str, total_ns: int) -> None:
        self.failures.append(reason)

    def batch_executed(self, batch_size: int, inferences: int = -1) -> None:
        self.batch_sizes.append(batch_size)

    def pending_changed(self, delta: int) -> None:
        self.pending.append(delta)

    def sequences_changed(self, active: int) -> None:
        self.sequences_active = active

    def sequences_idle_released(self, count: int) -> None:
        self.idle_released = getattr(self, "idle_released", 0) + count

    def request_rejected(self, reason: str) -> None:
        self.rejections.append(reason)

    def first_response(self, elapsed_ns: int) -> None:
        self.first_responses = getattr(self, "first_responses", 0) + 1


def make_config(
    batching: str, *, max_batch_size: int = 8, dims: str = "2", instances: int = 1, extra: str = ""
) -> ModelConfig:
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
        spec = VersionSpec(
            "m", 1, config, Path("/nonexistent"), Path("/nonexistent/1"), backend_cls
        )
        self.scheduler = DynamicBatcher(spec, self.stats, clock=self.clock)

    def request(
        self, number: int, rows: int = 1, width: int = 2, priority: int = 0, timeout_us: int = 0
    ) -> InferRequest:
        data = np.full((rows, width), number, dtype=np.float32)
        parameters = {
            key: value for key, value in (("priority", priority), ("timeout", timeout_us)) if value
        }
        return InferRequest(
            "m",
            id=str(number),
            parameters=parameters,
            arrival_ns=self.clock.now_ns(),
            inputs=[Tensor("INPUT0", "FP32", data.shape, data)],
        )

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
