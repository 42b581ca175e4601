"""The generate extension's wire form (`/generate`, `/generate_stream`), as Triton maps it.

Request: one JSON object. A member named like a model input becomes that input: a scalar or a
flat array, shaped to the input's dims (the batch dimension, for a batching model, is 1); a
`parameters` object gives request parameters (a member of it named like an input becomes that
input, as in Triton), and so does every other member (`id` too, which is also the request
id). Parameters must be strings, numbers or booleans.
Response: `{"id"?, "model_name", "model_version", <output name>: value, ...}`, where a
one-element output is a scalar and any other a flat list. `/generate_stream` sends each answer
as a server-sent event, `data: <json>\\n\\n`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from protocol import datatypes
from protocol.errors import InvalidArgument
from protocol.rest.encode import json_data
from protocol.rest.inputs import flatten, tensor_from_json
from protocol.text import shown
from protocol.types import InferRequest, InferResponse, Tensor

SSE_MEDIA_TYPE = "text/event-stream; charset=utf-8"
PARAMETER_TYPE_ERROR = (
    "parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
)
_NON_JSON = {"BYTES": "non-string as string", "BOOL": "non-boolean as boolean"}


class InputSchema:
    """What decoding needs of one input: its wire datatype and full shape (-1: any size)."""

    __slots__ = ("datatype", "shape")

    def __init__(self, datatype: str, shape: tuple[int, ...]) -> None:
        self.datatype = datatype
        self.shape = shape


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise _Duplicate(key)
        document[key] = value
    return document


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _parameter(key: str, value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)):
        return value
    raise InvalidArgument(PARAMETER_TYPE_ERROR.format(key=key))


def _shape_for(name: str, schema: InputSchema, count: int) -> tuple[int, ...]:
    """The input's shape holding `count` elements, or 400 when its dims cannot."""
    known = 1
    wildcards = 0
    for dim in schema.shape:
        if dim < 0:
            wildcards += 1
        else:
            known *= dim
    if wildcards == 0 and known == count:
        return schema.shape
    if wildcards == 1 and known and count % known == 0:
        return tuple(count // known if dim < 0 else dim for dim in schema.shape)
    if wildcards > 1 and known == 1:  # several open dims: the elements go on the last one
        last = max(index for index, dim in enumerate(schema.shape) if dim < 0)
        return tuple(
            count if index == last else (1 if dim < 0 else dim)
            for index, dim in enumerate(schema.shape)
        )
    raise InvalidArgument(
        f"Unable to convert the value of '{name}' ({count} element(s)) to "
        f"the shape {list(schema.shape)} of the model's input"
    )


def _tensor(name: str, schema: InputSchema, value: Any) -> Tensor:
    if isinstance(value, dict):
        wanted = _NON_JSON.get(schema.datatype, "non-number as number")
        raise InvalidArgument(f"input '{shown(name)}': attempt to access JSON {wanted}")
    data = value if isinstance(value, list) else [value]
    datatype = datatypes.BY_NAME.get(schema.datatype)
    if datatype is None:
        raise InvalidArgument(
            f"input '{name}' has datatype {schema.datatype}, which the "
            f"generate extension cannot fill from JSON"
        )
    count = len(flatten(data))
    try:
        flat = tensor_from_json(name, datatype, (count,), count, data, True)
    except InvalidArgument as exc:
        if schema.datatype in _NON_JSON:
            raise InvalidArgument(
                f"input '{name}': attempt to access JSON {_NON_JSON[schema.datatype]}"
            ) from exc
        raise
    shape = _shape_for(name, schema, flat.size)
    return Tensor(name, schema.datatype, shape, flat.reshape(shape))


def decode_generate(
    body: bytes, model_name: str, model_version: str, inputs: Mapping[str, InputSchema]
) -> InferRequest:
    """A generate body -> InferRequest (wire and schema checks only; the scheduler validates)."""
    try:
        document = json.loads(body or b"{}", object_pairs_hook=_no_duplicates)
    except _Duplicate as dup:
        what = "input" if dup.key in inputs else "parameter"
        raise InvalidArgument(f"{what} '{dup.key}' already exists in request") from None
    except ValueError as exc:
        raise InvalidArgument(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgument("the generate request must be a JSON object")
    tensors: list[Tensor] = []
    parameters: dict[str, Any] = {}
    request_id = ""
    for key, value in document.items():
        if key in inputs:
            tensors.append(_tensor(key, inputs[key], value))
        elif key == "parameters":
            if not isinstance(value, dict):
                raise InvalidArgument("Expected JSON object for keyword: 'parameters'")
            for name, item in value.items():
                if name in inputs:  # Triton maps a nested member named like an input to it
                    tensors.append(_tensor(name, inputs[name], item))
                else:
                    parameters[name] = _parameter(name, item)
        else:
            parameters[key] = _parameter(key, value)
            if key == "id":
                request_id = str(value)
    names = [tensor.name for tensor in tensors]
    for name in names:
        if names.count(name) > 1:  # at the top and inside "parameters"
            raise InvalidArgument(f"input '{name}' already exists in request")
    return InferRequest(model_name, model_version, request_id, tensors, None, parameters)


def encode_generate(response: InferResponse) -> dict[str, Any]:
    """An answer as the generate response object."""
    document: dict[str, Any] = {}
    if response.id:
        document["id"] = response.id
    document["model_name"] = response.model_name
    document["model_version"] = response.model_version
    for tensor in response.outputs:
        data = json_data(tensor)
        values = data.tolist() if hasattr(data, "tolist") else list(data)
        document[tensor.name] = values[0] if len(values) == 1 else values
    return document


def generate_body(response: InferResponse) -> bytes:
    return orjson.dumps(encode_generate(response))


def sse_event(payload: Mapping[str, Any] | None) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"
