"""Shared builders for the REST codec tests (tests/unit/protocol/rest/test_decode*.py and
test_encode.py): request bodies as the HTTP layer hands them over, and helpers that cut an
encoded response apart."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

from protocol.rest.decode import decode_infer_request
from protocol.types import InferResponse, Tensor

MODEL = "m"


# --------------------------------------------------------------------------- builders


def tensor_entry(
    name: str, datatype: str, shape: list, data: Any = None, **parameters: Any
) -> dict:
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if data is not None:
        entry["data"] = data
    if parameters:
        entry["parameters"] = parameters
    return entry


def json_body(*inputs: dict, **fields: Any) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **fields})


def with_binary(header: bytes, *blobs: bytes) -> tuple[bytes, int]:
    return header + b"".join(blobs), len(header)


def bytes_blob(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def nested_json(depth: int) -> bytes:
    data = b"[" * depth + b"1" + b"]" * depth
    return b'{"inputs":[{"name":"x","datatype":"INT32","shape":[1],"data":' + data + b"}]}"


def fp32_bytes(*values: float) -> bytes:
    return np.array(values, dtype=np.float32).tobytes()


def decode_body(body: bytes, header_length: int | None = None, **kwargs: Any):
    return decode_infer_request(body, header_length, MODEL, "1", **kwargs)


# --------------------------------------------------------------------------- responses


def split_body(body: bytes, header_length: int | None) -> tuple[dict, bytes]:
    if header_length is None:
        return orjson.loads(body), b""
    return orjson.loads(body[:header_length]), body[header_length:]


def binary_blobs(document: dict, tail: bytes) -> dict[str, bytes]:
    """Cut the binary tail the way tritonclient does: in output order, by binary_data_size."""
    out, offset = {}, 0
    for output in document["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is not None:
            out[output["name"]] = tail[offset : offset + size]
            offset += size
    assert offset == len(tail)
    return out


def make_response(*outputs: Tensor, **fields: Any) -> InferResponse:
    return InferResponse(model_name=MODEL, model_version="3", outputs=list(outputs), **fields)
