"""Request validation against the model config, with Triton's messages."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from protocol.errors import InvalidArgument
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.types import InferRequest, RequestedOutput, Tensor
from scheduler.validation import validate_request

CONFIG = """
name: "simple"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
dynamic_batching {
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { default_timeout_microseconds: 5000 allow_timeout_override: true }
  priority_queue_policy { key: 1 value { default_timeout_microseconds: 100 } }
}
"""


def config() -> ModelConfig:
    return text_format.Parse(CONFIG, ModelConfig())


def tensor(name: str, shape: tuple[int, ...], dtype: str = "INT32") -> Tensor:
    return Tensor(name, dtype, shape, np.zeros(shape, dtype=np.int32))


def request(*tensors: Tensor, **kwargs) -> InferRequest:
    return InferRequest("simple", inputs=list(tensors), **kwargs)


def test_valid_request_gets_batch_size_priority_and_timeout() -> None:
    r = request(tensor("INPUT0", (3, 16)), tensor("INPUT1", (3, 5)), parameters={"timeout": 1000})
    validate_request(r, config())
    assert (r.batch_size, r.priority, r.timeout_us) == (3, 2, 1000)


def test_priority_levels_and_their_policies() -> None:
    r = request(tensor("INPUT0", (1, 16)), tensor("INPUT1", (1, 5)), parameters={"priority": 1})
    validate_request(r, config())
    assert (r.priority, r.timeout_us) == (1, 100)
    r = request(tensor("INPUT0", (1, 16)), tensor("INPUT1", (1, 5)), parameters={"priority": 9})
    validate_request(r, config())
    assert r.priority == 2  # out of range falls back to the default level


@pytest.mark.parametrize(
    "tensors, message",
    [
        ((tensor("INPUT0", (1, 16)),), "expected 2 inputs but got 1 inputs for model 'simple'"),
        (
            (tensor("INPUT0", (1, 15)), tensor("INPUT1", (1, 2))),
            "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,15]",
        ),
        (
            (tensor("INPUT0", (1, 16), "FP32"), tensor("INPUT1", (1, 2))),
            "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
        ),
        (
            (tensor("INPUT0", (9, 16)), tensor("INPUT1", (9, 2))),
            "batch-size must be <= 8 for 'simple'",
        ),
        (
            (tensor("INPUT0", (2, 16)), tensor("INPUT1", (3, 2))),
            "batch size does not match other inputs",
        ),
        (
            (tensor("INPUT0", (1, 16)), tensor("INPUT9", (1, 2))),
            "unexpected inference input 'INPUT9'",
        ),
        ((tensor("INPUT0", (1, 16)), tensor("INPUT0", (1, 16))), "input 'INPUT0' already exists"),
    ],
)
def test_invalid_requests(tensors, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_request(request(*tensors), config())
    assert message in info.value.message
    assert info.value.message.startswith("[request id: <id_unknown>] ")


def test_unknown_and_duplicate_outputs() -> None:
    base = (tensor("INPUT0", (1, 16)), tensor("INPUT1", (1, 2)))
    with pytest.raises(InvalidArgument, match="unexpected inference output 'NOPE'"):
        validate_request(request(*base, outputs=[RequestedOutput("NOPE")]), config())
    with pytest.raises(InvalidArgument, match="output 'OUTPUT0' already exists in request"):
        validate_request(
            request(*base, outputs=[RequestedOutput("OUTPUT0")] * 2, id="r7"), config()
        )


def test_negative_priority_is_rejected() -> None:
    with pytest.raises(InvalidArgument, match="parameter 'priority'"):
        validate_request(
            request(
                tensor("INPUT0", (1, 16)), tensor("INPUT1", (1, 2)), parameters={"priority": -1}
            ),
            config(),
        )


RESHAPE_CONFIG = """
name: "reshaped"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ %s ] reshape: { shape: [ %s ] } } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


@pytest.mark.parametrize(
    "dims, reshape, shape", [("-1", "", (3,)), ("-1", "2", (3,)), ("16", "3", (16,))]
)
def test_a_shape_the_reshape_cannot_take_is_invalid_argument(
    dims: str, reshape: str, shape: tuple[int, ...]
) -> None:
    model = text_format.Parse(RESHAPE_CONFIG % (dims, reshape), ModelConfig())
    with pytest.raises(InvalidArgument, match="INPUT"):
        validate_request(InferRequest("reshaped", inputs=[tensor("INPUT", shape)]), model)


def test_a_signature_that_passed_is_looked_up_with_the_same_outcome() -> None:
    from scheduler.validation import RequestRules

    rules = RequestRules(config())
    first = request(tensor("INPUT0", (3, 16)), tensor("INPUT1", (3, 5)))
    validate_request(first, rules)
    assert len(rules.valid) == 1
    again = request(tensor("INPUT0", (3, 16)), tensor("INPUT1", (3, 5)), parameters={"priority": 1})
    validate_request(again, rules)  # looked up: the batch size, and its own queue policy
    assert (again.batch_size, again.priority, again.timeout_us) == (3, 1, 100)
    assert len(rules.valid) == 1
    # another shape under the same names is checked in full, and refused as before
    with pytest.raises(InvalidArgument, match="unexpected shape for input 'INPUT0'"):
        validate_request(request(tensor("INPUT0", (3, 15)), tensor("INPUT1", (3, 5))), rules)
    with pytest.raises(InvalidArgument, match="unexpected inference output 'NOPE'"):
        validate_request(
            request(
                tensor("INPUT0", (3, 16)),
                tensor("INPUT1", (3, 5)),
                outputs=[RequestedOutput("NOPE")],
            ),
            rules,
        )
    assert len(rules.valid) == 1  # refusals are never kept


def test_the_signature_table_is_bounded_and_skipped_for_reshapes() -> None:
    from scheduler.validation import VALID_SIGNATURES, RequestRules

    rules = RequestRules(config())
    for width in range(1, VALID_SIGNATURES + 10):
        r = request(tensor("INPUT0", (1, 16)), tensor("INPUT1", (1, width)))
        validate_request(r, rules)
        assert r.batch_size == 1
    assert len(rules.valid) == VALID_SIGNATURES
    reshaped = config()
    reshaped.input[1].reshape.shape.extend([-1])
    rules = RequestRules(reshaped)
    r = request(tensor("INPUT0", (2, 16)), tensor("INPUT1", (2, 4)))
    validate_request(r, rules)
    assert not rules.memoizes and not rules.valid and r.batch_size == 2
