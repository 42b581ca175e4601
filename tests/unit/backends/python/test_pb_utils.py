"""The model-side utils module (`pb_utils`): the API a Triton Python model is written against."""

from __future__ import annotations

import json

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils

CONFIG = {
    "name": "m",
    "max_batch_size": 4,
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [3]}],
    "output": [{"name": "OUT", "data_type": "TYPE_INT64", "dims": [-1]}],
}


def test_tensor_name_and_array() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("IN", array)
    assert tensor.name() == "IN"
    assert tensor.as_numpy() is array
    assert tensor.shape() == [2, 3]
    assert tensor.triton_dtype() == pb_utils.TYPE_FP32
    assert tensor.is_cpu()


def test_tensor_accepts_numpy_strings_as_bytes_objects() -> None:
    tensor = pb_utils.Tensor("S", np.array(["a", "bc"]))
    assert tensor.as_numpy().dtype == object
    assert list(tensor.as_numpy()) == [b"a", b"bc"]
    assert tensor.triton_dtype() == pb_utils.TYPE_STRING


def test_tensor_rejects_non_arrays() -> None:
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("X", [1, 2, 3])  # type: ignore[arg-type]


def test_request_accessors_and_lookup() -> None:
    first = pb_utils.Tensor("A", np.zeros(1))
    second = pb_utils.Tensor("B", np.ones(1))
    request = pb_utils.InferenceRequest("m", [first, second], ["OUT"], request_id="r1")
    assert request.inputs() == [first, second]
    assert request.requested_output_names() == ["OUT"]
    assert request.request_id() == "r1"
    assert request.model_name() == "m"
    assert json.loads(request.parameters()) == {}
    assert pb_utils.get_input_tensor_by_name(request, "B") is second
    assert pb_utils.get_input_tensor_by_name(request, "C") is None


def test_bls_outside_a_worker_is_refused_clearly() -> None:
    request = pb_utils.InferenceRequest(model_name="other", inputs=[], requested_output_names=["X"])
    with pytest.raises(pb_utils.TritonModelException, match="Python model worker"):
        request.exec()
    with pytest.raises(pb_utils.TritonModelException, match="response sender"):
        request.get_response_sender()
    assert not request.is_cancelled()


def test_decoupled_policy_helper_and_parameters() -> None:
    config = {"model_transaction_policy": {"decoupled": True}}
    assert pb_utils.using_decoupled_model_transaction_policy(config)
    assert pb_utils.using_decoupled_model_transaction_policy(json.dumps(config))
    assert not pb_utils.using_decoupled_model_transaction_policy({})
    response = pb_utils.InferenceResponse([], parameters={"n": 3, "ok": True})
    assert json.loads(response.parameters()) == {"n": 3, "ok": True}
    with pytest.raises(pb_utils.TritonModelException, match="parameter 'bad'"):
        pb_utils.InferenceResponse([], parameters={"bad": [1]})._parameter_dict()


def test_response_outputs_and_errors() -> None:
    out = pb_utils.Tensor("OUT", np.zeros(2))
    response = pb_utils.InferenceResponse(output_tensors=[out])
    assert not response.has_error() and response.error() is None
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is out
    assert pb_utils.get_output_tensor_by_name(response, "NOPE") is None
    failed = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("bad input"))
    assert failed.has_error()
    assert failed.error().message() == "bad input"
    assert failed.error().code() == pb_utils.TritonError.INTERNAL
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[np.zeros(1)])  # type: ignore[list-item]


def test_triton_error_codes() -> None:
    error = pb_utils.TritonError("nope", pb_utils.TritonError.INVALID_ARG)
    assert error.code() == pb_utils.TritonError.INVALID_ARG
    assert isinstance(pb_utils.TritonModelException("x"), Exception)


def test_config_lookup_by_name_from_dict_or_json() -> None:
    assert pb_utils.get_input_config_by_name(CONFIG, "IN")["dims"] == [3]
    assert (
        pb_utils.get_output_config_by_name(json.dumps(CONFIG), "OUT")["data_type"] == "TYPE_INT64"
    )
    assert pb_utils.get_output_config_by_name(CONFIG, "IN") is None


@pytest.mark.parametrize(
    "name, numpy_type",
    [
        ("TYPE_FP32", np.float32),
        ("TYPE_INT64", np.int64),
        ("TYPE_UINT8", np.uint8),
        ("TYPE_BOOL", np.bool_),
        ("TYPE_FP16", np.float16),
        ("TYPE_STRING", np.object_),
    ],
)
def test_type_conversions(name: str, numpy_type: type) -> None:
    assert pb_utils.triton_string_to_numpy(name) is numpy_type
    number = pb_utils.numpy_to_triton_type(numpy_type)
    assert pb_utils.triton_to_numpy_type(number) is numpy_type


def test_byte_tensor_round_trip() -> None:
    values = np.array([b"one", b"", "three"], dtype=object)
    encoded = pb_utils.serialize_byte_tensor(values)
    assert encoded.dtype == np.uint8
    assert list(pb_utils.deserialize_bytes_tensor(encoded)) == [b"one", b"", b"three"]


def test_model_config_auto_complete_helpers() -> None:
    config = pb_utils.ModelConfig(
        {
            "name": "m",
            "max_batch_size": 0,
            "input": [],
            "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]}],
        }
    )
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [2]})
    config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]})  # agrees: no-op
    result = config.as_dict()
    assert result["max_batch_size"] == 8 and result["dynamic_batching"] == {}
    assert result["input"] == [{"name": "IN", "data_type": "TYPE_FP32", "dims": [2]}]
    assert len(result["output"]) == 1
    with pytest.raises(pb_utils.TritonModelException, match="dims"):
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(pb_utils.TritonModelException, match="max_batch_size"):
        config.set_max_batch_size(4)


def test_logger_writes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    pb_utils.Logger.log_warn("careful")
    assert "careful" in capsys.readouterr().err


def test_auto_complete_cannot_add_dynamic_batching_to_a_sequence_model() -> None:
    config = pb_utils.ModelConfig({"name": "m", "sequence_batching": {}})
    with pytest.raises(pb_utils.TritonModelException) as error:
        config.set_dynamic_batching()
    assert str(error.value) == (
        "Configuration specified scheduling_choice as 'sequence_batching', but "
        "auto-complete-config function for model 'm' tries to set scheduling_choice as "
        "'dynamic_batching'"
    )
