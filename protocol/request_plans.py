"""Infer requests' metadata kept decoded by their bytes, for both protocols.

Why: a client sends the same metadata with every request of one shape: over HTTP the JSON
header of a binary request (tritonclient with `binary_data=True`, perf_analyzer, KServe's v2
client), over gRPC everything in a ModelInferRequest but its raw_input_contents; byte for byte:
the inputs' names, datatypes and shapes and the outputs asked for. Parsing and checking it is
most of a small request's decode (bench/FINDINGS.md section 35). Metadata accepted once is
looked up the next time instead (protocol/rest/header_plans.py, protocol/grpc/message_plans.py),
and only the tensor bytes are read per request, each input's checked against its size and BYTES
elements parsed, by the same code as a full decode.

Only metadata that decoded without error is kept, and only when it describes tensor bytes
alone: no JSON `data` or typed contents (their values would be shared between requests), no
shared-memory input or output (their regions are bound per request). A table holds at most
`PLAN_ENTRIES` keys of at most `PLAN_MAX_KEY_BYTES` bytes each, the first kept dropped first, so
a client that sends new metadata every time costs a failed lookup and an insertion per request,
in bounded memory.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from protocol import shared_memory
from protocol.datatypes import DataType
from protocol.types import InferRequest, RequestedOutput

# The keys a table holds, and the largest key it keeps (64 inputs and outputs fit).
PLAN_ENTRIES = 256
PLAN_MAX_KEY_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class InputPlan:
    """One input as its metadata declared it."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    count: int  # elements
    size: int  # its binary_data_size (HTTP); 0 over gRPC, where each raw entry is its own
    parameters: dict[str, Any]  # without binary_data_size; copied for each request


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """Everything the metadata says, checked: what a request needs besides its tensor bytes."""

    request_id: str
    parameters: dict[str, Any]
    inputs: tuple[InputPlan, ...]
    outputs: tuple[RequestedOutput, ...] | None
    binary_size: int  # the bytes every input takes together (HTTP's binary section)
    # the request's model (gRPC's metadata holds it; HTTP's is in the URL, not in the key)
    model_name: str = ""
    model_version: str = ""

    def new_request(self, model_name: str, model_version: str) -> InferRequest:
        """A request of its own (every dict and list new), its inputs not yet read."""
        outputs = self.outputs
        return InferRequest(
            model_name=model_name,
            model_version=model_version,
            id=self.request_id,
            parameters=dict(self.parameters) if self.parameters else {},
            outputs=None
            if outputs is None
            else [
                RequestedOutput(o.name, o.binary, o.classification, dict(o.parameters))
                for o in outputs
            ],
        )


def plan_for(
    request: InferRequest, inputs: list[InputPlan], binary_size: int = 0
) -> RequestPlan | None:
    """The plan of a request decoded in full from metadata that described its `inputs`; None
    when an output goes to shared memory (bound per request)."""
    outputs = request.outputs
    if outputs is not None and any(shared_memory.in_shared_memory(o.parameters) for o in outputs):
        return None
    return RequestPlan(
        request.id,
        dict(request.parameters),
        tuple(inputs),
        None
        if outputs is None
        else tuple(
            RequestedOutput(o.name, o.binary, o.classification, dict(o.parameters)) for o in outputs
        ),
        binary_size,
        request.model_name,
        request.model_version,
    )


class RequestPlans:
    """Plans by key (its first item the metadata's bytes); past `entries`, the one kept first
    goes."""

    def __init__(self, entries: int = PLAN_ENTRIES, max_key: int = PLAN_MAX_KEY_BYTES):
        self.entries = entries
        self.max_key = max_key
        self._plans: OrderedDict[tuple, RequestPlan] = OrderedDict()

    def get(self, key: tuple) -> RequestPlan | None:
        return self._plans.get(key)

    def keep(self, key: tuple, plan: RequestPlan) -> None:
        if len(key[0]) > self.max_key:
            return
        plans = self._plans
        plans[key] = plan
        if len(plans) > self.entries:
            plans.popitem(last=False)

    def __len__(self) -> int:
        return len(self._plans)
