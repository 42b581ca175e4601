"""Golden wire cases for REST request decoding (protocol/rest/decode.py, rest_inputs.py): what the
HTTP body says -> what the core sees, and which bodies are refused with which message."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from rest_cases import MODEL, _bytes_blob, _decode, _fp32, _input, _json, _nested, _with_binary

from protocol.errors import InvalidArgument, ServerError
from protocol.types import RequestedOutput

# --------------------------------------------------------------------------- valid requests

_BYTES_BIN = _bytes_blob(b"hello", b"", b"\xff\x00")
_FP16 = np.array([0.5, -2.0], dtype=np.float16)
_BF16_BITS = np.array([0x3F80, 0xC000], dtype=np.uint16)  # 1.0, -2.0

# (case id, body, header length, {input name: expected array (dtype and shape included)})
VALID_CASES = [
    (
        "bool",
        _json(_input("x", "BOOL", [3], [True, False, True])),
        None,
        {"x": np.array([True, False, True])},
    ),
    (
        "uint8",
        _json(_input("x", "UINT8", [2], [0, 255])),
        None,
        {"x": np.array([0, 255], np.uint8)},
    ),
    (
        "uint16",
        _json(_input("x", "UINT16", [2], [0, 65535])),
        None,
        {"x": np.array([0, 65535], np.uint16)},
    ),
    (
        "uint32",
        _json(_input("x", "UINT32", [1], [4294967295])),
        None,
        {"x": np.array([4294967295], np.uint32)},
    ),
    (
        "uint64",
        _json(_input("x", "UINT64", [2], [0, 18446744073709551615])),
        None,
        {"x": np.array([0, 18446744073709551615], np.uint64)},
    ),
    (
        "int8",
        _json(_input("x", "INT8", [2], [-128, 127])),
        None,
        {"x": np.array([-128, 127], np.int8)},
    ),
    (
        "int16",
        _json(_input("x", "INT16", [2], [-32768, 32767])),
        None,
        {"x": np.array([-32768, 32767], np.int16)},
    ),
    (
        "int32",
        _json(_input("x", "INT32", [2, 2], [1, 2, 3, 4])),
        None,
        {"x": np.array([[1, 2], [3, 4]], np.int32)},
    ),
    (
        "int64",
        _json(_input("x", "INT64", [1], [-9223372036854775808])),
        None,
        {"x": np.array([-9223372036854775808], np.int64)},
    ),
    (
        "fp32",
        _json(_input("x", "FP32", [3], [1.5, -2, 0])),
        None,
        {"x": np.array([1.5, -2.0, 0.0], np.float32)},
    ),
    (
        "fp64",
        _json(_input("x", "FP64", [2], [0.1, 1e300])),
        None,
        {"x": np.array([0.1, 1e300], np.float64)},
    ),
    (
        "bytes-json",
        _json(_input("x", "BYTES", [2], ["héllo", ""])),
        None,
        {"x": np.array(["héllo".encode(), b""], dtype=object)},
    ),
    (
        "nested-data",
        _json(_input("x", "INT32", [2, 2], [[1, 2], [3, 4]])),
        None,
        {"x": np.array([[1, 2], [3, 4]], np.int32)},
    ),
    (
        "nested-data-flat-shape",
        _json(_input("x", "FP32", [4], [[1, 2], [3, 4]])),
        None,
        {"x": np.array([1, 2, 3, 4], np.float32)},
    ),
    (
        "ragged-nesting-matching-count",
        _json(_input("x", "INT64", [2, 2], [[1, 2, 3], [4]])),
        None,
        {"x": np.array([[1, 2], [3, 4]], np.int64)},
    ),
    (
        "nested-bytes",
        _json(_input("x", "BYTES", [2, 1], [["a"], ["b"]])),
        None,
        {"x": np.array([[b"a"], [b"b"]], dtype=object)},
    ),
    (
        "zero-elements",
        _json(_input("x", "FP32", [0, 3], [])),
        None,
        {"x": np.zeros((0, 3), np.float32)},
    ),
    ("scalar-shape", _json(_input("x", "INT32", [], [7])), None, {"x": np.array(7, np.int32)}),
    (
        "binary-fp32",
        *_with_binary(_json(_input("x", "FP32", [2, 2], binary_data_size=16)), _fp32(1, 2, 3, 4)),
        {"x": np.array([[1, 2], [3, 4]], np.float32)},
    ),
    (
        "binary-bytes",
        *_with_binary(
            _json(_input("x", "BYTES", [3], binary_data_size=len(_BYTES_BIN))), _BYTES_BIN
        ),
        {"x": np.array([b"hello", b"", b"\xff\x00"], dtype=object)},
    ),
    (
        "binary-fp16",
        *_with_binary(_json(_input("x", "FP16", [2], binary_data_size=4)), _FP16.tobytes()),
        {"x": _FP16},
    ),
    (
        "binary-bf16-as-bits",
        *_with_binary(_json(_input("x", "BF16", [2], binary_data_size=4)), _BF16_BITS.tobytes()),
        {"x": _BF16_BITS},
    ),
    (
        "binary-zero-size",
        *_with_binary(_json(_input("x", "INT32", [0], binary_data_size=0))),
        {"x": np.zeros(0, np.int32)},
    ),
    (
        "mixed-json-and-binary",
        *_with_binary(
            _json(
                _input("a", "FP32", [1], binary_data_size=4),
                _input("b", "INT32", [2], [5, 6]),
                _input("c", "INT8", [3], binary_data_size=3),
            ),
            _fp32(9.5),
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
        *_with_binary(_json(_input("x", "INT32", [1], [3]))),
        {"x": np.array([3], np.int32)},
    ),
    ("depth-50-passes", _nested(50), None, {"x": np.array([1], np.int32)}),
]


@pytest.mark.parametrize(
    "body,header_length,expected", [c[1:] for c in VALID_CASES], ids=[c[0] for c in VALID_CASES]
)
def test_valid_request(body: bytes, header_length: int | None, expected: dict) -> None:
    request = _decode(body, header_length)
    assert [t.name for t in request.inputs] == list(expected)
    for tensor in request.inputs:
        want = expected[tensor.name]
        assert tensor.shape == want.shape
        assert tensor.data.shape == want.shape
        assert tensor.data.dtype == want.dtype
        assert tensor.data.tolist() == want.tolist()


# --------------------------------------------------------------------------- invalid requests

_SHAPE_OVERFLOW = _json(_input("x", "FP32", [16, 2**60 + 2], binary_data_size=4))
_TWO_BINARY = _json(
    _input("a", "FP32", [2], binary_data_size=8), _input("b", "FP32", [1], binary_data_size=4)
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
        _json({"datatype": "FP32", "shape": [1], "data": [1]}),
        None,
        InvalidArgument,
        "Unable to parse 'name' of input 0",
    ),
    (
        "duplicate-input",
        _json(_input("x", "FP32", [1], [1]), _input("x", "FP32", [1], [2])),
        None,
        InvalidArgument,
        "input 'x' already exists in request",
    ),
    (
        "unknown-datatype",
        _json(_input("x", "FP31", [1], [1])),
        None,
        InvalidArgument,
        "invalid datatype 'FP31' for input 'x'",
    ),
    (
        "datatype-not-string",
        _json(_input("x", 3, [1], [1])),
        None,
        InvalidArgument,
        "Unable to parse 'datatype' for input 'x'",
    ),
    (
        "shape-missing",
        _json({"name": "x", "datatype": "FP32", "data": [1]}),
        None,
        InvalidArgument,
        "Unable to parse 'shape' for input 'x'",
    ),
    (
        "negative-dim",
        _json(_input("x", "FP32", [-5], [1])),
        None,
        InvalidArgument,
        "Unable to parse 'shape' for input 'x': dimension 0 must be a non-negative integer",
    ),
    (
        "bool-dim",
        _json(_input("x", "FP32", [True], [1])),
        None,
        InvalidArgument,
        "dimension 0 must be a non-negative integer, got True",
    ),
    (
        "float-dim",
        _json(_input("x", "FP32", [1, 2.0], [1, 2])),
        None,
        InvalidArgument,
        "dimension 1 must be a non-negative integer",
    ),
    (
        "dim-beyond-int64",
        _json(_input("x", "FP32", [2**63], [1])),
        None,
        InvalidArgument,
        "dimension 0 must be a non-negative integer",
    ),
    (
        "shape-overflow",
        _SHAPE_OVERFLOW + _fp32(1),
        len(_SHAPE_OVERFLOW),
        InvalidArgument,
        "byte size overflows int64",
    ),
    (
        "too-many-dims",
        _json(_input("x", "FP32", [1] * 65, [1])),
        None,
        InvalidArgument,
        "65 dimensions exceed the maximum of 64",
    ),
    # zero elements, yet numpy cannot hold the shape (was a 500 "array is too big")
    (
        "zero-elements-huge-shape-json",
        _json(_input("x", "INT32", [2**63 - 1, 0], [])),
        None,
        InvalidArgument,
        "shape [9223372036854775807, 0] of input 'x' is too large",
    ),
    (
        "zero-elements-huge-shape-binary",
        *_with_binary(_json(_input("x", "INT32", [2**63 - 1, 0], binary_data_size=0))),
        InvalidArgument,
        "shape [9223372036854775807, 0] of input 'x' is too large",
    ),
    (
        "zero-elements-huge-shape-bytes",
        _json(_input("x", "BYTES", [0, 2**62], [])),
        None,
        InvalidArgument,
        "shape [0, 4611686018427387904] of input 'x' is too large",
    ),
    (
        "zero-elements-huge-shape-bytes-binary",
        *_with_binary(_json(_input("x", "BYTES", [2**63 - 1, 0], binary_data_size=0))),
        InvalidArgument,
        "of input 'x' is too large",
    ),
    (
        "no-data-field",
        _json(_input("x", "FP32", [1])),
        None,
        InvalidArgument,
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But no field is set",
    ),
    (
        "data-and-binary",
        *_with_binary(_json(_input("x", "FP32", [1], [1.0], binary_data_size=4)), _fp32(1)),
        InvalidArgument,
        "But set 'data' 'binary_data_size'",
    ),
    (
        "too-few-elements",
        _json(_input("x", "INT32", [2, 2], [1, 2, 3])),
        None,
        InvalidArgument,
        "Unable to parse 'data': Shape does not match true shape of 'data' field: unexpected "
        "number of elements for input 'x': shape [2, 2] needs 4, 'data' holds 3",
    ),
    (
        "too-many-elements",
        _json(_input("x", "BYTES", [1], ["a", "b"])),
        None,
        InvalidArgument,
        "unexpected number of elements for input 'x': shape [1] needs 1, 'data' holds 2",
    ),
    (
        "data-not-list",
        _json(_input("x", "INT32", [1], 5)),
        None,
        InvalidArgument,
        "Unable to parse 'data' for input 'x': expected a JSON array",
    ),
    (
        "fp16-via-json",
        _json(_input("x", "FP16", [1], [1.0])),
        None,
        InvalidArgument,
        "receiving FP16 data via JSON is not supported. "
        "Please use the binary data format for input x",
    ),
    (
        "bf16-via-json",
        _json(_input("x", "BF16", [1], [1.0])),
        None,
        InvalidArgument,
        "receiving BF16 data via JSON is not supported",
    ),
    (
        "float-for-int",
        _json(_input("x", "INT32", [2], [1, 2.5])),
        None,
        InvalidArgument,
        "INT32 expects JSON integers",
    ),
    (
        "bool-for-int",
        _json(_input("x", "INT32", [2], [True, False])),
        None,
        InvalidArgument,
        "INT32 expects JSON integers",
    ),
    (
        "bool-mixed-into-ints",
        _json(_input("x", "INT64", [2], [1, True])),
        None,
        InvalidArgument,
        "INT64 expects JSON integers",
    ),
    (
        "bool-mixed-into-nested-floats",
        _json(_input("x", "FP32", [2, 2], [[1.5, 2], [False, 3]])),
        None,
        InvalidArgument,
        "FP32 expects JSON numbers",
    ),
    (
        "int-for-bool",
        _json(_input("x", "BOOL", [2], [1, 0])),
        None,
        InvalidArgument,
        "BOOL expects JSON booleans",
    ),
    (
        "string-for-number",
        _json(_input("x", "FP32", [1], ["1.0"])),
        None,
        InvalidArgument,
        "FP32 expects JSON numbers",
    ),
    (
        "null-for-number",
        _json(_input("x", "FP64", [2], [1.0, None])),
        None,
        InvalidArgument,
        "FP64 expects JSON numbers",
    ),
    (
        "number-for-bytes",
        _json(_input("x", "BYTES", [2], ["a", 1])),
        None,
        InvalidArgument,
        "BYTES expects JSON strings",
    ),
    (
        "int-out-of-range",
        _json(_input("x", "INT8", [1], [128])),
        None,
        InvalidArgument,
        "value 128 is out of range for INT8",
    ),
    (
        "int64-overflow-mixed",
        _json(_input("x", "INT64", [2], [1, 2**63])),
        None,
        InvalidArgument,
        "a value is out of range for INT64",
    ),
    (
        "float-mixed-with-big-uint",
        _json(_input("x", "UINT64", [2], [1.5, 2**63])),
        None,
        InvalidArgument,
        "UINT64 expects JSON integers",
    ),
    (
        "negative-unsigned",
        _json(_input("x", "UINT32", [1], [-1])),
        None,
        InvalidArgument,
        "value -1 is out of range for UINT32",
    ),
    (
        "binary-size-without-header",
        _json(_input("x", "FP32", [1], binary_data_size=4)),
        None,
        InvalidArgument,
        "must specify valid 'Inference-Header-Content-Length' in request header and "
        "'binary_data_size' when passing inputs in binary data format",
    ),
    (
        "binary-bytes-without-header",
        _json(_input("x", "FP32", [1], binary_data_size=4)) + _fp32(1),
        None,
        InvalidArgument,
        "failed to parse the request JSON buffer",
    ),
    (
        "negative-header-length",
        _json(_input("x", "INT32", [1], [1])),
        -1,
        InvalidArgument,
        "inference header size should be in range (0, ",
    ),
    (
        "header-length-beyond-body",
        _json(_input("x", "INT32", [1], [1])),
        99999999999,
        InvalidArgument,
        "got: 99999999999",
    ),
    (
        "too-few-binary-bytes",
        _TWO_BINARY + _fp32(1, 2),
        len(_TWO_BINARY),
        InvalidArgument,
        "unexpected size for input 'b', expecting 4 additional bytes for model 'm'",
    ),
    (
        "too-many-binary-bytes",
        _TWO_BINARY + _fp32(1, 2, 3, 4),
        len(_TWO_BINARY),
        InvalidArgument,
        "unexpected additional input data for model 'm'",
    ),
    (
        "binary-size-vs-shape",
        *_with_binary(_json(_input("x", "FP32", [8], binary_data_size=40)), b"\0" * 40),
        InvalidArgument,
        "input byte size mismatch for input 'x' for model 'm'. Expected 32, got 40",
    ),
    (
        "binary-size-not-uint",
        *_with_binary(_json(_input("x", "FP32", [1], binary_data_size=-4))),
        InvalidArgument,
        "Unable to parse 'binary_data_size' for input 'x'",
    ),
    (
        "truncated-bytes-prefix",
        *_with_binary(
            _json(_input("x", "BYTES", [2], binary_data_size=11)),
            _bytes_blob(b"abcd") + b"\x01\x00\x00",
        ),
        InvalidArgument,
        "incomplete string length indicator for inference input 'x'",
    ),
    (
        "bytes-length-overruns",
        *_with_binary(
            _json(_input("x", "BYTES", [1], binary_data_size=6)), struct.pack("<I", 9) + b"ab"
        ),
        InvalidArgument,
        "incomplete string data for inference input 'x'",
    ),
    (
        "bytes-count-beyond-segment",
        *_with_binary(
            _json(_input("x", "BYTES", [2**40], binary_data_size=8)), _bytes_blob(b"", b"")
        ),
        InvalidArgument,
        "elements need at least 4398046511104 bytes",
    ),
    (
        "triton-parameter",
        _json(_input("x", "INT32", [1], [1]), parameters={"triton_x": 1}),
        None,
        InvalidArgument,
        "parameter keys starting with 'triton_' are reserved for Triton usage",
    ),
    (
        "custom-parameter-list",
        _json(_input("x", "INT32", [1], [1]), parameters={"k": [1]}),
        None,
        InvalidArgument,
        "parameter 'k' has invalid type",
    ),
    (
        "priority-negative",
        _json(_input("x", "INT32", [1], [1]), parameters={"priority": -1}),
        None,
        InvalidArgument,
        "Unable to parse 'priority'",
    ),
    (
        "timeout-string",
        _json(_input("x", "INT32", [1], [1]), parameters={"timeout": "5"}),
        None,
        InvalidArgument,
        "Unable to parse 'timeout'",
    ),
    (
        "binary-output-not-bool",
        _json(_input("x", "INT32", [1], [1]), parameters={"binary_data_output": 1}),
        None,
        InvalidArgument,
        "Unable to parse 'binary_data_output'",
    ),
    (
        "sequence-start-not-bool",
        _json(_input("x", "INT32", [1], [1]), parameters={"sequence_start": "yes"}),
        None,
        InvalidArgument,
        "Unable to parse 'sequence_start'",
    ),
    (
        "parameters-not-object",
        _json(_input("x", "INT32", [1], [1]), parameters=[1]),
        None,
        InvalidArgument,
        "Unable to parse 'parameters'",
    ),
    (
        "id-not-string",
        _json(_input("x", "INT32", [1], [1]), id=5),
        None,
        InvalidArgument,
        "Unable to parse 'id'",
    ),
    (
        "outputs-not-list",
        _json(_input("x", "INT32", [1], [1]), outputs={"name": "y"}),
        None,
        InvalidArgument,
        "Unable to parse 'outputs'",
    ),
    (
        "output-without-name",
        _json(_input("x", "INT32", [1], [1]), outputs=[{}]),
        None,
        InvalidArgument,
        "Unable to parse 'name' of output 0",
    ),
    (
        "duplicate-output",
        _json(_input("x", "INT32", [1], [1]), outputs=[{"name": "y"}, {"name": "y"}]),
        None,
        InvalidArgument,
        "output 'y' already exists in request",
    ),
    (
        "output-binary-not-bool",
        _json(
            _input("x", "INT32", [1], [1]),
            outputs=[{"name": "y", "parameters": {"binary_data": "no"}}],
        ),
        None,
        InvalidArgument,
        "Unable to parse 'binary_data' for output 'y'",
    ),
    (
        "output-classification-negative",
        _json(
            _input("x", "INT32", [1], [1]),
            outputs=[{"name": "y", "parameters": {"classification": -2}}],
        ),
        None,
        InvalidArgument,
        "Unable to set 'classification' for output 'y'",
    ),
    (
        "output-shared-memory-and-classification",
        _json(
            _input("x", "INT32", [1], [1]),
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
        _nested(120),
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
        _decode(body, header_length)
    assert fragment in caught.value.message
    assert caught.value.http_status() == 400


def test_header_length_zero_is_not_a_json_request() -> None:
    with pytest.raises(ValueError, match="decode_raw_request"):
        _decode(b"\x00\x00\x80\x3f", 0)


# --------------------------------------------------------------------------- request fields


def test_request_fields_are_kept() -> None:
    body = _json(
        _input("x", "INT32", [1], [1], custom="c"),
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
    request = _decode(body)
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
    assert _decode(_json(_input("x", "INT32", [1], [1]), **fields)).outputs is None


def test_binary_input_parameters_drop_the_wire_size() -> None:
    header = _json(_input("x", "FP32", [1], binary_data_size=4, note="n"))
    request = _decode(header + _fp32(1), len(header))
    assert request.inputs[0].parameters == {"note": "n"}
