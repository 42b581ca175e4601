"""protocol/grpc/codec.py: wire form <-> internal types, with tritonclient building the requests
and reading the responses (its generated messages share our descriptors in one process)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc._infer_result import InferResult
from tritonclient.grpc._utils import _get_inference_request

from protocol.errors import InvalidArgument
from protocol.grpc import codec
from protocol.proto import grpc_service_pb2 as pb
from protocol.proto.model_config_pb2 import ModelConfig
from protocol.types import IndexEntry, InferResponse, ModelMetadata, Tensor, TensorMetadata
from scheduler.stats import VersionStatistics


def triton_request(
    inputs: list[grpcclient.InferInput],
    outputs=None,
    request_id: str = "",
    sequence_id=0,
    priority: int = 0,
    timeout=None,
    parameters=None,
) -> pb.ModelInferRequest:
    """The exact message tritonclient would send."""
    return _get_inference_request(
        "m",
        inputs,
        "",
        request_id,
        outputs,
        sequence_id,
        False,
        False,
        priority,
        timeout,
        parameters,
    )


def infer_input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def typed_input(
    message: pb.ModelInferRequest,
    name: str,
    datatype: str,
    shape: list[int],
    field: str,
    values: list,
) -> pb.ModelInferRequest.InferInputTensor:
    tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return tensor


# ----- inputs -------------------------------------------------------------------------------
NUMERIC = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
]


@pytest.mark.parametrize("datatype", NUMERIC)
def test_raw_inputs_decode_to_numpy_views(datatype: str) -> None:
    from tritonclient.utils import triton_to_np_dtype

    array = (
        (np.arange(12) % 2 if datatype == "BOOL" else np.arange(12))
        .astype(triton_to_np_dtype(datatype))
        .reshape(3, 4)
    )
    request = codec.decode_infer_request(triton_request([infer_input("X", array, datatype)]))
    tensor = request.inputs[0]
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", datatype, (3, 4))
    np.testing.assert_array_equal(tensor.data, array)
    assert tensor.data.dtype == array.dtype
    assert not tensor.data.flags.owndata  # a view over the wire buffer, not a copy


def test_raw_bytes_input() -> None:
    array = np.array([b"a", b"", "héllo".encode(), b"\x00\xff"], dtype=object)
    request = codec.decode_infer_request(triton_request([infer_input("S", array, "BYTES")]))
    assert request.inputs[0].data.tolist() == array.tolist()


def test_bf16_only_travels_raw() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="X", datatype="BF16", shape=[2])
    message.raw_input_contents.append(np.array([0x3F80, 0x4000], np.uint16).tobytes())
    assert codec.decode_infer_request(message).inputs[0].data.tolist() == [0x3F80, 0x4000]


@pytest.mark.parametrize(
    "datatype,field,values,dtype",
    [
        ("BOOL", "bool_contents", [True, False], np.bool_),
        ("INT8", "int_contents", [-128, 127], np.int8),
        ("INT16", "int_contents", [-3, 4], np.int16),
        ("INT32", "int_contents", [1, -2], np.int32),
        ("INT64", "int64_contents", [2**40, -1], np.int64),
        ("UINT8", "uint_contents", [0, 255], np.uint8),
        ("UINT16", "uint_contents", [1, 65535], np.uint16),
        ("UINT32", "uint_contents", [1, 2**32 - 1], np.uint32),
        ("UINT64", "uint64_contents", [2**63, 1], np.uint64),
        ("FP32", "fp32_contents", [0.5, -1.25], np.float32),
        ("FP64", "fp64_contents", [0.1, 1e300], np.float64),
    ],
)
def test_typed_contents_decode(datatype: str, field: str, values: list, dtype: type) -> None:
    message = pb.ModelInferRequest(model_name="m")
    typed_input(message, "X", datatype, [1, 2], field, values)
    tensor = codec.decode_infer_request(message).inputs[0]
    assert tensor.data.dtype == np.dtype(dtype)
    assert tensor.data.shape == (1, 2)
    np.testing.assert_array_equal(tensor.data, np.array(values, dtype=dtype).reshape(1, 2))


def test_typed_bytes_contents() -> None:
    message = pb.ModelInferRequest(model_name="m")
    typed_input(message, "S", "BYTES", [3], "bytes_contents", [b"x", b"", b"yz"])
    tensor = codec.decode_infer_request(message).inputs[0]
    assert tensor.data.dtype == object and tensor.data.tolist() == [b"x", b"", b"yz"]


@pytest.mark.parametrize(
    "datatype, field, dtype",
    [
        ("FP32", "fp32_contents", np.float32),
        ("INT8", "int_contents", np.int8),
        ("BYTES", "bytes_contents", object),
    ],
)
def test_large_typed_contents_convert_in_steps_to_the_same_array(datatype, field, dtype) -> None:
    """Over CONTENTS_STEP values the conversion goes a step at a time (it runs in a thread
    beside the event loop); the array is the one a single conversion makes, ragged last step
    included, and an out-of-range value in a late step is still the same 400."""
    count = 2 * codec.CONTENTS_STEP + 5
    values = (
        [str(i).encode() for i in range(count)]
        if dtype is object
        else [(i % 200) - 100 for i in range(count)]
    )
    message = pb.ModelInferRequest(model_name="m")
    typed_input(message, "X", datatype, [count], field, values)
    assert codec.per_element_input_bytes(message) == 8 * count
    data = codec.decode_infer_request(message).inputs[0].data
    assert data.dtype == np.dtype(dtype) and data.shape == (count,)
    assert data.tolist() == np.array(values, dtype=dtype).tolist()
    if datatype == "INT8":
        message.inputs[0].contents.int_contents[count - 1] = 300
        with pytest.raises(InvalidArgument, match="invalid INT8 value for input 'X'"):
            codec.decode_infer_request(message)


def test_numeric_raw_contents_do_not_count_as_per_element_work() -> None:
    array = np.zeros((1, 1 << 20), dtype=np.float32)
    strings = np.array([b"ab"] * 1000, dtype=object)
    message = triton_request([infer_input("A", array, "FP32"), infer_input("S", strings, "BYTES")])
    assert codec.per_element_input_bytes(message) == 6 * 1000  # 4-byte length + 2 bytes each
    response = InferResponse(
        "m",
        "1",
        outputs=[
            Tensor("A", "FP32", array.shape, array),
            Tensor("S", "BYTES", strings.shape, strings),
        ],
    )
    assert codec.per_element_output_bytes(response) == 8 * 1000


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_types_refuse_typed_contents(datatype: str) -> None:
    message = pb.ModelInferRequest(model_name="m")
    typed_input(message, "X", datatype, [1], "fp32_contents", [1.0])
    with pytest.raises(InvalidArgument, match="can only be sent in raw_input_contents"):
        codec.decode_infer_request(message)


def test_raw_and_contents_together_is_an_error() -> None:
    message = pb.ModelInferRequest(model_name="m")
    typed_input(message, "X", "INT32", [1], "int_contents", [1])
    message.raw_input_contents.append(np.int32(1).tobytes())
    with pytest.raises(
        InvalidArgument,
        match="contents field must not be specified when using "
        "raw_input_contents for 'X' for model 'm'",
    ):
        codec.decode_infer_request(message)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda m: m.raw_input_contents.append(b"\0" * 4), "expected 1 inputs but got 2 raw input"),
        (
            lambda m: m.inputs[0].ClearField("shape") or m.inputs[0].shape.extend([3]),
            "byte size mismatch",
        ),
        (lambda m: setattr(m.inputs[0], "datatype", "FLOAT"), "invalid datatype 'FLOAT'"),
        (lambda m: m.inputs[0].shape.__setitem__(0, -1), "dimensions must be non-negative"),
        (
            lambda m: (
                m.inputs[0].parameters["shared_memory_region"].__setattr__("string_param", "r")
            ),
            "expected 0 inputs but got 1 raw input contents",
        ),  # an input in shm has no raw entry
    ],
)
def test_wire_errors(mutate, match: str) -> None:
    message = triton_request([infer_input("X", np.zeros(2, np.int32), "INT32")])
    mutate(message)
    with pytest.raises(InvalidArgument, match=match):
        codec.decode_infer_request(message)


@pytest.mark.parametrize(
    "datatype, field, shape, match",
    [
        # zero elements, but numpy cannot hold the shape: was INTERNAL "array is too big"
        (
            "INT32",
            None,
            [2**63 - 1, 0],
            r"shape \[9223372036854775807, 0\] of input 'X' is too large",
        ),
        ("INT32", "int_contents", [2**63 - 1, 0], "of input 'X' is too large"),
        ("BYTES", None, [0, 2**62], "of input 'X' is too large"),
        ("BYTES", "bytes_contents", [2**63 - 1, 0], "of input 'X' is too large"),
        # more dimensions than numpy allows: was INTERNAL "maximum supported dimension"
        ("INT32", None, [1] * 65, "input 'X': 65 dimensions exceed the maximum of 64"),
        ("BYTES", "bytes_contents", [1] * 65, "input 'X': 65 dimensions exceed the maximum of 64"),
    ],
)
def test_shapes_numpy_cannot_hold_are_invalid_arguments(
    datatype: str, field, shape: list, match: str
) -> None:
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="X", datatype=datatype, shape=shape)
    count = 1 if len(shape) == 65 else 0
    if field is None:
        raw = b"\x01\x00\x00\x00x" if datatype == "BYTES" else b"\0\0\0\0"
        message.raw_input_contents.append(raw[: count * 5 if datatype == "BYTES" else count * 4])
    else:
        getattr(tensor.contents, field).extend([b"x" if datatype == "BYTES" else 1] * count)
    with pytest.raises(InvalidArgument, match=match):
        codec.decode_infer_request(message)


def test_typed_element_count_must_match_shape() -> None:
    message = pb.ModelInferRequest(model_name="m")
    typed_input(message, "X", "FP32", [3], "fp32_contents", [1.0, 2.0])
    with pytest.raises(InvalidArgument, match="needs 3 values in fp32_contents, got 2"):
        codec.decode_infer_request(message)


def test_typed_value_out_of_range() -> None:
    message = pb.ModelInferRequest(model_name="m")
    typed_input(message, "X", "INT8", [1], "int_contents", [300])
    with pytest.raises(InvalidArgument, match="invalid INT8 value"):
        codec.decode_infer_request(message)


def test_bad_bytes_prefix() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="S", datatype="BYTES", shape=[1])
    message.raw_input_contents.append(b"\x05\x00\x00\x00ab")
    with pytest.raises(InvalidArgument, match="incomplete string data"):
        codec.decode_infer_request(message)


# ----- request fields, parameters and outputs -----------------------------------------------
def test_request_fields_and_tritonclient_parameters() -> None:
    message = triton_request(
        [infer_input("X", np.zeros(1, np.int32), "INT32")],
        request_id="r7",
        sequence_id="seq",
        priority=3,
        timeout=1000,
        parameters={"s": "v", "b": True, "i": -4, "f": 0.5},
    )
    message.model_version = "2"
    request = codec.decode_infer_request(message)
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "r7")
    assert request.outputs is None  # no outputs named: every output
    assert request.parameters == {
        "sequence_id": "seq",
        "sequence_start": False,
        "sequence_end": False,
        "priority": 3,
        "timeout": 1000,
        "s": "v",
        "b": True,
        "i": -4,
        "f": 0.5,
    }


@pytest.mark.parametrize(
    "key,kind,value",
    [
        ("priority", "int64_param", 2),
        ("priority", "uint64_param", 2),
        ("sequence_id", "int64_param", 9),
        ("sequence_id", "string_param", "abc"),
        ("triton_enable_empty_final_response", "bool_param", True),
    ],
)
def test_accepted_parameter_types(key: str, kind: str, value) -> None:
    message = pb.ModelInferRequest(model_name="m")
    setattr(message.parameters[key], kind, value)
    assert codec.decode_infer_request(message).parameters[key] == value


@pytest.mark.parametrize(
    "key,kind,value,match",
    [
        ("priority", "string_param", "1", "invalid value type for 'priority'"),
        (
            "timeout",
            "uint64_param",
            5,
            "invalid value type for 'timeout' parameter, expected int64_param",
        ),
        ("sequence_start", "int64_param", 1, "invalid value type for 'sequence_start'"),
        ("triton_anything", "bool_param", True, "reserved for Triton usage"),
    ],
)
def test_refused_parameters(key: str, kind: str, value, match: str) -> None:
    message = pb.ModelInferRequest(model_name="m")
    setattr(message.parameters[key], kind, value)
    with pytest.raises(InvalidArgument, match=match):
        codec.decode_infer_request(message)


def test_parameter_without_value() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.parameters["empty"].SetInParent()
    with pytest.raises(InvalidArgument, match="parameter 'empty' has no value"):
        codec.decode_infer_request(message)


def test_requested_outputs() -> None:
    outputs = [
        grpcclient.InferRequestedOutput("A", class_count=3),
        grpcclient.InferRequestedOutput("B"),
    ]
    message = triton_request([], outputs=outputs)
    message.outputs[1].parameters["binary_data"].bool_param = True
    message.outputs[1].parameters["custom"].string_param = "x"
    request = codec.decode_infer_request(message)
    assert [(o.name, o.classification, o.parameters) for o in request.outputs] == [
        ("A", 3, {}),
        ("B", 0, {"custom": "x"}),
    ]


def test_classification_must_be_an_integer() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.outputs.add(name="A").parameters["classification"].string_param = "3"
    with pytest.raises(InvalidArgument, match="'classification'"):
        codec.decode_infer_request(message)


# ----- responses ----------------------------------------------------------------------------
def sample_response() -> InferResponse:
    return InferResponse(
        "m",
        "1",
        id="",
        outputs=[
            Tensor("F", "FP32", (2, 2), np.array([[1.5, 2], [3, 4]], np.float32)),
            Tensor("S", "BYTES", (2,), np.array([b"ab", b""], dtype=object)),
            Tensor("E", "INT64", (0, 3), np.zeros((0, 3), np.int64)),
            Tensor("N", "INT32", (2,), np.arange(4, dtype=np.int32)[::2]),  # non-contiguous
        ],
        parameters={"p": 1, "q": True},
    )


def test_response_outputs_are_raw_and_index_aligned() -> None:
    message = codec.encode_infer_response(sample_response(), "req")
    assert message.id == "req" and message.model_name == "m" and message.model_version == "1"
    assert [o.name for o in message.outputs] == ["F", "S", "E", "N"]
    assert len(message.raw_output_contents) == 4
    assert message.raw_output_contents[2] == b""
    assert all(not o.HasField("contents") for o in message.outputs)
    assert message.parameters["p"].int64_param == 1 and message.parameters["q"].bool_param


def test_tritonclient_reads_the_response() -> None:
    result = InferResult(codec.encode_infer_response(sample_response()))
    np.testing.assert_array_equal(result.as_numpy("F"), [[1.5, 2], [3, 4]])
    assert result.as_numpy("S").tolist() == [b"ab", b""]
    assert result.as_numpy("E").shape == (0, 3)
    assert result.as_numpy("N").tolist() == [0, 2]


def test_stream_messages() -> None:
    ok = codec.stream_response(pb.ModelInferResponse(id="a"))
    assert ok.error_message == "" and ok.infer_response.id == "a"
    assert ok.infer_response.parameters["triton_final_response"].bool_param is True
    failed = codec.stream_error("boom", "b")
    assert failed.error_message == "boom" and failed.infer_response.id == "b"
    assert not failed.infer_response.outputs


@pytest.mark.parametrize(
    "value,kind",
    [
        (True, "bool_param"),
        (7, "int64_param"),
        (2**63, "uint64_param"),
        (0.5, "double_param"),
        ("s", "string_param"),
        (np.int32(3), "int64_param"),
    ],
)
def test_encode_parameter(value, kind: str) -> None:
    target = pb.InferParameter()
    codec.encode_parameter(target, value)
    assert target.WhichOneof("parameter_choice") == kind


# ----- other converters ---------------------------------------------------------------------
def test_statistics_fields() -> None:
    stats = VersionStatistics("m", "1")
    stats.record_success(100, 10, 20, 30, 40)
    stats.record_failure("CANCELED", 5)
    stats.record_execution(4, 20, 30, 40)
    stats.record_execution(1, 2, 3, 4)
    message = codec.encode_statistics_response([stats.snapshot()]).model_stats[0]
    assert (message.name, message.version, message.inference_count, message.execution_count) == (
        "m",
        "1",
        5,
        2,
    )
    assert message.last_inference > 0
    inference = message.inference_stats
    assert (inference.success.count, inference.success.ns) == (1, 100)
    assert (inference.fail.count, inference.fail.ns) == (1, 5)
    assert inference.queue.count == inference.success.count
    assert (
        inference.compute_input.count
        == inference.compute_infer.count
        == inference.compute_output.count
        == 1
    )
    assert [b.batch_size for b in message.batch_stats] == [1, 4]
    assert message.batch_stats[1].compute_infer.ns == 30


def test_statistics_match_the_http_json() -> None:
    from google.protobuf import json_format

    from protocol.rest import encode as rest_encode

    stats = VersionStatistics("m", "1")
    stats.record_success(100, 10, 20, 30, 40)
    stats.record_execution(2, 20, 30, 40)
    snapshot = stats.snapshot()
    grpc_json = json_format.MessageToDict(
        codec.encode_statistics(snapshot),
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    http_json = rest_encode.encode_statistics(snapshot)
    assert set(grpc_json) == set(http_json)
    assert set(grpc_json["inference_stats"]) == set(http_json["inference_stats"])
    assert (
        int(grpc_json["inference_stats"]["success"]["ns"])
        == http_json["inference_stats"]["success"]["ns"]
    )


def test_metadata_index_config_and_server_metadata() -> None:
    T, Meta, Entry = TensorMetadata, ModelMetadata, IndexEntry
    meta = codec.encode_model_metadata(
        Meta(
            "m", ["1", "2"], "onnxruntime_onnx", [T("I", "FP32", [-1, 3])], [T("O", "BYTES", [-1])]
        )
    )
    assert (meta.name, list(meta.versions), meta.platform) == ("m", ["1", "2"], "onnxruntime_onnx")
    assert (meta.inputs[0].name, meta.inputs[0].datatype, list(meta.inputs[0].shape)) == (
        "I",
        "FP32",
        [-1, 3],
    )
    index = codec.encode_repository_index(
        [Entry("a"), Entry("b", "1", "READY"), Entry("c", "2", "UNAVAILABLE", "unloaded")]
    )
    assert [(m.name, m.version, m.state, m.reason) for m in index.models] == [
        ("a", "", "", ""),
        ("b", "1", "READY", ""),
        ("c", "2", "UNAVAILABLE", "unloaded"),
    ]
    config = ModelConfig(name="m", max_batch_size=8)
    assert codec.encode_model_config(config).config == config
    server = codec.encode_server_metadata({"name": "s", "version": "1", "extensions": ["x"]})
    assert (server.name, server.version, list(server.extensions)) == ("s", "1", ["x"])


def test_load_parameters() -> None:
    parameters = pb.RepositoryModelLoadRequest().parameters
    parameters["config"].string_param = '{"backend":"onnxruntime"}'
    parameters["file:1/model.onnx"].bytes_param = b"\x00\x01"
    parameters["other"].int64_param = 3
    config, files = codec.decode_load_parameters("m", parameters)
    assert config == '{"backend":"onnxruntime"}' and files == {"1/model.onnx": b"\x00\x01"}
    parameters["config"].bytes_param = b"{}"
    with pytest.raises(InvalidArgument, match="'config' must be a string_param"):
        codec.decode_load_parameters("m", parameters)


def test_unload_dependents() -> None:
    parameters = pb.RepositoryModelUnloadRequest().parameters
    assert codec.decode_unload_dependents(parameters) is False
    parameters["unload_dependents"].bool_param = True
    assert codec.decode_unload_dependents(parameters) is True
    parameters["unload_dependents"].string_param = "yes"
    with pytest.raises(InvalidArgument):
        codec.decode_unload_dependents(parameters)


def test_trace_and_log_settings() -> None:
    request = pb.TraceSettingRequest()
    request.settings["trace_rate"].value.append("5")
    request.settings["trace_count"].SetInParent()
    assert codec.decode_trace_settings(request.settings) == {
        "trace_rate": ["5"],
        "trace_count": None,
    }
    trace = codec.encode_trace_settings({"trace_level": ["OFF"], "trace_file": [""]})
    assert list(trace.settings["trace_level"].value) == ["OFF"]
    logs = codec.encode_log_settings(
        {"log_info": True, "log_verbose_level": 2, "log_format": "default"}
    )
    assert logs.settings["log_info"].bool_param is True
    assert logs.settings["log_verbose_level"].uint32_param == 2
    assert logs.settings["log_format"].string_param == "default"
    log_request = pb.LogSettingsRequest()
    log_request.settings["log_error"].bool_param = False
    assert codec.decode_log_settings(log_request.settings) == {"log_error": False}
