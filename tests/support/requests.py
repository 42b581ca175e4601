"""What a decoded InferRequest says, as plain values: two decodes of the same bytes (a full one
and one from a request plan) must say the same."""

from __future__ import annotations

from protocol.types import InferRequest


def request_fields(request: InferRequest) -> tuple:
    return (
        request.model_name,
        request.model_version,
        request.id,
        request.parameters,
        [(t.name, t.datatype, t.shape, t.data.tolist(), t.parameters) for t in request.inputs],
        request.outputs,
    )
