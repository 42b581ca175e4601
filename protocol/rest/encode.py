"""InferResponse and the core's other answers -> the HTTP/REST wire form, encoded exactly once.

protocol.md 1.5-1.7 and Triton's extensions: an infer response as JSON or JSON plus binary
outputs, the error body, model metadata, statistics and the repository index. The non-infer
encoders return the JSON document (a dict or list) the frontend serialises.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson

from protocol import datatypes
from protocol.errors import InternalError
from protocol.rest.common import Buffer
from protocol.shared_memory import in_shared_memory
from protocol.types import (
    DurationSnapshot,
    IndexEntry,
    InferResponse,
    ModelMetadata,
    RequestedOutput,
    StatisticsSnapshot,
    Tensor,
    TensorMetadata,
)

_DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


# --------------------------------------------------------------------------- response


def encode_infer_response(
    response: InferResponse, requested: list[RequestedOutput] | None, binary_default: bool
) -> tuple[bytes, int | None]:
    """The response body and its JSON length (None when nothing binary follows the JSON).

    An output is binary when its RequestedOutput says so, or says nothing and `binary_default`
    (the request's binary_data_output) is true. Binary blobs follow the JSON in output order.
    """
    parts, json_length = encode_infer_response_parts(response, requested, binary_default)
    return (parts[0] if len(parts) == 1 else b"".join(parts)), json_length


# The JSON of answers whose outputs all go binary (numeric, no parameters, no id or answer
# parameters), by what decides it: the model and version, the request's binary default and
# named outputs, and each output's name, datatype and shape. Such a JSON is the same for every
# answer of that shape, and building and serializing it was half of a small answer's encoding
# (bench/FINDINGS.md 38). Kept with the binary sizes it announces; at most this many.
ANSWER_HEADS_KEPT = 256
_answer_heads: dict[tuple[Any, ...], tuple[bytes, list[int]]] = {}


def encode_infer_response_parts(
    response: InferResponse, requested: list[RequestedOutput] | None, binary_default: bool
) -> tuple[list[Buffer], int | None]:
    """`encode_infer_response` left in pieces: the JSON, then each binary output as a view of
    its array (no copy), for a writer that sends them as they are (one `writelines`)."""
    key = _answer_key(response, requested, binary_default)
    if key is None:
        return _encoded_parts(response, requested, binary_default)
    known = _answer_heads.get(key)
    if known is not None:
        head, sizes = known
        blobs: list[Buffer] = [
            datatypes.raw_from_tensor(_wire_array(tensor), tensor.datatype)
            for tensor in response.outputs
        ]
        if list(map(len, blobs)) == sizes:
            return [head, *blobs], len(head)
    parts, json_length = _encoded_parts(response, requested, binary_default)
    if (
        json_length is not None
        and len(parts) == len(response.outputs) + 1
        and len(_answer_heads) < ANSWER_HEADS_KEPT
    ):
        _answer_heads[key] = (bytes(parts[0]), [len(part) for part in parts[1:]])
    return parts, json_length


def _answer_key(
    response: InferResponse, requested: list[RequestedOutput] | None, binary_default: bool
) -> tuple[Any, ...] | None:
    """What an answer's JSON depends on, when it can be remembered (else None)."""
    if response.id or response.parameters:
        return None
    outputs = []
    for tensor in response.outputs:
        if tensor.parameters or tensor.datatype == "BYTES":  # sizes and entries vary
            return None
        outputs.append((tensor.name, tensor.datatype, tuple(tensor.shape)))
    asked = tuple([(output.name, output.binary) for output in requested]) if requested else ()
    return (response.model_name, response.model_version, binary_default, asked, tuple(outputs))


def _encoded_parts(
    response: InferResponse, requested: list[RequestedOutput] | None, binary_default: bool
) -> tuple[list[Buffer], int | None]:
    choices = {output.name: output.binary for output in requested} if requested else {}
    entries: list[dict[str, Any]] = []
    blobs: list[Buffer] = []
    for tensor in response.outputs:
        choice = choices.get(tensor.name)
        if in_shared_memory(tensor.parameters):  # written to its region: no data here
            entries.append(
                {
                    "name": tensor.name,
                    "datatype": tensor.datatype,
                    "shape": [int(dim) for dim in tensor.shape],
                }
            )
        elif binary_default if choice is None else choice:
            blob = datatypes.raw_from_tensor(_wire_array(tensor), tensor.datatype)
            entries.append(_output_entry(tensor, len(blob)))
            blobs.append(blob)
        else:
            entry = _output_entry(tensor, None)
            entry["data"] = json_data(tensor)
            entries.append(entry)
    header = _dumps(_response_document(response, entries))
    if not blobs:
        return [header], None
    return [header, *blobs], len(header)


def encode_error(message: str) -> bytes:
    """The error body every failed HTTP call carries."""
    return orjson.dumps({"error": message})


def _response_document(response: InferResponse, outputs: list[dict[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    if response.id:
        document["id"] = response.id
    document["model_name"] = response.model_name
    document["model_version"] = str(response.model_version)
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = outputs
    return document


def _output_entry(tensor: Tensor, binary_size: int | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": tensor.name,
        "datatype": tensor.datatype,
        "shape": [int(dim) for dim in tensor.shape],
    }
    if binary_size is not None:
        entry["parameters"] = {**tensor.parameters, "binary_data_size": binary_size}
    elif tensor.parameters:
        entry["parameters"] = tensor.parameters
    return entry


def _wire_array(tensor: Tensor) -> np.ndarray:
    """The output as its datatype's native little-endian numpy dtype (BYTES left as is)."""
    datatype = datatypes.BY_NAME.get(tensor.datatype)
    if datatype is None:
        raise InternalError(f"output '{tensor.name}' has unknown datatype '{tensor.datatype}'")
    array = np.asarray(tensor.data)
    if datatype.numpy is None or array.dtype == datatype.numpy:
        return array
    if datatype.name == "BF16" and array.dtype.kind == "f":
        return _float_to_bf16_bits(array)
    return array.astype(datatype.numpy)


def _float_to_bf16_bits(array: np.ndarray) -> np.ndarray:
    """The top 16 bits of each float32 (truncation), which is what BF16 on the wire carries."""
    return (np.ascontiguousarray(array, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def json_data(tensor: Tensor) -> Any:
    """Flat row-major JSON data: numpy arrays go to orjson as is; BYTES become strings."""
    array = _wire_array(tensor)
    if tensor.datatype == "BYTES":
        return [_as_text(item) for item in array.reshape(-1).tolist()]
    if tensor.datatype == "BF16":
        array = (array.astype(np.uint32) << 16).view(np.float32)
    # orjson needs C-contiguous native-endian arrays; FP16 it writes as float32 values.
    return np.ascontiguousarray(array).reshape(-1)


def _as_text(item: Any) -> str:
    """BYTES elements for JSON: UTF-8 decoded; invalid sequences become U+FFFD.

    Triton copies raw bytes into the JSON string, which makes invalid JSON for non-UTF-8
    data; replacing keeps the body valid. Clients that need exact bytes ask for binary.
    """
    if isinstance(item, (bytes, bytearray)):
        return item.decode("utf-8", errors="replace")
    if isinstance(item, str):
        return item
    return str(item)


def _dumps(document: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(document, option=_DUMPS_OPTIONS)
    except orjson.JSONEncodeError as exc:
        raise InternalError(f"failed to serialize the inference response: {exc}") from None


# --------------------------------------------------------------------------- metadata, index


def encode_model_metadata(meta: ModelMetadata) -> dict[str, Any]:
    """GET /v2/models/{model}: the model metadata document."""
    return {
        "name": meta.name,
        "versions": meta.versions,
        "platform": meta.platform,
        "inputs": _tensor_metadata(meta.inputs),
        "outputs": _tensor_metadata(meta.outputs),
    }


def _tensor_metadata(items: Iterable[TensorMetadata]) -> list[dict[str, Any]]:
    return [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in items]


def encode_repository_index(entries: Iterable[IndexEntry]) -> list[dict[str, str]]:
    """POST /v2/repository/index: version, state and reason only where set, as in Triton."""
    document: list[dict[str, str]] = []
    for entry in entries:
        item: dict[str, str] = {"name": entry.name}
        if entry.version:
            item["version"] = entry.version
        if entry.state:
            item["state"] = entry.state
        if entry.reason:
            item["reason"] = entry.reason
        document.append(item)
    return document


# --------------------------------------------------------------------------- statistics


def _duration(d: DurationSnapshot) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def encode_statistics(stats: StatisticsSnapshot) -> dict[str, Any]:
    """Triton's statistics JSON for one version: every key present, counts as JSON numbers
    (the same fields as gRPC's ModelStatistics, protocol/grpc/codec.py)."""
    return {
        "name": stats.name,
        "version": stats.version,
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {
            "success": _duration(stats.success),
            "fail": _duration(stats.fail),
            "queue": _duration(stats.queue),
            "compute_input": _duration(stats.compute_input),
            "compute_infer": _duration(stats.compute_infer),
            "compute_output": _duration(stats.compute_output),
            "cache_hit": _duration(stats.cache_hit),
            "cache_miss": _duration(stats.cache_miss),
        },
        "response_stats": {},
        "batch_stats": [
            {
                "batch_size": b.batch_size,
                "compute_input": _duration(b.compute_input),
                "compute_infer": _duration(b.compute_infer),
                "compute_output": _duration(b.compute_output),
            }
            for b in stats.batch_stats
        ],
        "memory_usage": [],
    }


def encode_statistics_response(items: Iterable[StatisticsSnapshot]) -> dict[str, Any]:
    """GET /v2/models[/{model}[/versions/{v}]]/stats."""
    return {"model_stats": [encode_statistics(s) for s in items]}
