"""Golden wire cases for protocol/rest_codec.py: what the HTTP body says -> what the core sees."""
from __future__ import annotations

import struct
import time
import tracemalloc
from typing import Any, Optional

import numpy as np
import orjson
import pytest

from protocol.errors import InternalError, InvalidArgument, ServerError, TooLarge
from protocol.rest_codec import (
    check_header_length,
    check_json_depth,
    check_raw_input_count,
    raw_input_count_message,
    decode_infer_request,
    decode_raw_request,
    encode_error,
    encode_infer_response,
    parse_header_length,
)
from protocol.types import InferResponse, RequestedOutput, Tensor

MODEL = "m"


# --------------------------------------------------------------------------- builders

def _input(name: str, datatype: str, shape: list, data: Any = None, **parameters: Any) -> dict:
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if data is not None:
        entry["data"] = data
    if parameters:
        entry["parameters"] = parameters
    return entry


def _json(*inputs: dict, **fields: Any) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **fields})


def _with_binary(header: bytes, *blobs: bytes) -> tuple[bytes, int]:
    return header + b"".join(blobs), len(header)


def _bytes_blob(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _nested(depth: int) -> bytes:
    data = b"[" * depth + b"1" + b"]" * depth
    return b'{"inputs":[{"name":"x","datatype":"INT32","shape":[1],"data":' + data + b"}]}"


def _fp32(*values: float) -> bytes:
    return np.array(values, dtype=np.float32).tobytes()


def _decode(body: bytes, header_length: Optional[int] = None, **kwargs: Any):
    return decode_infer_request(body, header_length, MODEL, "1", **kwargs)


# --------------------------------------------------------------------------- valid requests

_BYTES_BIN = _bytes_blob(b"hello", b"", b"\xff\x00")
_FP16 = np.array([0.5, -2.0], dtype=np.float16)
_BF16_BITS = np.array([0x3F80, 0xC000], dtype=np.uint16)  # 1.0, -2.0

# (case id, body, header length, {input name: expected array (dtype and shape included)})
VALID_CASES = [
    ("bool", _json(_input("x", "BOOL", [3], [True, False, True])), None,
     {"x": np.array([True, False, True])}),
    ("uint8", _json(_input("x", "UINT8", [2], [0, 255])), None, {"x": np.array([0, 255], np.uint8)}),
    ("uint16", _json(_input("x", "UINT16", [2], [0, 65535])), None,
     {"x": np.array([0, 65535], np.uint16)}),
    ("uint32", _json(_input("x", "UINT32", [1], [4294967295])), None,
     {"x": np.array([4294967295], np.uint32)}),
    ("uint64", _json(_input("x", "UINT64", [2], [0, 18446744073709551615])), None,
     {"x": np.array([0, 18446744073709551615], np.uint64)}),
    ("int8", _json(_input("x", "INT8", [2], [-128, 127])), None, {"x": np.array([-128, 127], np.int8)}),
    ("int16", _json(_input("x", "INT16", [2], [-32768, 32767])), None,
     {"x": np.array([-32768, 32767], np.int16)}),
    ("int32", _json(_input("x", "INT32", [2, 2], [1, 2, 3, 4])), None,
     {"x": np.array([[1, 2], [3, 4]], np.int32)}),
    ("int64", _json(_input("x", "INT64", [1], [-9223372036854775808])), None,
     {"x": np.array([-9223372036854775808], np.int64)}),
    ("fp32", _json(_input("x", "FP32", [3], [1.5, -2, 0])), None,
     {"x": np.array([1.5, -2.0, 0.0], np.float32)}),
    ("fp64", _json(_input("x", "FP64", [2], [0.1, 1e300])), None,
     {"x": np.array([0.1, 1e300], np.float64)}),
    ("bytes-json", _json(_input("x", "BYTES", [2], ["héllo", ""])), None,
     {"x": np.array(["héllo".encode(), b""], dtype=object)}),
    ("nested-data", _json(_input("x", "INT32", [2, 2], [[1, 2], [3, 4]])), None,
     {"x": np.array([[1, 2], [3, 4]], np.int32)}),
    ("nested-data-flat-shape", _json(_input("x", "FP32", [4], [[1, 2], [3, 4]])), None,
     {"x": np.array([1, 2, 3, 4], np.float32)}),
    ("ragged-nesting-matching-count", _json(_input("x", "INT64", [2, 2], [[1, 2, 3], [4]])), None,
     {"x": np.array([[1, 2], [3, 4]], np.int64)}),
    ("nested-bytes", _json(_input("x", "BYTES", [2, 1], [["a"], ["b"]])), None,
     {"x": np.array([[b"a"], [b"b"]], dtype=object)}),
    ("zero-elements", _json(_input("x", "FP32", [0, 3], [])), None,
     {"x": np.zeros((0, 3), np.float32)}),
    ("scalar-shape", _json(_input("x", "INT32", [], [7])), None, {"x": np.array(7, np.int32)}),
    ("binary-fp32", *_with_binary(_json(_input("x", "FP32", [2, 2], binary_data_size=16)),
                                  _fp32(1, 2, 3, 4)),
     {"x": np.array([[1, 2], [3, 4]], np.float32)}),
    ("binary-bytes", *_with_binary(_json(_input("x", "BYTES", [3], binary_data_size=len(_BYTES_BIN))),
                                   _BYTES_BIN),
     {"x": np.array([b"hello", b"", b"\xff\x00"], dtype=object)}),
    ("binary-fp16", *_with_binary(_json(_input("x", "FP16", [2], binary_data_size=4)), _FP16.tobytes()),
     {"x": _FP16}),
    ("binary-bf16-as-bits", *_with_binary(_json(_input("x", "BF16", [2], binary_data_size=4)),
                                          _BF16_BITS.tobytes()),
     {"x": _BF16_BITS}),
    ("binary-zero-size", *_with_binary(_json(_input("x", "INT32", [0], binary_data_size=0))),
     {"x": np.zeros(0, np.int32)}),
    ("mixed-json-and-binary", *_with_binary(
        _json(_input("a", "FP32", [1], binary_data_size=4), _input("b", "INT32", [2], [5, 6]),
              _input("c", "INT8", [3], binary_data_size=3)),
        _fp32(9.5), bytes([1, 2, 255])),
     {"a": np.array([9.5], np.float32), "b": np.array([5, 6], np.int32),
      "c": np.array([1, 2, -1], np.int8)}),
    ("header-length-equals-body", *_with_binary(_json(_input("x", "INT32", [1], [3]))),
     {"x": np.array([3], np.int32)}),
    ("depth-50-passes", _nested(50), None, {"x": np.array([1], np.int32)}),
]


@pytest.mark.parametrize("body,header_length,expected", [c[1:] for c in VALID_CASES],
                         ids=[c[0] for c in VALID_CASES])
def test_valid_request(body: bytes, header_length: Optional[int], expected: dict) -> None:
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
_TWO_BINARY = _json(_input("a", "FP32", [2], binary_data_size=8),
                    _input("b", "FP32", [1], binary_data_size=4))

# (case id, body, header length, error class, message fragment)
ERROR_CASES = [
    ("not-json", b"{nope", None, InvalidArgument, "failed to parse the request JSON buffer"),
    ("json-not-object", b"[1]", None, InvalidArgument, "expected a JSON object"),
    ("inputs-missing", b"{}", None, InvalidArgument, "Unable to parse 'inputs'"),
    ("inputs-not-list", b'{"inputs":{}}', None, InvalidArgument, "Unable to parse 'inputs'"),
    ("input-not-object", b'{"inputs":[5]}', None, InvalidArgument, "input 0 is not a JSON object"),
    ("input-without-name", _json({"datatype": "FP32", "shape": [1], "data": [1]}), None,
     InvalidArgument, "Unable to parse 'name' of input 0"),
    ("duplicate-input", _json(_input("x", "FP32", [1], [1]), _input("x", "FP32", [1], [2])), None,
     InvalidArgument, "input 'x' already exists in request"),
    ("unknown-datatype", _json(_input("x", "FP31", [1], [1])), None,
     InvalidArgument, "invalid datatype 'FP31' for input 'x'"),
    ("datatype-not-string", _json(_input("x", 3, [1], [1])), None,
     InvalidArgument, "Unable to parse 'datatype' for input 'x'"),
    ("shape-missing", _json({"name": "x", "datatype": "FP32", "data": [1]}), None,
     InvalidArgument, "Unable to parse 'shape' for input 'x'"),
    ("negative-dim", _json(_input("x", "FP32", [-5], [1])), None,
     InvalidArgument,
     "Unable to parse 'shape' for input 'x': dimension 0 must be a non-negative integer"),
    ("bool-dim", _json(_input("x", "FP32", [True], [1])), None,
     InvalidArgument, "dimension 0 must be a non-negative integer, got True"),
    ("float-dim", _json(_input("x", "FP32", [1, 2.0], [1, 2])), None,
     InvalidArgument, "dimension 1 must be a non-negative integer"),
    ("dim-beyond-int64", _json(_input("x", "FP32", [2**63], [1])), None,
     InvalidArgument, "dimension 0 must be a non-negative integer"),
    ("shape-overflow", _SHAPE_OVERFLOW + _fp32(1), len(_SHAPE_OVERFLOW),
     InvalidArgument, "byte size overflows int64"),
    ("too-many-dims", _json(_input("x", "FP32", [1] * 65, [1])), None,
     InvalidArgument, "65 dimensions exceed the maximum of 64"),
    ("no-data-field", _json(_input("x", "FP32", [1])), None, InvalidArgument,
     "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
     "'shared_memory_region' in 'parameters'. But no field is set"),
    ("data-and-binary", *_with_binary(_json(_input("x", "FP32", [1], [1.0], binary_data_size=4)),
                                      _fp32(1)),
     InvalidArgument, "But set 'data' 'binary_data_size'"),
    ("shared-memory", _json(_input("x", "FP32", [1], shared_memory_region="r0")), None,
     InvalidArgument, "shared memory is not supported"),
    ("too-few-elements", _json(_input("x", "INT32", [2, 2], [1, 2, 3])), None, InvalidArgument,
     "Unable to parse 'data': Shape does not match true shape of 'data' field: unexpected number of "
     "elements for input 'x': shape [2, 2] needs 4, 'data' holds 3"),
    ("too-many-elements", _json(_input("x", "BYTES", [1], ["a", "b"])), None, InvalidArgument,
     "unexpected number of elements for input 'x': shape [1] needs 1, 'data' holds 2"),
    ("data-not-list", _json(_input("x", "INT32", [1], 5)), None,
     InvalidArgument, "Unable to parse 'data' for input 'x': expected a JSON array"),
    ("fp16-via-json", _json(_input("x", "FP16", [1], [1.0])), None, InvalidArgument,
     "receiving FP16 data via JSON is not supported. Please use the binary data format for input x"),
    ("bf16-via-json", _json(_input("x", "BF16", [1], [1.0])), None,
     InvalidArgument, "receiving BF16 data via JSON is not supported"),
    ("float-for-int", _json(_input("x", "INT32", [2], [1, 2.5])), None,
     InvalidArgument, "INT32 expects JSON integers"),
    ("bool-for-int", _json(_input("x", "INT32", [2], [True, False])), None,
     InvalidArgument, "INT32 expects JSON integers"),
    ("bool-mixed-into-ints", _json(_input("x", "INT64", [2], [1, True])), None,
     InvalidArgument, "INT64 expects JSON integers"),
    ("bool-mixed-into-nested-floats",
     _json(_input("x", "FP32", [2, 2], [[1.5, 2], [False, 3]])), None,
     InvalidArgument, "FP32 expects JSON numbers"),
    ("int-for-bool", _json(_input("x", "BOOL", [2], [1, 0])), None,
     InvalidArgument, "BOOL expects JSON booleans"),
    ("string-for-number", _json(_input("x", "FP32", [1], ["1.0"])), None,
     InvalidArgument, "FP32 expects JSON numbers"),
    ("null-for-number", _json(_input("x", "FP64", [2], [1.0, None])), None,
     InvalidArgument, "FP64 expects JSON numbers"),
    ("number-for-bytes", _json(_input("x", "BYTES", [2], ["a", 1])), None,
     InvalidArgument, "BYTES expects JSON strings"),
    ("int-out-of-range", _json(_input("x", "INT8", [1], [128])), None,
     InvalidArgument, "value 128 is out of range for INT8"),
    ("int64-overflow-mixed", _json(_input("x", "INT64", [2], [1, 2**63])), None,
     InvalidArgument, "a value is out of range for INT64"),
    ("float-mixed-with-big-uint", _json(_input("x", "UINT64", [2], [1.5, 2**63])), None,
     InvalidArgument, "UINT64 expects JSON integers"),
    ("negative-unsigned", _json(_input("x", "UINT32", [1], [-1])), None,
     InvalidArgument, "value -1 is out of range for UINT32"),
    ("binary-size-without-header", _json(_input("x", "FP32", [1], binary_data_size=4)), None,
     InvalidArgument, "must specify valid 'Inference-Header-Content-Length' in request header and "
                      "'binary_data_size' when passing inputs in binary data format"),
    ("binary-bytes-without-header", _json(_input("x", "FP32", [1], binary_data_size=4)) + _fp32(1),
     None, InvalidArgument, "failed to parse the request JSON buffer"),
    ("negative-header-length", _json(_input("x", "INT32", [1], [1])), -1,
     InvalidArgument, "inference header size should be in range (0, "),
    ("header-length-beyond-body", _json(_input("x", "INT32", [1], [1])), 99999999999,
     InvalidArgument, "got: 99999999999"),
    ("too-few-binary-bytes", _TWO_BINARY + _fp32(1, 2), len(_TWO_BINARY), InvalidArgument,
     "unexpected size for input 'b', expecting 4 additional bytes for model 'm'"),
    ("too-many-binary-bytes", _TWO_BINARY + _fp32(1, 2, 3, 4), len(_TWO_BINARY),
     InvalidArgument, "unexpected additional input data for model 'm'"),
    ("binary-size-vs-shape", *_with_binary(_json(_input("x", "FP32", [8], binary_data_size=40)),
                                           b"\0" * 40), InvalidArgument,
     "input byte size mismatch for input 'x' for model 'm'. Expected 32, got 40"),
    ("binary-size-not-uint", *_with_binary(_json(_input("x", "FP32", [1], binary_data_size=-4))),
     InvalidArgument, "Unable to parse 'binary_data_size' for input 'x'"),
    ("truncated-bytes-prefix", *_with_binary(_json(_input("x", "BYTES", [2], binary_data_size=11)),
                                             _bytes_blob(b"abcd") + b"\x01\x00\x00"),
     InvalidArgument, "incomplete string length indicator for inference input 'x'"),
    ("bytes-length-overruns", *_with_binary(_json(_input("x", "BYTES", [1], binary_data_size=6)),
                                            struct.pack("<I", 9) + b"ab"),
     InvalidArgument, "incomplete string data for inference input 'x'"),
    ("bytes-count-beyond-segment",
     *_with_binary(_json(_input("x", "BYTES", [2**40], binary_data_size=8)), _bytes_blob(b"", b"")),
     InvalidArgument, "elements need at least 4398046511104 bytes"),
    ("triton-parameter", _json(_input("x", "INT32", [1], [1]), parameters={"triton_x": 1}), None,
     InvalidArgument, "parameter keys starting with 'triton_' are reserved for Triton usage"),
    ("custom-parameter-list", _json(_input("x", "INT32", [1], [1]), parameters={"k": [1]}), None,
     InvalidArgument, "parameter 'k' has invalid type"),
    ("priority-negative", _json(_input("x", "INT32", [1], [1]), parameters={"priority": -1}), None,
     InvalidArgument, "Unable to parse 'priority'"),
    ("timeout-string", _json(_input("x", "INT32", [1], [1]), parameters={"timeout": "5"}), None,
     InvalidArgument, "Unable to parse 'timeout'"),
    ("binary-output-not-bool", _json(_input("x", "INT32", [1], [1]),
                                     parameters={"binary_data_output": 1}), None,
     InvalidArgument, "Unable to parse 'binary_data_output'"),
    ("sequence-start-not-bool", _json(_input("x", "INT32", [1], [1]),
                                      parameters={"sequence_start": "yes"}), None,
     InvalidArgument, "Unable to parse 'sequence_start'"),
    ("parameters-not-object", _json(_input("x", "INT32", [1], [1]), parameters=[1]), None,
     InvalidArgument, "Unable to parse 'parameters'"),
    ("id-not-string", _json(_input("x", "INT32", [1], [1]), id=5), None,
     InvalidArgument, "Unable to parse 'id'"),
    ("outputs-not-list", _json(_input("x", "INT32", [1], [1]), outputs={"name": "y"}), None,
     InvalidArgument, "Unable to parse 'outputs'"),
    ("output-without-name", _json(_input("x", "INT32", [1], [1]), outputs=[{}]), None,
     InvalidArgument, "Unable to parse 'name' of output 0"),
    ("duplicate-output", _json(_input("x", "INT32", [1], [1]), outputs=[{"name": "y"}, {"name": "y"}]),
     None, InvalidArgument, "output 'y' already exists in request"),
    ("output-binary-not-bool", _json(_input("x", "INT32", [1], [1]),
                                     outputs=[{"name": "y", "parameters": {"binary_data": "no"}}]),
     None, InvalidArgument, "Unable to parse 'binary_data' for output 'y'"),
    ("output-classification-negative", _json(
        _input("x", "INT32", [1], [1]), outputs=[{"name": "y", "parameters": {"classification": -2}}]),
     None, InvalidArgument, "Unable to set 'classification' for output 'y'"),
    ("output-shared-memory", _json(
        _input("x", "INT32", [1], [1]),
        outputs=[{"name": "y", "parameters": {"shared_memory_region": "r"}}]),
     None, InvalidArgument, "shared memory is not supported"),
    ("depth-120-fails", _nested(120), None,
     InvalidArgument, "JSON nesting depth exceeds maximum allowed limit (100)"),
]


@pytest.mark.parametrize("body,header_length,error,fragment", [c[1:] for c in ERROR_CASES],
                         ids=[c[0] for c in ERROR_CASES])
def test_invalid_request(body: bytes, header_length: Optional[int], error: type[ServerError],
                         fragment: str) -> None:
    with pytest.raises(error) as caught:
        _decode(body, header_length)
    assert fragment in caught.value.message
    assert caught.value.http_status() == 400


def test_header_length_zero_is_not_a_json_request() -> None:
    with pytest.raises(ValueError, match="decode_raw_request"):
        _decode(b"\x00\x00\x80\x3f", 0)


# --------------------------------------------------------------------------- limits

def test_dtype_expansion_beyond_the_limit_is_refused_before_decoding() -> None:
    body = _json(_input("x", "FP64", [1000], [0] * 1000))  # ~2 KB of JSON, 8 KB as FP64
    with pytest.raises(TooLarge) as caught:
        _decode(body, max_bytes=4096)
    assert "exceeds the maximum allowed input size of 4096 bytes" in caught.value.message
    assert "--http-max-input-size" in caught.value.message
    assert _decode(body, max_bytes=8000).inputs[0].data.nbytes == 8000


def test_claimed_shapes_add_up_across_inputs() -> None:
    body = _json(_input("a", "INT32", [2], [1, 2]), _input("b", "INT32", [2], [3, 4]))
    with pytest.raises(TooLarge, match="input 'b'"):
        _decode(body, max_bytes=12)


def test_huge_claimed_shape_allocates_nothing() -> None:
    header = _json(_input("x", "BYTES", [2**30], binary_data_size=8))
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgument):
            _decode(header + _bytes_blob(b"", b""), len(header))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_depth_check_ignores_brackets_inside_strings() -> None:
    text = orjson.dumps({"inputs": [{"name": "[" * 500 + '\\"{' * 100, "data": ["]]]" * 50]}]})
    check_json_depth(text, 100)
    with pytest.raises(InvalidArgument):
        check_json_depth(b'{"a":"\\\\"' + b"[" * 101 + b"]" * 101 + b"}", 100)


def test_depth_250000_fails_fast_without_recursion() -> None:
    body = b"[" * 250_000 + b"]" * 250_000
    start = time.perf_counter()
    with pytest.raises(InvalidArgument, match="nesting depth"):
        _decode(body)
    assert time.perf_counter() - start < 1.0


def test_unterminated_strings_do_not_make_the_scan_quadratic() -> None:
    body = b"[" * 101 + b'"' + b'\\"' * 2_000_000
    start = time.perf_counter()
    with pytest.raises(InvalidArgument):
        _decode(body)
    assert time.perf_counter() - start < 1.0


# --------------------------------------------------------------------------- request fields

def test_request_fields_are_kept() -> None:
    body = _json(
        _input("x", "INT32", [1], [1], custom="c"),
        id="req-7",
        parameters={"binary_data_output": True, "priority": 2, "timeout": 1000, "sequence_id": "s",
                    "sequence_start": True, "headers": "h", "temperature": 0.5},
        outputs=[{"name": "a", "parameters": {"binary_data": False}},
                 {"name": "b", "parameters": {"classification": 3, "extra": 1}},
                 {"name": "c"}],
    )
    request = _decode(body)
    assert request.model_name == MODEL and request.model_version == "1"
    assert request.id == "req-7"
    assert request.parameters == {"binary_data_output": True, "priority": 2, "timeout": 1000,
                                  "sequence_id": "s", "sequence_start": True, "headers": "h",
                                  "temperature": 0.5}
    assert request.inputs[0].parameters == {"custom": "c"}
    assert request.outputs == [
        RequestedOutput("a", binary=False, classification=0, parameters={"binary_data": False}),
        RequestedOutput("b", binary=None, classification=3,
                        parameters={"classification": 3, "extra": 1}),
        RequestedOutput("c"),
    ]


@pytest.mark.parametrize("outputs", [None, []])
def test_absent_or_empty_outputs_mean_every_output(outputs: Optional[list]) -> None:
    fields = {} if outputs is None else {"outputs": outputs}
    assert _decode(_json(_input("x", "INT32", [1], [1]), **fields)).outputs is None


def test_binary_input_parameters_drop_the_wire_size() -> None:
    header = _json(_input("x", "FP32", [1], binary_data_size=4, note="n"))
    request = _decode(header + _fp32(1), len(header))
    assert request.inputs[0].parameters == {"note": "n"}


def test_binary_inputs_are_zero_copy_views_of_the_body() -> None:
    header = _json(_input("a", "FP32", [2], binary_data_size=8),
                   _input("b", "INT64", [1], binary_data_size=8))
    body = header + _fp32(1, 2) + struct.pack("<q", -3)
    request = _decode(body, len(header))
    body_array = np.frombuffer(body, dtype=np.uint8)
    for tensor in request.inputs:
        assert np.shares_memory(tensor.data, body_array)
        assert not tensor.data.flags.writeable
    assert request.inputs[1].data.tolist() == [-3]


def test_memoryview_and_bytearray_bodies() -> None:
    header = _json(_input("x", "FP32", [1], binary_data_size=4))
    for body in (bytearray(header + _fp32(2)), memoryview(header + _fp32(2))):
        assert _decode(body, len(header)).inputs[0].data.tolist() == [2.0]
    nested = bytearray(_json(_input("x", "INT32", [1], [[[[1]]]])))  # depth 3 + 4
    assert _decode(nested, None, max_json_depth=7).inputs[0].data.tolist() == [1]
    with pytest.raises(InvalidArgument, match=r"limit \(6\)"):
        _decode(nested, None, max_json_depth=6)


# --------------------------------------------------------------------------- header parsing

@pytest.mark.parametrize("value,expected", [(None, None), ("0", 0), (" 12 ", 12), ("-1", -1),
                                            ("99999999999", 99999999999)])
def test_parse_header_length(value: Optional[str], expected: Optional[int]) -> None:
    assert parse_header_length(value) == expected


@pytest.mark.parametrize("value", ["abc", "", "1.5", "0x10", "+3", "1" * 30])
def test_parse_header_length_rejects_text(value: str) -> None:
    with pytest.raises(InvalidArgument, match="Unable to parse Inference-Header-Content-Length"):
        parse_header_length(value)


def test_check_header_length_bounds() -> None:
    check_header_length(0, 10)
    check_header_length(10, 10)
    for bad in (-1, 11):
        with pytest.raises(InvalidArgument, match=r"should be in range \(0, 10\)"):
            check_header_length(bad, 10)


# --------------------------------------------------------------------------- raw requests

def test_raw_fixed_shape() -> None:
    body = _fp32(1, 2, 3, 4)
    request = decode_raw_request(body, MODEL, "1", "INPUT0", "TYPE_FP32", [2, 2], 0)
    tensor = request.inputs[0]
    assert (tensor.name, tensor.datatype, tensor.shape) == ("INPUT0", "FP32", (2, 2))
    assert tensor.data.tolist() == [[1, 2], [3, 4]]
    assert np.shares_memory(tensor.data, np.frombuffer(body, np.uint8))
    assert request.parameters == {"binary_data_output": True}
    assert request.outputs is None


def test_raw_variable_dim_is_deduced_and_batching_adds_batch_one() -> None:
    request = decode_raw_request(_fp32(*range(6)), MODEL, "1", "INPUT0", "FP32", [-1, 2], 8)
    assert request.inputs[0].shape == (1, 3, 2)


def test_raw_bytes_input_is_one_element() -> None:
    body = b"\xffraw text"
    request = decode_raw_request(body, MODEL, "1", "TEXT", "TYPE_STRING", [1], 4)
    tensor = request.inputs[0]
    assert (tensor.datatype, tensor.shape) == ("BYTES", (1, 1))
    assert tensor.data[0, 0] == body


@pytest.mark.parametrize("datatype,dims,body,fragment", [
    ("FP32", [-1, -1], _fp32(1), "The shape of the raw input 'INPUT0' can not be deduced because "
                                 "there are more than one variable-sized dimension"),
    ("BYTES", [2], b"ab", "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"),
    ("TYPE_STRING", [-1], b"ab", "the model must have input shape [1]"),
    ("FP32", [4], _fp32(1, 2, 3), "input byte size mismatch for input 'INPUT0' for model 'm'. "
                                  "Expected 16, got 12"),
    ("FP32", [-1], b"\0" * 6, "Expected 4, got 6"),
    ("TYPE_NOPE", [1], b"", "invalid datatype"),
])
def test_raw_errors(datatype: str, dims: list, body: bytes, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        decode_raw_request(body, MODEL, "1", "INPUT0", datatype, dims, 0)
    assert fragment in caught.value.message


def test_raw_input_count_helper() -> None:
    check_raw_input_count("simple", 1)
    with pytest.raises(InvalidArgument) as caught:
        check_raw_input_count("simple", 2)
    assert caught.value.message == ("Raw request must only have 1 input (found 1) to be deduced but "
                                    "got 2 inputs in 'simple' model configuration")
    assert raw_input_count_message("simple", 2) == caught.value.message


# --------------------------------------------------------------------------- responses

def _split(body: bytes, header_length: Optional[int]) -> tuple[dict, bytes]:
    if header_length is None:
        return orjson.loads(body), b""
    return orjson.loads(body[:header_length]), body[header_length:]


def _blobs(document: dict, tail: bytes) -> dict[str, bytes]:
    """Cut the binary tail the way tritonclient does: in output order, by binary_data_size."""
    out, offset = {}, 0
    for output in document["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is not None:
            out[output["name"]] = tail[offset:offset + size]
            offset += size
    assert offset == len(tail)
    return out


def _response(*outputs: Tensor, **fields: Any) -> InferResponse:
    return InferResponse(model_name=MODEL, model_version="3", outputs=list(outputs), **fields)


_F32 = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
_I64 = np.array([[-1, 2**40]], dtype=np.int64)
_STR = np.array([b"ab", "ç".encode(), b""], dtype=object)


def test_json_response_round_trip() -> None:
    response = _response(Tensor("f", "FP32", (2, 3), _F32), Tensor("i", "INT64", (1, 2), _I64),
                         Tensor("s", "BYTES", (3,), _STR),
                         Tensor("b", "BOOL", (2,), np.array([True, False])),
                         id="r1", parameters={"p": 1})
    body, header_length = encode_infer_response(response, None, False)
    assert header_length is None
    document = orjson.loads(body)
    assert list(document) == ["id", "model_name", "model_version", "parameters", "outputs"]
    assert (document["id"], document["model_name"], document["model_version"]) == ("r1", MODEL, "3")
    assert document["parameters"] == {"p": 1}
    f, i, s, b = document["outputs"]
    assert f == {"name": "f", "datatype": "FP32", "shape": [2, 3], "data": _F32.reshape(-1).tolist()}
    assert np.array(i["data"], np.int64).reshape(i["shape"]).tolist() == _I64.tolist()
    assert s["data"] == ["ab", "ç", ""]
    assert b["data"] == [True, False]


def test_binary_response_round_trip() -> None:
    response = _response(Tensor("f", "FP32", (2, 3), _F32), Tensor("s", "BYTES", (3,), _STR),
                         Tensor("e", "INT32", (0,), np.zeros(0, np.int32)))
    body, header_length = encode_infer_response(response, None, True)
    document, tail = _split(body, header_length)
    assert "id" not in document
    sizes = [o["parameters"]["binary_data_size"] for o in document["outputs"]]
    assert sizes == [24, 3 * 4 + 4, 0]
    assert all("data" not in o for o in document["outputs"])
    blobs = _blobs(document, tail)
    assert np.frombuffer(blobs["f"], np.float32).reshape(2, 3).tolist() == _F32.tolist()
    assert blobs["s"] == _bytes_blob(b"ab", "ç".encode(), b"")
    assert blobs["e"] == b""


@pytest.mark.parametrize("binary_default,requested,expected_binary", [
    (False, None, {"a": False, "b": False}),
    (True, None, {"a": True, "b": True}),
    (True, [RequestedOutput("a", binary=False), RequestedOutput("b")], {"a": False, "b": True}),
    (False, [RequestedOutput("a", binary=True), RequestedOutput("b", binary=None)],
     {"a": True, "b": False}),
    (False, [RequestedOutput("b", binary=True)], {"a": False, "b": True}),
])
def test_per_output_binary_beats_the_default(binary_default: bool, requested: Optional[list],
                                             expected_binary: dict) -> None:
    a, b = np.array([1, 2], np.int32), np.array([3.5], np.float64)
    response = _response(Tensor("a", "INT32", (2,), a), Tensor("b", "FP64", (1,), b))
    body, header_length = encode_infer_response(response, requested, binary_default)
    assert (header_length is not None) == any(expected_binary.values())
    document, tail = _split(body, header_length)
    blobs = _blobs(document, tail)
    for output, array in zip(document["outputs"], (a, b)):
        binary = expected_binary[output["name"]]
        assert ("data" not in output) == binary
        values = (np.frombuffer(blobs[output["name"]], array.dtype) if binary
                  else np.array(output["data"], array.dtype))
        assert values.tolist() == array.tolist()


def test_json_output_conversions() -> None:
    strided = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
    big_endian = np.array([1, 256], dtype=">i4")
    response = _response(
        Tensor("h", "FP16", (2,), np.array([0.5, -1.25], np.float16)),
        Tensor("bf", "BF16", (2,), np.array([0x3F80, 0xC000], np.uint16)),
        Tensor("t", "FP64", (3, 2), strided),
        Tensor("be", "INT32", (2,), big_endian),
        Tensor("bad", "BYTES", (1,), np.array([b"\xff\xfeok"], dtype=object)),
        Tensor("u", "BYTES", (1,), np.array(["unicode"])),
    )
    document = orjson.loads(encode_infer_response(response, None, False)[0])
    data = {o["name"]: o["data"] for o in document["outputs"]}
    assert data["h"] == [0.5, -1.25]
    assert data["bf"] == [1.0, -2.0]
    assert data["t"] == strided.reshape(-1).tolist()
    assert data["be"] == [1, 256]
    assert data["bad"] == ["\ufffd\ufffdok"]
    assert data["u"] == ["unicode"]


def test_binary_output_normalises_dtype_and_layout() -> None:
    strided = np.arange(8, dtype=np.int32)[::2]
    response = _response(Tensor("s", "INT32", (4,), strided),
                         Tensor("d", "FP32", (2,), np.array([1.5, 2.5], np.float64)),
                         Tensor("bf", "BF16", (1,), np.array([1.0], np.float32)))
    body, header_length = encode_infer_response(response, None, True)
    blobs = _blobs(*_split(body, header_length))
    assert np.frombuffer(blobs["s"], np.int32).tolist() == [0, 2, 4, 6]
    assert np.frombuffer(blobs["d"], np.float32).tolist() == [1.5, 2.5]
    assert np.frombuffer(blobs["bf"], np.uint16).tolist() == [0x3F80]


def test_output_parameters_and_binary_size_merge() -> None:
    response = _response(Tensor("a", "INT8", (1,), np.array([1], np.int8), parameters={"k": "v"}))
    document, _ = _split(*encode_infer_response(response, None, True))
    assert document["outputs"][0]["parameters"] == {"k": "v", "binary_data_size": 1}
    document, _ = _split(*encode_infer_response(response, None, False))
    assert document["outputs"][0]["parameters"] == {"k": "v"}


def test_unknown_output_datatype_is_internal() -> None:
    response = _response(Tensor("a", "FP8", (1,), np.zeros(1)))
    with pytest.raises(InternalError):
        encode_infer_response(response, None, False)


def test_decoded_request_round_trips_through_the_encoder() -> None:
    header = _json(_input("x", "FP32", [2, 2], binary_data_size=16), _input("s", "BYTES", [1], ["q"]),
                   outputs=[{"name": "x", "parameters": {"binary_data": True}}, {"name": "s"}])
    request = _decode(header + _fp32(1, 2, 3, 4), len(header))
    response = _response(*request.inputs)
    body, header_length = encode_infer_response(response, request.outputs,
                                                request.parameters.get("binary_data_output", False))
    document, tail = _split(body, header_length)
    assert np.frombuffer(_blobs(document, tail)["x"], np.float32).tolist() == [1, 2, 3, 4]
    assert document["outputs"][1]["data"] == ["q"]


def test_encode_error() -> None:
    assert orjson.loads(encode_error("bad 'thing' \"quoted\"")) == {"error": "bad 'thing' \"quoted\""}


# --------------------------------------------------------------------------- tritonclient

def test_tritonclient_request_and_response_round_trip() -> None:
    """The bodies tritonclient builds decode, and what we encode parses back in tritonclient."""
    httpclient = pytest.importorskip("tritonclient.http")
    from protocol.compression import compress

    arrays = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "f16": np.array([[0.5, -1.5]], dtype=np.float16),
        "i32": np.array([[1, -2, 3]], dtype=np.int32),
        "flag": np.array([[True, False]]),
        "text": np.array([[b"ab", "ç".encode()]], dtype=object),
    }
    datatypes = {"f32": "FP32", "f16": "FP16", "i32": "INT32", "flag": "BOOL", "text": "BYTES"}
    inputs = []
    for name, array in arrays.items():
        infer_input = httpclient.InferInput(name, list(array.shape), datatypes[name])
        infer_input.set_data_from_numpy(array, binary_data=name not in ("i32", "flag"))
        inputs.append(infer_input)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=name != "text") for name in arrays]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs, request_id="r9", parameters={"custom": 3})

    request = _decode(body, json_size)
    assert request.id == "r9" and request.parameters["custom"] == 3
    for tensor in request.inputs:
        assert tensor.data.tolist() == arrays[tensor.name].tolist()

    response = InferResponse(MODEL, "1", request.id, outputs=request.inputs)
    payload, header_length = encode_infer_response(response, request.outputs, False)
    for encoding in (None, "gzip", "deflate"):
        result = httpclient.InferenceServerClient.parse_response_body(
            compress(payload, encoding), header_length=header_length, content_encoding=encoding)
        assert result.get_response()["id"] == "r9"
        for name, array in arrays.items():
            got = result.as_numpy(name)
            assert got.shape == array.shape
            if name == "text":  # JSON BYTES come back to tritonclient as str
                got = np.vectorize(str.encode, otypes=[object])(got)
            assert got.tolist() == array.tolist()


def test_tritonclient_default_outputs_are_binary() -> None:
    httpclient = pytest.importorskip("tritonclient.http")
    infer_input = httpclient.InferInput("x", [2], "INT64")
    infer_input.set_data_from_numpy(np.array([7, 8], np.int64))
    body, json_size = httpclient.InferenceServerClient.generate_request_body([infer_input])
    request = _decode(body, json_size)
    assert request.outputs is None
    assert request.parameters.get("binary_data_output") is True
    payload, header_length = encode_infer_response(
        InferResponse(MODEL, "1", outputs=request.inputs), request.outputs, True)
    result = httpclient.InferenceServerClient.parse_response_body(payload, header_length=header_length)
    assert result.as_numpy("x").tolist() == [7, 8]
