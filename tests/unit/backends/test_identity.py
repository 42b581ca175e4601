"""backends/identity.py: Triton's identity backend's stand-in for qa models."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from backends.base import BackendError, InstanceSpec
from backends.identity import IdentityBackend
from protocol.proto.model_config_pb2 import ModelConfig

CONFIG = """
name: "custom_zero_1_float32" backend: "identity" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 2 ] },
         { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def _backend(extra: str = "", index: int = 0) -> IdentityBackend:
    config = text_format.Parse(CONFIG + extra, ModelConfig())
    backend = IdentityBackend(
        config, Path("."), Path("."), InstanceSpec(f"m_{index}", "KIND_CPU", 0, index)
    )
    backend.load()
    return backend


def test_outputs_copy_the_inputs_of_the_same_number() -> None:
    inputs = {
        "INPUT0": np.arange(6, dtype=np.float32).reshape(2, 3),
        "INPUT1": np.ones((2, 2), np.int32),
    }
    outputs = _backend().execute(inputs)
    assert outputs["OUTPUT0"] is inputs["INPUT0"] and outputs["OUTPUT1"] is inputs["INPUT1"]
    ragged = [{"INPUT0": np.ones((1, 16), np.float32)}, {"INPUT0": np.ones((1, 8), np.float32)}]
    answers = _backend().execute_requests(ragged)  # each request keeps its own shape
    assert [a["OUTPUT0"].shape for a in answers] == [(1, 16), (1, 8)]  # type: ignore[index]


@pytest.mark.parametrize("index, expected_ms", [(0, 50), (1, 100), (2, 200)])
def test_execute_delay_per_instance(index: int, expected_ms: int) -> None:
    backend = _backend(
        'parameters [ { key: "execute_delay_ms" value: { string_value: "50" } },'
        '{ key: "instance_wise_delay_multiplier" value: { string_value: "2" } } ]',
        index,
    )
    assert backend._delay_s == pytest.approx(expected_ms / 1000)


def test_creation_delay_and_bad_parameters() -> None:
    started = time.monotonic()
    _backend('parameters [ { key: "creation_delay_sec" value: { string_value: "0.2" } } ]')
    assert time.monotonic() - started >= 0.2
    with pytest.raises(BackendError, match="'execute_delay_ms' must be a number"):
        _backend('parameters [ { key: "execute_delay_ms" value: { string_value: "soon" } } ]')
