"""npu/dims.py on its own: reading --dynamic_dims gears as GE lays them out (the inputs ATC's
--input_shape lists, in its order), without a device."""

from __future__ import annotations

import pytest

from backends.base import BackendError
from npu import dims


def test_inputs_of_the_same_dims_and_the_same_gear_values_need_no_parameter() -> None:
    """BERT-style ids / mask / type ids, each [1, -1] with one sequence length per gear: every
    order reads the same, so none has to be named."""
    inputs = [("ids", (1, -1)), ("mask", (1, -1)), ("types", (1, -1))]
    gears = [(1, 8, 1, 8, 1, 8), (1, 32, 1, 32, 1, 32)]
    assert dims.split(inputs, gears, None) == [
        ((1, 8), (1, 8), (1, 8)),
        ((1, 32), (1, 32), (1, 32)),
    ]


def test_a_static_input_left_out_and_a_scalar_keep_their_dims() -> None:
    inputs = [("scale", ()), ("x", (-1, 3)), ("table", (4, 4))]
    assert dims.split(inputs, [(2, 3), (5, 3)], None) == [
        ((), (2, 3), (4, 4)),
        ((), (5, 3), (4, 4)),
    ]


def test_gears_no_order_explains_are_refused_with_the_numbers() -> None:
    with pytest.raises(BackendError, match=r"have 3 dims each \(first gear \[1, 8, 2\]\)"):
        dims.split([("ids", (1, -1)), ("mask", (1, -1))], [(1, 8, 2)], None)


def test_too_many_readings_ask_for_the_parameter() -> None:
    inputs = [(f"in{i}", (-1,)) for i in range(7)]
    gears = [tuple(range(1, 8)), tuple(range(2, 9))]
    with pytest.raises(BackendError, match="set parameter input_shape"):
        dims.split(inputs, gears, None)
    named = ";".join(f"in{i}" for i in reversed(range(7)))
    assert dims.split(inputs, gears, named)[0] == tuple((7 - i,) for i in range(7))
