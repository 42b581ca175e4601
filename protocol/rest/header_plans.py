"""The REST side of protocol/request_plans.py: the plan of a binary request's JSON header."""

from __future__ import annotations

from typing import Any

from protocol import shared_memory
from protocol.datatypes import BY_NAME
from protocol.request_plans import InputPlan, RequestPlan, plan_for
from protocol.types import InferRequest


def plan_of(document: dict[str, Any], request: InferRequest) -> RequestPlan | None:
    """The plan of a header that decoded into `request`; None when it must not be kept."""
    entries = document["inputs"]
    inputs = []
    for entry, tensor in zip(entries, request.inputs, strict=True):
        parameters = entry.get("parameters") or {}
        size = parameters.get("binary_data_size")
        if "data" in entry or size is None or shared_memory.in_shared_memory(parameters):
            return None
        inputs.append(
            InputPlan(
                tensor.name,
                BY_NAME[tensor.datatype],
                tensor.shape,
                int(tensor.data.size),
                size,
                dict(tensor.parameters),
            )
        )
    return plan_for(request, inputs, sum(plan.size for plan in inputs))
