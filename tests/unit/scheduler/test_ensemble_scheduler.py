"""scheduler/ensemble.py with a fake `infer`: graph checks, DAG order and concurrency,
errors naming the step, statistics, drain. It needs no backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from protocol.errors import InvalidArgument, NotFound, Unavailable
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.types import InferRequest, InferResponse, Tensor
from scheduler.ensemble import EnsembleConfigError, EnsembleScheduler, plan_steps
from scheduler.interface import VersionSpec
from scheduler.stats import VersionStatistics

# IN -> a -> (b, c in parallel) -> d -> OUT ; also b's output is an ensemble output.
DIAMOND = """
name: "diamond"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] },
         { name: "LEFT" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling {
  step [
    { model_name: "add1" input_map { key: "X" value: "IN" } output_map { key: "Y" value: "a" } },
    { model_name: "times2"
      input_map { key: "X" value: "a" } output_map { key: "Y" value: "LEFT" } },
    { model_name: "times3" model_version: 2
      input_map { key: "X" value: "a" } output_map { key: "Y" value: "right" } },
    { model_name: "sum" input_map { key: "A" value: "LEFT" } input_map { key: "B" value: "right" }
      output_map { key: "S" value: "OUT" } }
  ]
}
"""


def parse(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


class FakeCore:
    """Plays the server core: each model is a numpy function; records the calls."""

    def __init__(self) -> None:
        self.calls: list[InferRequest] = []
        self.active = 0
        self.peak = 0
        self.delay = 0.02
        self.fail: dict[str, Exception] = {}
        self.models: dict[str, Callable[..., dict[str, np.ndarray]]] = {
            "add1": lambda X: {"Y": X + 1},
            "times2": lambda X: {"Y": X * 2},
            "times3": lambda X: {"Y": X * 3},
            "sum": lambda A, B: {"S": A + B},
        }

    async def infer(self, request: InferRequest) -> InferResponse:
        self.calls.append(request)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay)
            if request.model_name in self.fail:
                raise self.fail[request.model_name]
            model = self.models.get(request.model_name)
            if model is None:
                raise NotFound(f"Request for unknown model: '{request.model_name}' is not found")
            outputs = model(**{t.name: t.data for t in request.inputs})
            return InferResponse(
                request.model_name,
                "1",
                id=request.id,
                outputs=[
                    Tensor(name, "FP32", tuple(value.shape), value)
                    for name, value in outputs.items()
                ],
            )
        finally:
            self.active -= 1


def make_scheduler(core: FakeCore, text: str = DIAMOND) -> EnsembleScheduler:
    config = parse(text)
    spec = VersionSpec(config.name, 1, config, Path("/nonexistent"), Path("/nonexistent/1"), None)  # type: ignore[arg-type]
    return EnsembleScheduler(spec, VersionStatistics(config.name, "1"), core.infer)


def request_for(value: float = 1.0) -> InferRequest:
    data = np.full((1, 2), value, np.float32)
    request = InferRequest("diamond", id="r7", inputs=[Tensor("IN", "FP32", (1, 2), data)])
    request.batch_size = 1
    return request


async def test_runs_the_dag_with_independent_steps_concurrently() -> None:
    core = FakeCore()
    scheduler = make_scheduler(core)
    await scheduler.start()
    response = await scheduler.submit(request_for(1.0))
    by_name = {t.name: t.data for t in response.outputs}
    assert [t.name for t in response.outputs] == ["OUT", "LEFT"]
    assert by_name["OUT"].tolist() == [[10.0, 10.0]]  # (1+1)*2 + (1+1)*3
    assert by_name["LEFT"].tolist() == [[4.0, 4.0]]
    assert response.model_name == "diamond" and response.id == "r7"
    assert [c.model_name for c in core.calls][0] == "add1"
    assert [c.model_name for c in core.calls][-1] == "sum"
    assert core.peak == 2  # times2 and times3 ran at the same time
    times3 = next(c for c in core.calls if c.model_name == "times3")
    assert times3.model_version == "2" and times3.id == "r7"
    assert [t.name for t in times3.inputs] == ["X"]
    stats = scheduler.statistics
    assert stats.success.count == 1 and stats.inference_count == 1
    assert stats.execution_count == 1 and stats.fail.count == 0


async def test_a_failing_step_fails_the_request_and_names_the_step() -> None:
    core = FakeCore()
    core.fail["times3"] = InvalidArgument("bad shape")
    scheduler = make_scheduler(core)
    await scheduler.start()
    with pytest.raises(InvalidArgument) as caught:
        await scheduler.submit(request_for())
    assert caught.value.message == ("in ensemble 'diamond', step 2 (model 'times3'): bad shape")
    assert "sum" not in [c.model_name for c in core.calls]
    assert scheduler.statistics.fail.count == 1


async def test_a_full_member_queue_keeps_its_retry_hint() -> None:
    from protocol.errors import Overloaded

    core = FakeCore()
    core.fail["times2"] = Overloaded("Exceeds maximum queue size", retry_after=7)
    scheduler = make_scheduler(core)
    await scheduler.start()
    with pytest.raises(Overloaded) as caught:
        await scheduler.submit(request_for())
    assert caught.value.retry_after == 7
    assert caught.value.message.endswith("(model 'times2'): Exceeds maximum queue size")


async def test_a_missing_member_keeps_its_status() -> None:
    core = FakeCore()
    del core.models["times2"]
    scheduler = make_scheduler(core)
    await scheduler.start()
    with pytest.raises(NotFound, match="step 1 \\(model 'times2'\\)"):
        await scheduler.submit(request_for())


async def test_cancelling_the_request_cancels_running_steps() -> None:
    core = FakeCore()
    core.delay = 10
    scheduler = make_scheduler(core)
    await scheduler.start()
    future = scheduler.submit(request_for())
    await asyncio.sleep(0.05)
    future.cancel()
    with pytest.raises(asyncio.CancelledError):
        await future
    assert core.active == 0


async def test_drain_waits_then_fails_what_is_left() -> None:
    core = FakeCore()
    core.delay = 10
    scheduler = make_scheduler(core)
    await scheduler.start()
    future = scheduler.submit(request_for())
    await asyncio.sleep(0.01)
    await scheduler.drain(0.05)
    with pytest.raises(Unavailable, match="unloaded"):
        await future
    with pytest.raises(Unavailable):
        scheduler.submit(request_for())
    assert not scheduler.healthy()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.replace('value: "right" }', 'value: "LEFT" }'), "written by both"),
        (
            lambda t: t.replace('key: "B" value: "right"', 'key: "B" value: "nowhere"'),
            "reads 'nowhere'",
        ),
        (
            lambda t: t.replace(
                'output_map { key: "S" value: "OUT" }', 'output_map { key: "S" value: "other" }'
            ),
            "'OUT' is not written",
        ),
        (
            lambda t: t.replace(
                'input_map { key: "X" value: "IN" }', 'input_map { key: "X" value: "OUT" }'
            ),
            "cycle",
        ),
        (lambda t: t.replace('value: "a" } }', 'value: "IN" } }', 1), "is an ensemble input"),
        (lambda t: t.replace('model_name: "add1"', 'model_name: "diamond"'), "ensemble itself"),
        (lambda t: t.split("ensemble_scheduling")[0], "at least one step"),
    ],
)
def test_graph_errors_are_found_at_load(change: Callable[[str], str], message: str) -> None:
    with pytest.raises(EnsembleConfigError, match=message):
        plan_steps(parse(change(DIAMOND)))


def test_plan_keeps_step_order_and_maps() -> None:
    steps = plan_steps(parse(DIAMOND))
    assert [s.model_name for s in steps] == ["add1", "times2", "times3", "sum"]
    assert steps[3].inputs == {"A": "LEFT", "B": "right"}
    assert steps[2].model_version == "2" and steps[0].model_version == ""
