"""InferRequest and InferResponse as plain tuples, for the link between a frontend process and
the model owner (server/multiprocess/link.py).

Why not pickle the dataclasses themselves: a slotted dataclass pickles through Python-level
__getstate__/__setstate__ that set each field one by one, several times per request; tuples,
strings and dicts pickle in C. Tensor data goes as a PickleBuffer that pickle protocol 5 hands
over out of band (through shared memory, server/multiprocess/link.py) and comes back as a numpy
view. Scheduling fields (batch size, priority, timeout) are left out: the owner fills them when it
admits the request.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from protocol.types import InferRequest, InferResponse, RequestedOutput, Tensor


def _pack_data(data: np.ndarray) -> Any:
    """Fixed-size data as (dtype, shape, PickleBuffer): pickle hands the buffer out of band
    without numpy's own reduce, which costs several times more both ways. Object (BYTES)
    arrays pickle as they are."""
    if data.dtype.hasobject:
        return data
    if not data.flags.c_contiguous:
        data = np.ascontiguousarray(data)
    return data.dtype.str, data.shape, pickle.PickleBuffer(data)  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ on Python 3.12+ only


def _unpack_data(packed: Any) -> np.ndarray:
    """The array over its buffer, built in one call: the owner runs this for every tensor
    handed over, and `frombuffer(...).reshape(...)` costs three times as much (an empty
    buffer needs no case of its own here)."""
    if type(packed) is not tuple:
        return packed
    dtype, shape, buffer = packed
    return np.ndarray(shape, dtype, buffer)


def _pack_tensors(tensors: list[Tensor]) -> list[tuple]:
    return [
        (t.name, t.datatype, t.shape, _pack_data(t.data), t.parameters or None) for t in tensors
    ]


def _unpack_tensors(packed: list[tuple]) -> list[Tensor]:
    return [
        Tensor(name, datatype, shape, _unpack_data(data), parameters or {})
        for name, datatype, shape, data, parameters in packed
    ]


def pack_request(request: InferRequest) -> tuple:
    outputs: list[tuple] | None = None
    if request.outputs is not None:
        outputs = [
            (o.name, o.binary, o.classification, o.parameters or None) for o in request.outputs
        ]
    return (
        request.model_name,
        request.model_version,
        request.id,
        _pack_tensors(request.inputs),
        outputs,
        request.parameters or None,
        request.arrival_ns,
        request.traceparent,
        request.received,
    )


def unpack_request(packed: tuple) -> InferRequest:
    (name, version, ident, inputs, outputs, parameters, arrival_ns, traceparent, received) = packed
    requested: list[RequestedOutput] | None = None
    if outputs is not None:
        requested = [
            RequestedOutput(o_name, binary, classification, o_parameters or {})
            for o_name, binary, classification, o_parameters in outputs
        ]
    return InferRequest(
        name,
        version,
        ident,
        _unpack_tensors(inputs),
        requested,
        parameters or {},
        arrival_ns=arrival_ns,
        traceparent=traceparent,
        received=received,
    )


def pack_response(response: InferResponse) -> tuple:
    return (
        response.model_name,
        response.model_version,
        response.id,
        _pack_tensors(response.outputs),
        response.parameters or None,
    )


def unpack_response(packed: Any) -> InferResponse:
    name, version, ident, outputs, parameters = packed
    return InferResponse(name, version, ident, _unpack_tensors(outputs), parameters or {})
