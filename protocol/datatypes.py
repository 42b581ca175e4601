"""Data type names across the wire (KServe), model config (TYPE_*), numpy and gRPC contents.

Also the BYTES codec: each element is a 4-byte little-endian length followed by its bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from protocol.errors import InvalidArgument
from protocol.text import shown


@dataclass(frozen=True, slots=True)
class DataType:
    name: str  # KServe name, e.g. "FP32"
    config_name: str  # model_config DataType enum name, e.g. "TYPE_FP32"
    numpy: np.dtype | None  # None for BYTES (object arrays) and BF16 (no numpy type)
    itemsize: int  # 0 for variable-size BYTES
    contents_field: str | None  # InferTensorContents field, None when raw only
    json_allowed: bool = True


_ALL = [
    DataType("BOOL", "TYPE_BOOL", np.dtype(np.bool_), 1, "bool_contents"),
    DataType("UINT8", "TYPE_UINT8", np.dtype(np.uint8), 1, "uint_contents"),
    DataType("UINT16", "TYPE_UINT16", np.dtype(np.uint16), 2, "uint_contents"),
    DataType("UINT32", "TYPE_UINT32", np.dtype(np.uint32), 4, "uint_contents"),
    DataType("UINT64", "TYPE_UINT64", np.dtype(np.uint64), 8, "uint64_contents"),
    DataType("INT8", "TYPE_INT8", np.dtype(np.int8), 1, "int_contents"),
    DataType("INT16", "TYPE_INT16", np.dtype(np.int16), 2, "int_contents"),
    DataType("INT32", "TYPE_INT32", np.dtype(np.int32), 4, "int_contents"),
    DataType("INT64", "TYPE_INT64", np.dtype(np.int64), 8, "int64_contents"),
    DataType("FP16", "TYPE_FP16", np.dtype(np.float16), 2, None, json_allowed=False),
    DataType("FP32", "TYPE_FP32", np.dtype(np.float32), 4, "fp32_contents"),
    DataType("FP64", "TYPE_FP64", np.dtype(np.float64), 8, "fp64_contents"),
    DataType("BYTES", "TYPE_STRING", None, 0, "bytes_contents"),
    # BF16 travels as 2-byte raw words; we keep them as uint16 bit patterns.
    DataType("BF16", "TYPE_BF16", np.dtype(np.uint16), 2, None, json_allowed=False),
]

BY_NAME: dict[str, DataType] = {d.name: d for d in _ALL}
BY_CONFIG_NAME: dict[str, DataType] = {d.config_name: d for d in _ALL}


def lookup(name: str) -> DataType:
    """The KServe datatype called `name`, or INVALID_ARG naming it."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise InvalidArgument(f"invalid datatype '{shown(name)}'") from None


def config_to_wire(config_name: str) -> str:
    """TYPE_FP32 -> FP32, TYPE_STRING -> BYTES."""
    return BY_CONFIG_NAME[config_name].name


def wire_to_config(name: str) -> str:
    return BY_NAME[name].config_name


def numpy_to_wire(dtype: np.dtype) -> str:
    """The KServe name for a numpy dtype (object / bytes / str arrays are BYTES)."""
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    for d in _ALL:
        if d.numpy == dtype and d.name != "BF16":
            return d.name
    raise InvalidArgument(f"unsupported numpy dtype {dtype}")


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


MAX_DIMS = 64  # numpy's limit on ndim: a shape with more dimensions can never be an array
_INTP_MAX = int(np.iinfo(np.intp).max)
_OBJECT_ITEMSIZE = np.dtype(object).itemsize  # a BYTES element is an object pointer


def checked_element_count(name: str, shape: tuple[int, ...] | list[int], datatype: DataType) -> int:
    """prod(shape) for an input's (non-negative) wire shape, or INVALID_ARG naming the input
    when numpy could not hold an array of that shape: more than MAX_DIMS dimensions, or
    non-zero dimensions whose product times the element size overflows int64. numpy refuses
    the latter even when another dimension is 0, so `[9223372036854775807, 0]` holds no
    element and still may not reach `reshape` (it would fail there as a 500)."""
    if len(shape) > MAX_DIMS:
        raise InvalidArgument(
            f"invalid shape for input '{name}': {len(shape)} dimensions "
            f"exceed the maximum of {MAX_DIMS}"
        )
    count = 1
    span = datatype.numpy.itemsize if datatype.numpy is not None else _OBJECT_ITEMSIZE
    for dim in shape:
        count *= dim
        if dim:
            span *= dim
    if span > _INTP_MAX:
        what = "its byte size" if count else "the byte size of its non-zero dimensions"
        raise InvalidArgument(
            f"shape {list(shape)} of input '{name}' is too large: {what} overflows int64"
        )
    return count


_SERIALIZE_STEP = 1 << 16  # elements joined per step


def serialize_bytes(array: np.ndarray) -> bytes:
    """Flatten a BYTES tensor into length-prefixed wire form. Joined a step at a time: one
    join (and one free) of millions of small parts is a single C call that holds the GIL for
    over 0.1 s, and large answers are serialized in a thread beside the event loop."""
    flat = array.reshape(-1)
    blocks: list[bytes] = []
    for first in range(0, flat.size, _SERIALIZE_STEP):
        parts: list[bytes] = []
        for item in flat[first : first + _SERIALIZE_STEP]:
            if isinstance(item, str):
                item = item.encode("utf-8")
            elif not isinstance(item, (bytes, bytearray, memoryview)):
                item = str(item).encode("utf-8")
            parts.append(struct.pack("<I", len(item)))
            parts.append(bytes(item))
        blocks.append(b"".join(parts))
    return blocks[0] if len(blocks) == 1 else b"".join(blocks)


def deserialize_bytes(buffer: bytes | memoryview, count: int, name: str) -> np.ndarray:
    """Parse `count` length-prefixed elements; the buffer must hold exactly those.

    The array is made only once the buffer has proved to hold `count` elements: `count` comes
    from the client's shape, and an object array for a shape of [2147483647] over a 12-byte
    buffer would be 16 GiB of pointers before the first length indicator is read."""
    view = memoryview(buffer)
    size = len(view)
    parsed: list[bytes] = []
    offset = 0
    for _ in range(count):
        if offset + 4 > size:
            raise InvalidArgument(
                f"incomplete string length indicator for inference input '{name}', "
                f"expecting 4 bytes but only {size - offset} bytes available"
            )
        (length,) = struct.unpack_from("<I", view, offset)
        offset += 4
        if offset + length > size:
            raise InvalidArgument(
                f"incomplete string data for inference input '{name}', expecting string of "
                f"length {length} but only {size - offset} bytes available"
            )
        parsed.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != size:
        raise InvalidArgument(
            f"unexpected additional data for inference input '{name}': "
            f"{count} strings used {offset} of {size} bytes"
        )
    items = np.empty(count, dtype=object)
    items[:] = parsed
    return items


def tensor_from_raw(
    datatype: DataType, shape: tuple[int, ...], raw: bytes | memoryview, name: str
) -> np.ndarray:
    """A zero-copy numpy view over raw little-endian bytes (or a parsed BYTES object array)."""
    count = checked_element_count(name, shape, datatype)
    if datatype.name == "BYTES":
        return deserialize_bytes(raw, count, name).reshape(shape)
    expected = count * datatype.itemsize
    if len(raw) != expected:
        raise InvalidArgument(
            f"input byte size mismatch for input '{name}': expected {expected} bytes "
            f"for shape {list(shape)} of {datatype.name}, got {len(raw)}"
        )
    # one constructor call: a third of frombuffer's and reshape's cost, paid per input
    return np.ndarray(shape, datatype.numpy, raw)


def raw_from_tensor(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """Wire bytes for an output: a view of contiguous numeric data, or serialised BYTES."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    contiguous = np.ascontiguousarray(array)
    if not contiguous.size:
        return b""
    return memoryview(contiguous).cast("B")  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ on Python 3.12+ only
