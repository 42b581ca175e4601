"""server/core/inference_path.py: the one in-process infer (resolve, validate on submit,
select outputs)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from harness.fakescheduler import InstantScheduler
from protocol.errors import InvalidArgument, NotFound, Unavailable
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.types import InferRequest, InferResponse, RequestedOutput, Tensor
from repository.registry import ModelRegistry, ModelState, VersionRecord
from scheduler.interface import VersionSpec
from scheduler.stats import VersionStatistics
from server.core.inference_path import InferencePath

CONFIG = """
name: "m" max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" },
         { name: "COPY" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


class EchoScheduler(InstantScheduler):
    """Answers each admitted request with its input as both outputs, or holds it."""

    def __init__(self, spec: VersionSpec, stats: VersionStatistics) -> None:
        super().__init__(spec, stats)
        self.held: list[asyncio.Future] = []
        self.hold = False

    def _admit(self, request: InferRequest) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        x = request.inputs[0]
        response = InferResponse(
            "m",
            "1",
            outputs=[
                Tensor("SCORES", "FP32", x.shape, x.data),
                Tensor("COPY", "FP32", x.shape, x.data),
            ],
        )
        if self.hold:
            self.held.append(future)
            future.response = response  # type: ignore[attr-defined]
        else:
            future.set_result(response)
        return future


@pytest.fixture
def path() -> InferencePath:
    registry = ModelRegistry()
    config = text_format.Parse(CONFIG, ModelConfig())
    spec = VersionSpec("m", 1, config, Path("/nonexistent"), Path("/nonexistent/1"), None)  # type: ignore[arg-type]
    scheduler = EchoScheduler(spec, VersionStatistics("m", "1"))
    registry.record("m").versions[1] = VersionRecord(
        1, ModelState.READY, "", spec, scheduler, labels={"SCORES": ["cat", "dog", "emu"]}
    )
    return InferencePath(registry)


def request(*outputs: RequestedOutput, shape: tuple[int, ...] = (1, 3)) -> InferRequest:
    data = np.resize(np.array([0.1, 0.7, 0.2], np.float32), shape)
    return InferRequest(
        "m", inputs=[Tensor("X", "FP32", shape, data)], outputs=list(outputs) or None
    )


async def test_outputs_come_back_as_asked_with_labels_read_at_load(path: InferencePath) -> None:
    response = await path.infer(
        request(RequestedOutput("COPY"), RequestedOutput("SCORES", classification=2))
    )
    assert [t.name for t in response.outputs] == ["COPY", "SCORES"]
    assert response.outputs[1].data.tolist() == [[b"0.700000:1:dog", b"0.200000:2:emu"]]


async def test_an_invalid_request_is_refused_on_submit_and_counted(path: InferencePath) -> None:
    with pytest.raises(InvalidArgument, match=r"unexpected shape for input 'X' for model 'm'"):
        await path.infer(request(shape=(1, 4)))
    stats = path.resolve("m").scheduler.statistics  # type: ignore[union-attr]
    assert stats.fail.count == 1 and path.inflight == 0


async def test_unknown_models_and_exiting_are_refused(path: InferencePath) -> None:
    with pytest.raises(NotFound, match="Request for unknown model: 'nope' is not found"):
        await path.infer(InferRequest("nope"))
    path.exiting = True
    with pytest.raises(Unavailable, match="^Server exiting$"):
        await path.infer(request())
    response = await path.infer_admitted(request())  # an ensemble step of an admitted request
    assert len(response.outputs) == 2


async def test_wait_idle_waits_for_what_is_in_flight(path: InferencePath) -> None:
    scheduler = path.resolve("m").scheduler
    scheduler.hold = True  # type: ignore[union-attr]
    task = asyncio.create_task(path.infer(request()))
    await asyncio.sleep(0)
    assert path.inflight == 1
    assert not await path.wait_idle(0.01)
    (future,) = scheduler.held  # type: ignore[union-attr]
    future.set_result(future.response)
    assert await path.wait_idle(1)
    assert len((await task).outputs) == 2


@pytest.fixture
def cached(path: InferencePath) -> InferencePath:
    """`path` with the response cache on for model m."""
    from server.core.response_cache import ResponseCache

    path.registry.get("m").versions[1].cache = ResponseCache(1 << 20, 1 << 16).bind("m", True)
    return path


def _counts(path: InferencePath) -> tuple[int, int, int]:
    stats = path.registry.get("m").versions[1].scheduler.statistics.snapshot()  # type: ignore[union-attr]
    return stats.cache_hit.count, stats.cache_miss.count, stats.success.count


async def test_a_cached_answer_is_selected_and_classified_like_a_fresh_one(
    cached: InferencePath,
) -> None:
    scheduler = cached.registry.get("m").versions[1].scheduler
    first = await cached.infer(request(RequestedOutput("SCORES", classification=2)))
    scheduler.hold = True  # type: ignore[union-attr]  # a hit must not reach it
    second = await cached.infer(request(RequestedOutput("SCORES", classification=2)))
    assert list(second.outputs[0].data.ravel()) == list(first.outputs[0].data.ravel())
    assert second.outputs[0].data.ravel()[0].startswith(b"0.7")
    assert _counts(cached)[:2] == (1, 1)
    assert not scheduler.held  # type: ignore[union-attr]


async def test_infer_nowait_answers_hits_too(cached: InferencePath) -> None:
    answers: list[InferResponse | None] = []

    def done(response: InferResponse | None, error: BaseException | None) -> None:
        assert error is None
        answers.append(response)

    for _ in range(2):
        future = cached.infer_nowait(request(RequestedOutput("COPY")), done)
        assert future is not None
        await future
        await asyncio.sleep(0)
    assert len(answers) == 2 and [t.name for t in answers[1].outputs] == ["COPY"]  # type: ignore[union-attr]
    assert _counts(cached) == (1, 1, 1)  # the hit; the miss's success is the scheduler's
    assert cached.inflight == 0


async def test_a_refused_request_is_not_looked_up_and_a_failure_not_stored(
    cached: InferencePath,
) -> None:
    with pytest.raises(InvalidArgument):
        await cached.infer(request(shape=(1, 4)))
    assert _counts(cached)[:2] == (0, 0)
    scheduler = cached.registry.get("m").versions[1].scheduler
    scheduler.hold = True  # type: ignore[union-attr]
    running = asyncio.ensure_future(cached.infer(request()))
    await asyncio.sleep(0)
    scheduler.held.pop().set_exception(Unavailable("gone"))  # type: ignore[union-attr]
    with pytest.raises(Unavailable):
        await running
    assert len(cached.registry.get("m").versions[1].cache.keys) == 0
    assert _counts(cached)[:2] == (0, 1)
