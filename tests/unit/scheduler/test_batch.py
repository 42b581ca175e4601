"""scheduler/batch.py: gathering, splitting and padding, and which of them copy."""

import numpy as np
import pytest

from scheduler.batch import concat_inputs, drop_padding, split_outputs


def test_single_request_is_passed_through_without_copy():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    batched = concat_inputs([{"X": x}])
    assert batched["X"] is x


def test_requests_are_joined_along_dim_0_in_order():
    a = np.full((1, 2), 1, np.float32)
    b = np.full((3, 2), 2, np.float32)
    batched = concat_inputs(
        [
            {"X": a, "S": np.array([[b"a"]], dtype=object)},
            {"X": b, "S": np.array([[b"b"]] * 3, dtype=object)},
        ]
    )
    assert batched["X"].shape == (4, 2)
    assert batched["X"][:, 0].tolist() == [1, 2, 2, 2]
    assert batched["S"].dtype == object
    assert batched["S"].reshape(-1).tolist() == [b"a", b"b", b"b", b"b"]


def test_ragged_inputs_are_joined_flat():
    batched = concat_inputs([{"X": np.array([[1, 2]])}, {"X": np.array([[3, 4, 5]])}])
    assert batched["X"].tolist() == [1, 2, 3, 4, 5]


def test_outputs_split_by_rows_are_views():
    out = np.arange(10).reshape(5, 2)
    pieces = split_outputs({"Y": out}, [2, 3])
    assert [p["Y"].tolist() for p in pieces] == [[[0, 1], [2, 3]], [[4, 5], [6, 7], [8, 9]]]
    assert all(np.shares_memory(p["Y"], out) for p in pieces)


def test_split_drops_padding_rows():
    out = np.arange(8).reshape(8, 1)
    pieces = split_outputs({"Y": out}, [1, 2])
    assert [p["Y"].reshape(-1).tolist() for p in pieces] == [[0], [1, 2]]
    assert split_outputs({"Y": out}, [3])[0]["Y"].reshape(-1).tolist() == [0, 1, 2]


def test_split_rejects_an_output_with_too_few_rows():
    with pytest.raises(ValueError, match="output 'Y' has 2 rows, expected 3"):
        split_outputs({"Y": np.zeros((2, 1))}, [1, 2])


def test_padding_to_a_gear_adds_zero_rows_in_one_copy():
    a = np.ones((1, 2), np.float32)
    b = np.full((2, 2), 2, np.float32)
    batched = concat_inputs([{"X": a}, {"X": b}], pad_to=4)
    assert batched["X"].tolist() == [[1, 1], [2, 2], [2, 2], [0, 0]]
    strings = concat_inputs([{"S": np.array([b"x"], dtype=object)}], pad_to=2)
    assert strings["S"].tolist() == [b"x", b""]


def test_drop_padding():
    out = {"Y": np.arange(4)}
    assert drop_padding(out, 4)["Y"] is out["Y"]
    assert drop_padding(out, 3)["Y"].tolist() == [0, 1, 2]
