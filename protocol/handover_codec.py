"""InferRequest and InferResponse as plain tuples, for the link between a frontend process and
the model owner (server/handover.py).

Why not pickle the dataclasses themselves: a slotted dataclass pickles through Python-level
__getstate__/__setstate__ that set each field one by one, several times per request; tuples,
strings and dicts pickle in C. Tensor data stays a numpy array, so pickle protocol 5 still hands
it over out of band (shared memory). Scheduling fields (batch size, priority, timeout) are left
out: the owner fills them when it admits the request.
"""
from __future__ import annotations

from typing import Any, Optional

from protocol.types import InferRequest, InferResponse, RequestedOutput, Tensor


def _pack_tensors(tensors: list[Tensor]) -> list[tuple]:
    return [(t.name, t.datatype, t.shape, t.data, t.parameters or None) for t in tensors]


def _unpack_tensors(packed: list[tuple]) -> list[Tensor]:
    return [Tensor(name, datatype, shape, data, parameters or {})
            for name, datatype, shape, data, parameters in packed]


def pack_request(request: InferRequest) -> tuple:
    outputs: Optional[list[tuple]] = None
    if request.outputs is not None:
        outputs = [(o.name, o.binary, o.classification, o.parameters or None)
                   for o in request.outputs]
    return (request.model_name, request.model_version, request.id,
            _pack_tensors(request.inputs), outputs, request.parameters or None,
            request.arrival_ns)


def unpack_request(packed: tuple) -> InferRequest:
    name, version, ident, inputs, outputs, parameters, arrival_ns = packed
    requested: Optional[list[RequestedOutput]] = None
    if outputs is not None:
        requested = [RequestedOutput(o_name, binary, classification, o_parameters or {})
                     for o_name, binary, classification, o_parameters in outputs]
    return InferRequest(name, version, ident, _unpack_tensors(inputs), requested,
                        parameters or {}, arrival_ns=arrival_ns)


def pack_response(response: InferResponse) -> tuple:
    return (response.model_name, response.model_version, response.id,
            _pack_tensors(response.outputs), response.parameters or None)


def unpack_response(packed: Any) -> InferResponse:
    name, version, ident, outputs, parameters = packed
    return InferResponse(name, version, ident, _unpack_tensors(outputs), parameters or {})
