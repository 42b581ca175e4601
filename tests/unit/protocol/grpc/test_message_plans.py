"""protocol/grpc/message_plans.py: a ModelInferRequest's metadata decoded once, looked up after;
the raw entries still read and checked for every message."""

from __future__ import annotations

import numpy as np
import pytest

from protocol.errors import InvalidArgument
from protocol.grpc import codec, message_plans
from protocol.grpc.message_plans import MessagePlans
from protocol.proto import grpc_service_pb2 as pb
from protocol.types import InferRequest
from tests.support.requests import request_fields


def _message(values: np.ndarray | None = None, request_id: str = "") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="add", model_version="2", id=request_id)
    message.parameters["priority"].int64_param = 3
    for name in ("A", "B"):
        message.inputs.add(name=name, datatype="FP32", shape=[1, 4])
    message.inputs[0].parameters["custom"].string_param = "v"
    message.outputs.add(name="OUT").parameters["classification"].int64_param = 2
    first = np.arange(4, dtype=np.float32) if values is None else values
    message.raw_input_contents.extend([first.tobytes(), np.ones(4, np.float32).tobytes()])
    return message


def _decode(plans: MessagePlans, data: bytes) -> tuple[InferRequest, bool]:
    """What ThreadedGrpcFrontend.decode does; also whether the plan served it."""
    key = plans.key_of(data)
    if key is not None:
        planned = plans.planned(key, data)
        if planned is not None:
            return planned, True
    message = pb.ModelInferRequest.FromString(data)
    request = codec.decode_infer_request(message)
    if key is not None:
        plans.keep(key, message, request)
    return request, False


def test_metadata_seen_again_decodes_the_same_from_its_plan() -> None:
    plans = MessagePlans()
    data = _message().SerializeToString()
    full, from_plan = _decode(plans, data)
    assert not from_plan
    planned, from_plan = _decode(plans, data)
    assert from_plan and request_fields(planned) == request_fields(full)
    other = _message(np.full(4, 9, dtype=np.float32)).SerializeToString()
    request, from_plan = _decode(plans, other)
    assert from_plan and request.inputs[0].data.tolist() == [[9.0] * 4]
    request.parameters["x"] = 1
    assert request.outputs is not None
    request.outputs[0].parameters["x"] = 1
    again, _ = _decode(plans, data)
    assert "x" not in again.parameters
    assert again.outputs is not None and "x" not in again.outputs[0].parameters


def test_raw_entries_are_checked_for_every_message() -> None:
    plans = MessagePlans()
    _decode(plans, _message().SerializeToString())
    short = _message(np.arange(3, dtype=np.float32)).SerializeToString()
    with pytest.raises(InvalidArgument, match="input byte size mismatch for input 'A'"):
        _decode(plans, short)
    three = _message()
    three.raw_input_contents.append(b"\0" * 16)
    with pytest.raises(InvalidArgument, match="expected 2 inputs but got 3 raw input contents"):
        _decode(plans, three.SerializeToString())


def test_a_new_id_is_new_metadata_and_a_client_that_always_sends_one_stops_the_lookups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(message_plans, "MISSES_BEFORE_REST", 3)
    monkeypatch.setattr(message_plans, "REST_MESSAGES", 5)
    plans = MessagePlans()
    for index in range(3):
        request, from_plan = _decode(plans, _message(request_id=f"r{index}").SerializeToString())
        assert request.id == f"r{index}" and not from_plan
    assert plans.resting == 5
    for _ in range(5):
        assert plans.key_of(_message(request_id="r0").SerializeToString()) is None
    assert _decode(plans, _message(request_id="r0").SerializeToString())[1]  # looked up again


def test_messages_a_plan_cannot_serve_are_decoded_in_full() -> None:
    plans = MessagePlans()
    typed = pb.ModelInferRequest(model_name="add")
    typed.inputs.add(name="A", datatype="FP32", shape=[1]).contents.fp32_contents.append(1.0)
    assert plans.key_of(typed.SerializeToString()) is None  # no raw entries
    trailing = _message().SerializeToString() + pb.ModelInferRequest(id="late").SerializeToString()
    assert plans.key_of(trailing) is None  # metadata after the raw entries
    in_region = _message()
    in_region.outputs[0].parameters["shared_memory_region"].string_param = "r"
    del in_region.outputs[0].parameters["classification"]
    data = in_region.SerializeToString()
    _decode(plans, data)
    assert len(plans.plans) == 0 and not _decode(plans, data)[1]
