"""ModelInfer on `--grpc-server threads` (server/grpc/threaded.py, `_InferCall`): a burst of
small calls is decoded, admitted together (one admission group), encoded and serialized on the
loop, each thread getting its own answer's bytes; a large answer is serialized by its thread; a
cancel drops the admitted request; a malformed message is refused as INVALID_ARGUMENT."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from protocol.errors import InvalidArgument
from protocol.grpc import wire
from protocol.grpc.message_plans import MessagePlans
from protocol.proto import grpc_service_pb2 as pb
from protocol.types import InferRequest, InferResponse, Tensor
from scheduler import queue_scheduler
from server.grpc.loop_bridge import LoopBridge
from server.grpc.services import _lenient
from server.grpc.threaded import ThreadedGrpcFrontend, _InferCall

OnDone = Callable[[InferResponse | None, BaseException | None], None]


class _Core:
    """infer_nowait doubling the input; records whether each admission ran in a group."""

    may_trace = False

    def __init__(self, answer_now: bool = True) -> None:
        self.answer_now = answer_now
        self.in_group: list[bool] = []
        self.futures: list[asyncio.Future] = []

    def infer_nowait(
        self, request: InferRequest, on_done: OnDone, endpoint: str = ""
    ) -> asyncio.Future:
        self.in_group.append(queue_scheduler._GROUP.owing is not None)
        future = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        if self.answer_now:
            doubled = Tensor("OUT", "FP32", request.inputs[0].shape, 2 * request.inputs[0].data)
            on_done(InferResponse(request.model_name, "1", outputs=[doubled]), None)
        return future


class _Frontend:
    """What an _InferCall reads of ThreadedGrpcFrontend."""

    decode = ThreadedGrpcFrontend.decode
    parse_infer = staticmethod(_lenient(wire.parse_infer_request))

    def __init__(self, core: _Core, threshold: int = 64 * 1024) -> None:
        self.core = core
        self.offload_threshold = threshold
        self.plans = MessagePlans()


def _message(request_id: str, values: np.ndarray) -> bytes:
    message = pb.ModelInferRequest(model_name="m", id=request_id)
    message.inputs.add(name="IN", datatype="FP32", shape=list(values.shape))
    message.raw_input_contents.append(values.astype(np.float32).tobytes())
    return message.SerializeToString()


def _values(answer: bytes) -> tuple[str, np.ndarray]:
    response = pb.ModelInferResponse.FromString(answer)
    return response.id, np.frombuffer(response.raw_output_contents[0], np.float32)


def test_a_burst_is_admitted_together_and_each_thread_gets_its_own_answer() -> None:
    async def main() -> tuple[list[bytes], _Core]:
        core = _Core()
        bridge, frontend = LoopBridge(asyncio.get_running_loop()), _Frontend(core)
        calls = [
            _InferCall(frontend, _message(f"r{i}", np.full(4, i)), "")  # type: ignore[arg-type]
            for i in range(8)
        ]
        for call in calls:  # all arrive before the loop runs again: one drain, one group
            bridge.submit(call)
        answers = await asyncio.gather(*(asyncio.to_thread(call.wait) for call in calls))
        return answers, core

    answers, core = asyncio.run(main())
    assert core.in_group == [True] * 8
    for i, answer in enumerate(answers):
        request_id, values = _values(answer)
        assert request_id == f"r{i}"
        assert values.tolist() == [2.0 * i] * 4


def test_a_large_answer_is_serialized_by_its_thread_with_the_request_id() -> None:
    async def main() -> tuple[_InferCall, bytes]:
        frontend = _Frontend(_Core(), threshold=16)  # 4 floats out = 16 bytes; 8 are more
        call = _InferCall(frontend, _message("big", np.arange(8)), "")  # type: ignore[arg-type]
        LoopBridge(asyncio.get_running_loop()).submit(call)
        return call, await asyncio.to_thread(call.wait)

    call, answer = asyncio.run(main())
    assert isinstance(call.answer, InferResponse)  # left for the thread to encode
    request_id, values = _values(answer)
    assert request_id == "big"
    assert values.tolist() == [2.0 * v for v in range(8)]


def test_a_cancel_drops_the_admitted_request_and_the_thread_answers_cancelled() -> None:
    async def main() -> tuple[asyncio.Future, Any]:
        core = _Core(answer_now=False)
        call = _InferCall(_Frontend(core), _message("c", np.ones(2)), "")  # type: ignore[arg-type]
        bridge = LoopBridge(asyncio.get_running_loop())
        waiting = asyncio.ensure_future(asyncio.to_thread(call.wait))
        bridge.submit(call)
        while not core.futures:
            await asyncio.sleep(0.001)
        bridge.cancel(call)  # what grpc's end-of-call callback does
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, 5)
        return core.futures[0], call

    future, call = asyncio.run(main())
    assert future.cancelled()


def test_a_malformed_message_is_refused_before_admission() -> None:
    async def main() -> tuple[_Core, Any]:
        core = _Core()
        call = _InferCall(_Frontend(core), b"\xff\xff\xff", "")  # type: ignore[arg-type]
        LoopBridge(asyncio.get_running_loop()).submit(call)
        with pytest.raises(InvalidArgument) as refused:
            await asyncio.to_thread(call.wait)
        return core, refused.value

    core, error = asyncio.run(main())
    assert core.futures == []
    assert str(error.message).startswith("malformed request message")
