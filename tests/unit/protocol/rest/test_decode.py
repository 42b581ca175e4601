"""Golden wire cases for REST request decoding (protocol/rest/decode.py, inputs.py): what the
HTTP body says -> what the core sees, and which bodies are refused with which message."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from protocol.errors import InvalidArgument, ServerError
from protocol.types import RequestedOutput
from tests.support.rest_cases import (
    MODEL,
    bytes_blob,
    decode_body,
    fp32_bytes,
    json_body,
    nested_json,
    tensor_entry,
    with_binary,
)

# --------------------------------------------------------------------------- valid requests

_BYTES_BIN = bytes_blob(b"hello", b"", b"\xff\x00")
_FP16 = np.array([0.5, -2.0], dtype=np.float16)
_BF16_BITS = np.array([0x3F80, 0xC000], dtype=np.uint16)  # 1.0, -2.0

# (case id, body, header length, {input name: expected array (dtype and shape included)})
VALID_CASES = [
    (
        "bool",
        json_body(tensor_entry("x", "BOOL", [3], [True, False, True])),
        None,
        {"x": np.array([True, False, True])},
    ),
    (
        "uint8",
        json_body(tensor_entry("x", "UINT8", [2], [0, 255])),
        None,
        {"x": np.array([0, 255], np.uint8)},
    ),
    (
        "uint16",
        json_body(tensor_entry("x", "UINT16", [2], [0, 65535])),
        None,
        {"x": np.array([0, 65535], np.uint16)},
    ),
    (
        "uint32",
        json_body(tensor_entry("x", "UINT32", [1], [4294967295])),
        None,
        {"x": np.array([4294967295], np.uint32)},
    ),
    (
        "uint64",
        json_body(tensor_entry("x", "UINT64", [2], [0, 18446744073709551615])),
        None,
        {"x": np.array([0, 18446744073709551615], np.uint64)},
    ),
    (
        "int8",
        json_body(tensor_entry("x", "INT8", [2], [-128, 127])),
        None,
        {"x": np.array([-128, 127], np.int8)},
    ),
    (
        "int16",
        json_body(tensor_entry("x", "INT16", [2], [-32768, 32767])),
        None,
        {"x": np.array([-32768, 32767], np.int16)},
    ),
    (
        "int32",
        json_body(tensor_entry("x", "INT32", [2, 2], [1, 2, 3, 4])),
        None,
        {"x": np.array([[1, 2], [3, 4]], np.int32)},
    ),
    (
        "int64",
        json_body(tensor_entry("x", "INT64", [1], [-9223372036854775808])),
        None,
        {"x": np.array([-9223372036854775808], np.int64)},
    ),
    (
        "fp32",
        json_body(tensor_entry("x", "FP32", [3], [1.5, -2, 0])),
        None,
        {"x": np.array([1.5, -2.0, 0.0], np.float32)},
    ),
    (
        "fp64",
        json_body(tensor_entry("x", "FP64", [2], [0.1, 1e300])),
        None,
        {"x": np.array([0.1, 1e300], np.float64)},
    ),
    (
        "bytes-json",
        json_body(tensor_entry("x", "BYTES", [2], ["héllo", ""])),
        None,
        {"x": np.array(["héllo".encode(), b""], dtype=object)},
    ),
    (
        "nested-data",
        json_body(tensor_entry("x", "INT32", [2, 2], [[1, 2], [3, 4]])),
        None,
        {"x": np.array([[1, 2], [3, 4]], np.int32)},
    ),
    (
        "nested-data-flat-shape",
        json_body(tensor_entry("x", "FP32", [4], [[1, 2], [3, 4]])),
        None,
        {"x": np.array([1, 2, 3, 4], np.float32)},
    ),
    (
        "ragged-nesting-matching-count",
        json_body(tensor_entry("x", "INT64", [2, 2], [[1, 2, 3], [4]])),
        None,
        {"x": np.array([[1, 2], [3, 4]], np.int64)},
    ),
    (
        "nested-bytes",
        json_body(tensor_entry("x", "BYTES", [2, 1], [["a"], ["b"]])),
        None,
        {"x": np.array([[b"a"], [b"b"]], dtype=object)},
    ),
    (
        "zero-elements",
        json_body(tensor_entry("x", "FP32", [0, 3], [])),
        None,
        {"x": np.zeros((0, 3), np.float32)},
    ),
    (
        "scalar-shape",
        json_body(tensor_entry("x", "INT32", [], [7])),
        None,
        {"x": np.array(7, np.int32)},
    ),
    (
        "binary-fp32",
        *with_binary(
            json_body(tensor_entry("x", "FP32", [2, 2], binary_data_size=16)),
            fp32_bytes(1, 2, 3, 4),
        ),
        {"x": np.array([[1, 2], [3, 4]], np.float32)},
    ),
    (
        "binary-bytes",
        *with_binary(
            json_body(tensor_entry("x", "BYTES", [3], binary_data_size=len(_BYTES_BIN))), _BYTES_BIN
        ),
        {"x": np.array([b"hello", b"", b"\xff\x00"], dtype=object)},
    ),
    (
        "binary-fp16",
        *with_binary(
            json_body(tensor_entry("x", "FP16", [2], binary_data_size=4)), _FP16.tobytes()
        ),
        {"x": _FP16},
    ),
    (
        "binary-bf16-as-bits",
        *with_binary(
            json_body(tensor_entry("x", "BF16", [2], binary_data_size=4)), _BF16_BITS.tobytes()
        ),
        {"x": _BF16_BITS},
    ),
    (
        "binary-zero-size",
        *with_binary(json_body(tensor_entry("x", "INT32", [0], binary_data_size=0))),
        {"x": np.zeros(0, np.int32)},
    ),
    (
        "mixed-json-and-binary",
        *with_binary(
            json_body(
                tensor_entry("a", "FP32", [1], binary_data_size=4),
                tensor_entry("b", "INT32", [2], [5, 6]),
                tensor_entry("c", "INT8", [3], binary_data_size=3),
            ),
            fp32_bytes(9.5),
            bytes([1, 2, 255]),
        ),
        {
            "a": np.array([9.5], np.float32),
            "b": np.array([5, 6], np.int32),
            "c": np.array([1, 2, -1], np.int8),
        },
    ),
    (
        "header-length-equals-body",
        *with_binary(json_body(tensor_entry("x", "INT32", [1], [3]))),
        {"x": np.array([3], np.int32)},
    ),
    ("depth-50-passes", nested_json(50), None, {"x": np.array([1], np.int32)}),
]


@pytest.mark.parametrize(
    "body,header_length,expected", [c[1:] for c in VALID_CASES], ids=[c[0] for c in VALID_CASES]
)
def test_valid_request(body: bytes, header_length: int | None, expected: dict) -> None:
    request = decode_body(body, header_length)
    assert [t.name for t in request.inputs] == list(expected)
    for tensor in request.inputs:
        want = expected[tensor.name]
        assert tensor.shape == want.shape
        assert tensor.data.shape == want.shape
        assert tensor.data.dtype == want.dtype
        assert tensor.data.tolist() == want.tolist()


# --------------------------------------------------------------------------- invalid requests

_SHAPE_OVERFLOW = json_body(tensor_entry("x", "FP32", [16, 2**60 + 2], binary_data_size=4))
_TWO_BINARY = json_body(
    tensor_entry("a", "FP32", [2], binary_data_size=8),
    tensor_entry("b", "FP32", [1], binary_data_size=4),
)

# (case id, body, header length, error class, message fragment)
ERROR_CASES = [
    ("not-json", b"{nope", None, InvalidArgument, "failed to parse the request JSON buffer"),
    ("json-not-object", b"[1]", None, InvalidArgument, "expected a JSON object"),
    ("inputs-missing", b"{}", None, InvalidArgument, "Unable to parse 'inputs'"),
    ("inputs-not-list", b'{"inputs":{}}', None, InvalidArgument, "Unable to parse 'inputs'"),
    ("input-not-object", b'{"inputs":[5]}', None, InvalidArgument, "input 0 is not a JSON object"),
    (
        "input-without-name",
        json_body({"datatype": "FP32", "shape": [1], "data": [1]}),
        None,
        InvalidArgument,
        "Unable to parse 'name' of input 0",
    ),
    (
        "duplicate-input",
        json_body(tensor_entry("x", "FP32", [1], [1]), tensor_entry("x", "FP32", [1], [2])),
        None,
        InvalidArgument,
        "input 'x' already exists in request",
    ),
    (
        "unknown-datatype",
        json_body(tensor_entry("x", "FP31", [1], [1])),
        None,
        InvalidArgument,
        "invalid datatype 'FP31' for input 'x'",
    ),
    (
        "datatype-not-string",
        json_body(tensor_entry("x", 3, [1], [1])),
        None,
        InvalidArgument,
        "Unable to parse 'datatype' for input 'x'",
    ),
    (
        "shape-missing",
        json_body({"name": "x", "datatype": "FP32", "data": [1]}),
        None,
        InvalidArgument,
        "Unable to parse 'shape' for input 'x'",
    ),
    (
        "negative-dim",
        json_body(tensor_entry("x", "FP32", [-5], [1])),
        None,
        InvalidArgument,
        "Unable to parse 'shape' for input 'x': dimension 0 must be a non-negative integer",
    ),
    (
        "bool-dim",
        json_body(tensor_entry("x", "FP32", [True], [1])),
        None,
        InvalidArgument,
        "dimension 0 must be a non-negative integer, got True",
    ),
    (
        "float-dim",
        json_body(tensor_entry("x", "FP32", [1, 2.0], [1, 2])),
        None,
        InvalidArgument,
        "dimension 1 must be a non-negative integer",
    ),
    (
        "dim-beyond-int64",
        json_body(tensor_entry("x", "FP32", [2**63], [1])),
        None,
        InvalidArgument,
        "dimension 0 must be a non-negative integer",
    ),
    (
        "shape-overflow",
        _SHAPE_OVERFLOW + fp32_bytes(1),
        len(_SHAPE_OVERFLOW),
        InvalidArgument,
        "byte size overflows int64",
    ),
    (
        "too-many-dims",
        json_body(tensor_entry("x", "FP32", [1] * 65, [1])),
        None,
        InvalidArgument,
        "65 dimensions exceed the maximum of 64",
    ),
    # zero elements, yet numpy cannot hold the shape (was a 500 "array is too big")
    (
        "zero-elements-huge-shape-json",
        json_body(tensor_entry("x", "INT32", [2**63 - 1, 0], [])),
        None,
        InvalidArgument,
        "shape [9223372036854775807, 0] of input 'x' is too large",
    ),
    (
        "zero-elements-huge-shape-binary",
        *with_binary(json_body(tensor_entry("x", "INT32", [2**63 - 1, 0], binary_data_size=0))),
        InvalidArgument,
        "shape [9223372036854775807, 0] of input 'x' is too large",
    ),
    (
        "zero-elements-huge-shape-bytes",
        json_body(tensor_entry("x", "BYTES", [0, 2**62], [])),
        None,
        InvalidArgument,
        "shape [0, 4611686018427387904] of input 'x' is too large",
    ),
    (
        "zero-elements-huge-shape-bytes-binary",
        *with_binary(json_body(tensor_entry("x", "BYTES", [2**63 - 1, 0], binary_data_size=0))),
        InvalidArgument,
        "of input 'x' is too large",
    ),
    (
        "no-data-field",
        json_body(tensor_entry("x", "FP32", [1])),
        None,
        InvalidArgument,
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But no field is set",
    ),
    (
        "data-and-binary",
        *with_binary(
            json_body(tensor_entry("x", "FP32", [1], [1.0], binary_data_size=4)), fp32_bytes(1)
        ),
        InvalidArgument,
        "But set 'data' 'binary_data_size'",
    ),
    (
        "too-few-elements",
        json_body(tensor_entry("x", "INT32", [2, 2], [1, 2, 3])),
        None,
        InvalidArgument,
        "Unable to parse 'data': Shape does not match true shape of 'data' field: unexpected "
        "number of elements for input 'x': shape [2, 2] needs 4, 'data' holds 3",
    ),
    (
        "too-many-elements",
        json_body(tensor_entry("x", "BYTES", [1], ["a", "b"])),
        None,
        InvalidArgument,
        "unexpected number of elements for input 'x': shape [1] needs 1, 'data' holds 2",
    ),
    (
        "data-not-list",
        json_body(tensor_entry("x", "INT32", [1], 5)),
        None,
        InvalidArgument,
        "Unable to parse 'data' for input 'x': expected a JSON array",
    ),
    (
        "fp16-via-json",
        json_body(tensor_entry("x", "FP16", [1], [1.0])),
        None,
        InvalidArgument,
        "receiving FP16 data via JSON is not supported. "
        "Please use the binary data format for input x",
    ),
    (
        "bf16-via-json",
        json_body(tensor_entry("x", "BF16", [1], [1.0])),
        None,
        InvalidArgument,
        "receiving BF16 data via JSON is not supported",
    ),
    (
        "float-for-int",
        json_body(tensor_entry("x", "INT32", [2], [1, 2.5])),
        None,
        InvalidArgument,
        "INT32 expects JSON integers",
    ),
    (
        "bool-for-int",
        json_body(tensor_entry("x", "INT32", [2], [True, False])),
        None,
        InvalidArgument,
        "INT32 expects JSON integers",
    ),
    (
        "bool-mixed-into-ints",
        json_body(tensor_entry("x", "INT64", [2], [1, True])),
        None,
        InvalidArgument,
        "INT64 expects JSON integers",
    ),
    (
        "bool-mixed-into-nested-floats",
        json_body(tensor_entry("x", "FP32", [2, 2], [[1.5, 2], [False, 3]])),
        None,
        InvalidArgument,
        "FP32 expects JSON numbers",
    ),
    (
        "int-for-bool",
        json_body(tensor_entry("x", "BOOL", [2], [1, 0])),
        None,
        InvalidArgument,
        "BOOL expects JSON booleans",
    ),
    (
        "string-for-number",
        json_body(tensor_entry("x", "FP32", [1], ["1.0"])),
        None,
        InvalidArgument,
        "FP32 expects JSON numbers",
    ),
    (
        "null-for-number",
        json_body(tensor_entry("x", "FP64", [2], [1.0, None])),
        None,
        InvalidArgument,
        "FP64 expects JSON numbers",
    ),
    (
        "number-for-bytes",
        json_body(tensor_entry("x", "BYTES", [2], ["a", 1])),
        None,
        InvalidArgument,
        "BYTES expects JSON strings",
    ),
    (
        "int-out-of-range",
        json_body(tensor_entry("x", "INT8", [1], [128])),
        None,
        InvalidArgument,
        "value 128 is out of range for INT8",
    ),
    (
        "int64-overflow-mixed",
        json_body(tensor_entry("x", "INT64", [2], [1, 2**63])),
        None,
        InvalidArgument,
        "a value is out of range for INT64",
    ),
    (
        "float-mixed-with-big-uint",
        json_body(tensor_entry("x", "UINT64", [2], [1.5, 2**63])),
        None,
        InvalidArgument,
        "UINT64 expects JSON integers",
    ),
    (
        "negative-unsigned",
        json_body(tensor_entry("x", "UINT32", [1], [-1])),
        None,
        InvalidArgument,
        "value -1 is out of range for UINT32",
    ),
    (
        "binary-size-without-header",
        json_body(tensor_entry("x", "FP32", [1], binary_data_size=4)),
        None,
        InvalidArgument,
        "must specify valid 'Inference-Header-Content-Length' in request header and "
        "'binary_data_size' when passing inputs in binary data format",
    ),
    (
        "binary-bytes-without-header",
        json_body(tensor_entry("x", "FP32", [1], binary_data_size=4)) + fp32_bytes(1),
        None,
        InvalidArgument,
        "failed to parse the request JSON buffer",
    ),
    (
        "negative-header-length",
        json_body(tensor_entry("x", "INT32", [1], [1])),
        -1,
        InvalidArgument,
        "inference header size should be in range (0, ",
    ),
    (
        "header-length-beyond-body",
        json_body(tensor_entry("x", "INT32", [1], [1])),
        99999999999,
        InvalidArgument,
        "got: 99999999999",
    ),
    (
        "too-few-binary-bytes",
        _TWO_BINARY + fp32_bytes(1, 2),
        len(_TWO_BINARY),
        InvalidArgument,
        "unexpected size for input 'b', expecting 4 additional bytes for model 'm'",
    ),
    (
        "too-many-binary-bytes",
        _TWO_BINARY + fp32_bytes(1, 2, 3, 4),
        len(_TWO_BINARY),
        InvalidArgument,
        "unexpected additional input data for model 'm'",
    ),
    (
        "binary-size-vs-shape",
        *with_binary(json_body(tensor_entry("x", "FP32", [8], binary_data_size=40)), b"\0" * 40),
        InvalidArgument,
        "input byte size mismatch for input 'x' for model 'm'. Expected 32, got 40",
    ),
    (
        "binary-size-not-uint",
        *with_binary(json_body(tensor_entry("x", "FP32", [1], binary_data_size=-4))),
        InvalidArgument,
        "Unable to parse 'binary_data_size' for input 'x'",
    ),
    (
        "truncated-bytes-prefix",
        *with_binary(
            json_body(tensor_entry("x", "BYTES", [2], binary_data_size=11)),
            bytes_blob(b"abcd") + b"\x01\x00\x00",
        ),
        InvalidArgument,
        "incomplete string length indicator for inference input 'x'",
    ),
    (
        "bytes-length-overruns",
        *with_binary(
            json_body(tensor_entry("x", "BYTES", [1], binary_data_size=6)),
            struct.pack("<I", 9) + b"ab",
        ),
        InvalidArgument,
        "incomplete string data for inference input 'x'",
    ),
    (
        "bytes-count-beyond-segment",
        *with_binary(
            json_body(tensor_entry("x", "BYTES", [2**40], binary_data_size=8)), bytes_blob(b"", b"")
        ),
        InvalidArgument,
        "elements need at least 4398046511104 bytes",
    ),
    (
        "triton-parameter",
        json_body(tensor_entry("x", "INT32", [1], [1]), parameters={"triton_x": 1}),
        None,
        InvalidArgument,
        "parameter keys starting with 'triton_' are reserved for Triton usage",
    ),
    (
        "custom-parameter-list",
        json_body(tensor_entry("x", "INT32", [1], [1]), parameters={"k": [1]}),
        None,
        InvalidArgument,
        "parameter 'k' has invalid type",
    ),
    (
        "priority-negative",
        json_body(tensor_entry("x", "INT32", [1], [1]), parameters={"priority": -1}),
        None,
        InvalidArgument,
        "Unable to parse 'priority'",
    ),
    (
        "timeout-string",
        json_body(tensor_entry("x", "INT32", [1], [1]), parameters={"timeout": "5"}),
        None,
        InvalidArgument,
        "Unable to parse 'timeout'",
    ),
    (
        "binary-output-not-bool",
        json_body(tensor_entry("x", "INT32", [1], [1]), parameters={"binary_data_output": 1}),
        None,
        InvalidArgument,
        "Unable to parse 'binary_data_output'",
    ),
    (
        "sequence-start-not-bool",
        json_body(tensor_entry("x", "INT32", [1], [1]), parameters={"sequence_start": "yes"}),
        None,
        InvalidArgument,
        "Unable to parse 'sequence_start'",
    ),
    (
        "parameters-not-object",
        json_body(tensor_entry("x", "INT32", [1], [1]), parameters=[1]),
        None,
        InvalidArgument,
        "Unable to parse 'parameters'",
    ),
    (
        "id-not-string",
        json_body(tensor_entry("x", "INT32", [1], [1]), id=5),
        None,
        InvalidArgument,
        "Unable to parse 'id'",
    ),
    (
        "outputs-not-list",
        json_body(tensor_entry("x", "INT32", [1], [1]), outputs={"name": "y"}),
        None,
        InvalidArgument,
        "Unable to parse 'outputs'",
    ),
    (
        "output-without-name",
        json_body(tensor_entry("x", "INT32", [1], [1]), outputs=[{}]),
        None,
        InvalidArgument,
        "Unable to parse 'name' of output 0",
    ),
    (
        "duplicate-output",
        json_body(tensor_entry("x", "INT32", [1], [1]), outputs=[{"name": "y"}, {"name": "y"}]),
        None,
        InvalidArgument,
        "output 'y' already exists in request",
    ),
    (
        "output-binary-not-bool",
        json_body(
            tensor_entry("x", "INT32", [1], [1]),
            outputs=[{"name": "y", "parameters": {"binary_data": "no"}}],
        ),
        None,
        InvalidArgument,
        "Unable to parse 'binary_data' for output 'y'",
    ),
    (
        "output-classification-negative",
        json_body(
            tensor_entry("x", "INT32", [1], [1]),
            outputs=[{"name": "y", "parameters": {"classification": -2}}],
        ),
        None,
        InvalidArgument,
        "Unable to set 'classification' for output 'y'",
    ),
    (
        "output-shared-memory-and-classification",
        json_body(
            tensor_entry("x", "INT32", [1], [1]),
            outputs=[
                {"name": "y", "parameters": {"shared_memory_region": "r", "classification": 2}}
            ],
        ),
        None,
        InvalidArgument,
        "Output can't set both 'shared_memory_region' and 'classification'",
    ),
    (
        "depth-120-fails",
        nested_json(120),
        None,
        InvalidArgument,
        "JSON nesting depth exceeds maximum allowed limit (100)",
    ),
]


@pytest.mark.parametrize(
    "body,header_length,error,fragment",
    [c[1:] for c in ERROR_CASES],
    ids=[c[0] for c in ERROR_CASES],
)
def test_invalid_request(
    body: bytes, header_length: int | None, error: type[ServerError], fragment: str
) -> None:
    with pytest.raises(error) as caught:
        decode_body(body, header_length)
    assert fragment in caught.value.message
    assert caught.value.http_status() == 400


def test_header_length_zero_is_not_a_json_request() -> None:
    with pytest.raises(ValueError, match="decode_raw_request"):
        decode_body(b"\x00\x00\x80\x3f", 0)


# --------------------------------------------------------------------------- request fields


def test_request_fields_are_kept() -> None:
    body = json_body(
        tensor_entry("x", "INT32", [1], [1], custom="c"),
        id="req-7",
        parameters={
            "binary_data_output": True,
            "priority": 2,
            "timeout": 1000,
            "sequence_id": "s",
            "sequence_start": True,
            "headers": "h",
            "temperature": 0.5,
        },
        outputs=[
            {"name": "a", "parameters": {"binary_data": False}},
            {"name": "b", "parameters": {"classification": 3, "extra": 1}},
            {"name": "c"},
        ],
    )
    request = decode_body(body)
    assert request.model_name == MODEL and request.model_version == "1"
    assert request.id == "req-7"
    assert request.parameters == {
        "binary_data_output": True,
        "priority": 2,
        "timeout": 1000,
        "sequence_id": "s",
        "sequence_start": True,
        "headers": "h",
        "temperature": 0.5,
    }
    assert request.inputs[0].parameters == {"custom": "c"}
    assert request.outputs == [
        RequestedOutput("a", binary=False, classification=0, parameters={"binary_data": False}),
        RequestedOutput(
            "b", binary=None, classification=3, parameters={"classification": 3, "extra": 1}
        ),
        RequestedOutput("c"),
    ]


@pytest.mark.parametrize("outputs", [None, []])
def test_absent_or_empty_outputs_mean_every_output(outputs: list | None) -> None:
    fields = {} if outputs is None else {"outputs": outputs}
    assert decode_body(json_body(tensor_entry("x", "INT32", [1], [1]), **fields)).outputs is None


def test_binary_input_parameters_drop_the_wire_size() -> None:
    header = json_body(tensor_entry("x", "FP32", [1], binary_data_size=4, note="n"))
    request = decode_body(header + fp32_bytes(1), len(header))
    assert request.inputs[0].parameters == {"note": "n"}
