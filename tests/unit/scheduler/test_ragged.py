"""scheduler/ragged.py: batch inputs of every kind, ragged inputs joined flat, batch outputs
scattered back with each request's input shape (the examples of Triton's model_config.proto)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from protocol.proto.model_config_pb2 import ModelConfig
from scheduler.ragged import RaggedBatching, batch_input


def _config(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


def test_plain_models_have_no_ragged_plan() -> None:
    assert RaggedBatching.of(_config('input [ { name: "X" dims: [ -1 ] } ]')) is None


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("BATCH_ELEMENT_COUNT", [6, 4]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", [6, 10]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [0, 6, 10]),
        ("BATCH_ITEM_SHAPE", [[3, 1], [3, 1], [2, 2]]),
        ("BATCH_ITEM_SHAPE_FLATTEN", [3, 1, 3, 1, 2, 2]),
    ],
)
def test_batch_inputs(kind: str, expected: list) -> None:
    # A batch-2 request with shape [3, 1] per row, and a batch-1 request with shape [2, 2].
    sources = [np.zeros((2, 3, 1), np.float32), np.zeros((1, 2, 2), np.float32)]
    value = batch_input(kind, sources, np.dtype(np.int32))
    assert value.tolist() == expected and value.dtype == np.int32


def test_max_element_count_is_a_shape() -> None:
    sources = [np.zeros((1, 3)), np.zeros((1, 7)), np.zeros((1, 5))]
    assert batch_input("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", sources, np.dtype(np.float32)).shape == (
        7,
    )


def test_gather_and_split() -> None:
    plan = RaggedBatching(
        _config("""
        input [ { name: "X" dims: [ -1 ] allow_ragged_batch: true },
                { name: "Y" dims: [ 2 ] } ]
        batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT64
                        source_input: "X" } ]
        batch_output [ { target_name: "Z" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                         source_input: "X" } ]""")
    )
    requests = [
        {"X": np.array([[1.0, 2.0]]), "Y": np.array([[1, 1]])},
        {"X": np.array([[3.0, 4.0, 5.0]]), "Y": np.array([[2, 2]])},
    ]
    inputs = plan.gather(requests)
    assert inputs["X"].tolist() == [1, 2, 3, 4, 5]  # joined flat
    assert inputs["Y"].tolist() == [[1, 1], [2, 2]]  # along the batch dimension
    assert inputs["N"].tolist() == [2, 3]
    one = plan.gather(requests[:1])  # a batch of one is flattened too: the model wants 1-D
    assert one["X"].shape == (2,)
    pieces = plan.split({"Z": inputs["X"] * 10, "W": np.array([[7], [8]])}, [1, 1], requests)
    assert pieces[0]["Z"].tolist() == [[10, 20]] and pieces[1]["Z"].tolist() == [[30, 40, 50]]
    assert pieces[0]["W"].tolist() == [[7]] and pieces[1]["W"].tolist() == [[8]]
    with pytest.raises(ValueError, match="batch output 'Z' has 4 elements"):
        plan.split({"Z": np.zeros(4)}, [1, 1], requests)
