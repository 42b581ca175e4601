"""REST request decoding at the edges (protocol/rest/decode.py, inputs.py): size and JSON
depth limits, zero-copy binary inputs, Inference-Header-Content-Length parsing and raw requests."""

from __future__ import annotations

import struct
import time
import tracemalloc

import numpy as np
import orjson
import pytest

from protocol.errors import InvalidArgument, TooLarge
from protocol.rest.decode import (
    check_header_length,
    check_json_depth,
    check_raw_input_count,
    decode_raw_request,
    parse_header_length,
    raw_input_count_message,
)
from tests.support.rest_cases import (
    MODEL,
    bytes_blob,
    decode_body,
    fp32_bytes,
    json_body,
    tensor_entry,
)

# --------------------------------------------------------------------------- limits


def test_dtype_expansion_beyond_the_limit_is_refused_before_decoding() -> None:
    body = json_body(tensor_entry("x", "FP64", [1000], [0] * 1000))  # ~2 KB of JSON, 8 KB as FP64
    with pytest.raises(TooLarge) as caught:
        decode_body(body, max_bytes=4096)
    assert "exceeds the maximum allowed input size of 4096 bytes" in caught.value.message
    assert "--http-max-input-size" in caught.value.message
    assert decode_body(body, max_bytes=8000).inputs[0].data.nbytes == 8000


def test_claimed_shapes_add_up_across_inputs() -> None:
    body = json_body(
        tensor_entry("a", "INT32", [2], [1, 2]), tensor_entry("b", "INT32", [2], [3, 4])
    )
    with pytest.raises(TooLarge, match="input 'b'"):
        decode_body(body, max_bytes=12)


def test_huge_claimed_shape_allocates_nothing() -> None:
    header = json_body(tensor_entry("x", "BYTES", [2**30], binary_data_size=8))
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgument):
            decode_body(header + bytes_blob(b"", b""), len(header))
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
        decode_body(body)
    assert time.perf_counter() - start < 1.0


def test_unterminated_strings_do_not_make_the_scan_quadratic() -> None:
    body = b"[" * 101 + b'"' + b'\\"' * 2_000_000
    start = time.perf_counter()
    with pytest.raises(InvalidArgument):
        decode_body(body)
    assert time.perf_counter() - start < 1.0


# --------------------------------------------------------------------------- body buffers


def test_binary_inputs_are_zero_copy_views_of_the_body() -> None:
    header = json_body(
        tensor_entry("a", "FP32", [2], binary_data_size=8),
        tensor_entry("b", "INT64", [1], binary_data_size=8),
    )
    body = header + fp32_bytes(1, 2) + struct.pack("<q", -3)
    request = decode_body(body, len(header))
    body_array = np.frombuffer(body, dtype=np.uint8)
    for tensor in request.inputs:
        assert np.shares_memory(tensor.data, body_array)
        assert not tensor.data.flags.writeable
    assert request.inputs[1].data.tolist() == [-3]


def test_memoryview_and_bytearray_bodies() -> None:
    header = json_body(tensor_entry("x", "FP32", [1], binary_data_size=4))
    for body in (bytearray(header + fp32_bytes(2)), memoryview(header + fp32_bytes(2))):
        assert decode_body(body, len(header)).inputs[0].data.tolist() == [2.0]
    nested = bytearray(json_body(tensor_entry("x", "INT32", [1], [[[[1]]]])))  # depth 3 + 4
    assert decode_body(nested, None, max_json_depth=7).inputs[0].data.tolist() == [1]
    with pytest.raises(InvalidArgument, match=r"limit \(6\)"):
        decode_body(nested, None, max_json_depth=6)


# --------------------------------------------------------------------------- header parsing


@pytest.mark.parametrize(
    "value,expected",
    [(None, None), ("0", 0), (" 12 ", 12), ("-1", -1), ("99999999999", 99999999999)],
)
def test_parse_header_length(value: str | None, expected: int | None) -> None:
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
    body = fp32_bytes(1, 2, 3, 4)
    request = decode_raw_request(body, MODEL, "1", "INPUT0", "TYPE_FP32", [2, 2], 0)
    tensor = request.inputs[0]
    assert (tensor.name, tensor.datatype, tensor.shape) == ("INPUT0", "FP32", (2, 2))
    assert tensor.data.tolist() == [[1, 2], [3, 4]]
    assert np.shares_memory(tensor.data, np.frombuffer(body, np.uint8))
    assert request.parameters == {"binary_data_output": True}
    assert request.outputs is None


def test_raw_variable_dim_is_deduced_and_batching_adds_batch_one() -> None:
    request = decode_raw_request(fp32_bytes(*range(6)), MODEL, "1", "INPUT0", "FP32", [-1, 2], 8)
    assert request.inputs[0].shape == (1, 3, 2)


def test_raw_bytes_input_is_one_element() -> None:
    body = b"\xffraw text"
    request = decode_raw_request(body, MODEL, "1", "TEXT", "TYPE_STRING", [1], 4)
    tensor = request.inputs[0]
    assert (tensor.datatype, tensor.shape) == ("BYTES", (1, 1))
    assert tensor.data[0, 0] == body


@pytest.mark.parametrize(
    "datatype,dims,body,fragment",
    [
        (
            "FP32",
            [-1, -1],
            fp32_bytes(1),
            "The shape of the raw input 'INPUT0' can not be deduced because "
            "there are more than one variable-sized dimension",
        ),
        (
            "BYTES",
            [2],
            b"ab",
            "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
        ),
        ("TYPE_STRING", [-1], b"ab", "the model must have input shape [1]"),
        (
            "FP32",
            [4],
            fp32_bytes(1, 2, 3),
            "input byte size mismatch for input 'INPUT0' for model 'm'. Expected 16, got 12",
        ),
        ("FP32", [-1], b"\0" * 6, "Expected 4, got 6"),
        ("TYPE_NOPE", [1], b"", "invalid datatype"),
    ],
)
def test_raw_errors(datatype: str, dims: list, body: bytes, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        decode_raw_request(body, MODEL, "1", "INPUT0", datatype, dims, 0)
    assert fragment in caught.value.message


def test_raw_input_count_helper() -> None:
    check_raw_input_count("simple", 1)
    with pytest.raises(InvalidArgument) as caught:
        check_raw_input_count("simple", 2)
    assert caught.value.message == (
        "Raw request must only have 1 input (found 1) to be deduced but "
        "got 2 inputs in 'simple' model configuration"
    )
    assert raw_input_count_message("simple", 2) == caught.value.message
