"""Data type names across the wire, the config and numpy, and the BYTES wire format."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest

from protocol import datatypes
from protocol.errors import InvalidArgument


@pytest.mark.parametrize(
    "wire, config, dtype",
    [
        ("BOOL", "TYPE_BOOL", np.bool_),
        ("UINT8", "TYPE_UINT8", np.uint8),
        ("INT32", "TYPE_INT32", np.int32),
        ("INT64", "TYPE_INT64", np.int64),
        ("FP16", "TYPE_FP16", np.float16),
        ("FP32", "TYPE_FP32", np.float32),
        ("FP64", "TYPE_FP64", np.float64),
        ("UINT64", "TYPE_UINT64", np.uint64),
    ],
)
def test_names_map_both_ways(wire: str, config: str, dtype) -> None:
    assert datatypes.config_to_wire(config) == wire
    assert datatypes.wire_to_config(wire) == config
    assert datatypes.numpy_to_wire(np.dtype(dtype)) == wire
    assert datatypes.lookup(wire).itemsize == np.dtype(dtype).itemsize


def test_strings_are_bytes_on_the_wire_and_in_configs() -> None:
    assert datatypes.config_to_wire("TYPE_STRING") == "BYTES"
    assert datatypes.numpy_to_wire(np.array([b"a"], dtype=object).dtype) == "BYTES"
    with pytest.raises(InvalidArgument, match="invalid datatype 'STRING'"):
        datatypes.lookup("STRING")


def test_bytes_round_trip_with_little_endian_length_prefixes() -> None:
    values = np.array([b"ab", b"", "\u00e9".encode()], dtype=object)
    raw = datatypes.serialize_bytes(values)
    assert (
        raw
        == struct.pack("<I", 2)
        + b"ab"
        + struct.pack("<I", 0)
        + struct.pack("<I", 2)
        + "\u00e9".encode()
    )
    assert list(datatypes.deserialize_bytes(raw, 3, "x")) == list(values)


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"\x02\x00", "incomplete string length indicator for inference input 'x'"),
        (struct.pack("<I", 9) + b"abc", "incomplete string data for inference input 'x'"),
        (struct.pack("<I", 1) + b"ab", "unexpected additional data for inference input 'x'"),
    ],
)
def test_malformed_bytes_are_rejected(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        datatypes.deserialize_bytes(raw, 1, "x")


def test_a_huge_bytes_shape_over_a_small_buffer_is_refused_before_any_allocation() -> None:
    """A 12-byte body claiming 2**31 - 1 strings: the old code made a 16 GiB object array
    first (found by the nightly gRPC fuzzer: a MemoryError, or seconds of page faults)."""
    raw = (struct.pack("<I", 2) + b"ab") * 3
    tracemalloc.start()
    try:
        with pytest.raises(
            InvalidArgument,
            match="incomplete string length indicator for "
            "inference input 'x', expecting 4 bytes but "
            "only 0 bytes available",
        ):
            datatypes.tensor_from_raw(datatypes.lookup("BYTES"), (2**31 - 1,), raw, "x")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


def test_fixed_size_tensors_are_views_over_the_wire_buffer() -> None:
    buffer = np.arange(6, dtype=np.float32).tobytes()
    array = datatypes.tensor_from_raw(datatypes.lookup("FP32"), (2, 3), memoryview(buffer), "x")
    assert array.shape == (2, 3) and array[1, 2] == 5.0
    assert np.shares_memory(array, np.frombuffer(buffer, dtype=np.uint8))
    with pytest.raises(InvalidArgument, match="expected 24 bytes"):
        datatypes.tensor_from_raw(datatypes.lookup("FP32"), (2, 3), buffer[:20], "x")
    assert bytes(datatypes.raw_from_tensor(array, "FP32")) == buffer
