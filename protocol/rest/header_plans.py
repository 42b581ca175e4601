"""The JSON headers of binary infer requests, kept decoded by their bytes.

Why: a client that sends its tensors as binary (tritonclient with `binary_data=True`,
perf_analyzer, KServe's v2 client) sends the same JSON header with every request of one shape:
the inputs' names, datatypes, shapes and byte sizes and the outputs it asks for, byte for byte.
Parsing and checking that header is most of a small request's decode (bench/FINDINGS.md section
35). A header accepted once is looked up the next time instead, and only the binary section is
read per request: each input's bytes are still checked against its size, and BYTES elements
still parsed, by the same code as a full decode.

Only a header that decoded without error is kept, and only when it describes binary data
alone: no JSON `data` (its values would be shared between requests), no shared-memory input or
output (their regions are bound per request). The cache holds at most `PLAN_ENTRIES` headers of
at most `PLAN_MAX_HEADER_BYTES` bytes each, the oldest dropped first, so a client that sends a
new header every time costs one failed lookup and one insertion per request, in bounded memory.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from protocol import shared_memory
from protocol.datatypes import BY_NAME, DataType
from protocol.types import InferRequest, RequestedOutput

# The headers kept, and the largest header kept (a request of 64 inputs and outputs fits).
PLAN_ENTRIES = 256
PLAN_MAX_HEADER_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class InputPlan:
    """One input as its header declared it."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    count: int  # elements
    size: int  # its binary_data_size
    parameters: dict[str, Any]  # without binary_data_size; copied for each request


@dataclass(frozen=True, slots=True)
class HeaderPlan:
    """Everything a header says, checked: what a request needs besides its binary section."""

    request_id: str
    parameters: dict[str, Any]
    inputs: tuple[InputPlan, ...]
    outputs: tuple[RequestedOutput, ...] | None
    binary_size: int  # the bytes every input takes together

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


def plan_of(document: dict[str, Any], request: InferRequest) -> HeaderPlan | None:
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
    outputs = request.outputs
    if outputs is not None and any(shared_memory.in_shared_memory(o.parameters) for o in outputs):
        return None
    return HeaderPlan(
        request.id,
        dict(request.parameters),
        tuple(inputs),
        None
        if outputs is None
        else tuple(
            RequestedOutput(o.name, o.binary, o.classification, dict(o.parameters)) for o in outputs
        ),
        sum(plan.size for plan in inputs),
    )


class HeaderPlans:
    """Plans by (header bytes, the decode's limits); past `entries`, the one kept first goes."""

    def __init__(self, entries: int = PLAN_ENTRIES, max_header: int = PLAN_MAX_HEADER_BYTES):
        self.entries = entries
        self.max_header = max_header
        self._plans: OrderedDict[tuple[bytes, int, int | None], HeaderPlan] = OrderedDict()

    def get(self, key: tuple[bytes, int, int | None]) -> HeaderPlan | None:
        return self._plans.get(key)

    def keep(self, key: tuple[bytes, int, int | None], plan: HeaderPlan) -> None:
        if len(key[0]) > self.max_header:
            return
        plans = self._plans
        plans[key] = plan
        if len(plans) > self.entries:
            plans.popitem(last=False)

    def __len__(self) -> int:
        return len(self._plans)
