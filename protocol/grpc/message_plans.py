"""The gRPC side of protocol/request_plans.py: a small ModelInferRequest decoded from the plan of
its metadata, everything in it but its raw_input_contents.

protobuf writes a message's fields in field order, so the raw_input_contents (field 7, the last)
follow all the metadata: the key is the bytes before the first of them, found by the top-level
walk of protocol/grpc/wire.py (`scan`). A message whose raw entries are not all at its end, or
which has none, is decoded in full, as before.

Looking up costs the walk (a few microseconds for a message of a few inputs); a full decode of
the same message costs several times more. Should the metadata change with every message (a
client that sets a new `id` each time), the walk would be paid for nothing, so after
`MISSES_BEFORE_REST` lookups in a row that find nothing, the next `REST_MESSAGES` messages are
decoded in full without one.
"""

from __future__ import annotations

from typing import Any

from protocol import datatypes, shared_memory
from protocol.datatypes import BY_NAME
from protocol.grpc.wire import SCAN_FROM_BYTES, scan
from protocol.request_plans import InputPlan, RequestPlans, plan_for
from protocol.types import InferRequest, Tensor

MISSES_BEFORE_REST = 64
REST_MESSAGES = 1024

# The key: the metadata's bytes; the spans of the raw entries in the message.
Key = tuple[tuple[bytes], list[tuple[int, int]]]


class MessagePlans:
    """Plans of ModelInferRequest metadata, and the bookkeeping that stops looking when
    nothing is ever found."""

    def __init__(self, plans: RequestPlans | None = None) -> None:
        self.plans = plans or RequestPlans()
        self.misses = 0  # lookups in a row that found nothing
        self.resting = 0  # messages still to decode in full without a lookup

    def key_of(self, data: bytes) -> Key | None:
        """The message's key, or None when it is not one a plan can serve."""
        if self.resting:
            self.resting -= 1
            return None
        if len(data) >= SCAN_FROM_BYTES:
            return None
        spans = scan(data)
        if spans is None:
            return None
        kept, raw = spans
        if not raw or len(kept) != 1 or kept[0][0] != 0 or kept[0][1] >= raw[0][0]:
            return None  # no raw entries, or metadata after them
        return (data[: kept[0][1]],), raw

    def planned(self, key: Key, data: bytes) -> InferRequest | None:
        """The request, from its plan; None when there is none (decode it in full, then
        `keep`)."""
        plan = self.plans.get(key[0])
        raw = key[1]
        if plan is None or len(raw) != len(plan.inputs):
            self.misses += 1
            if self.misses >= MISSES_BEFORE_REST:
                self.misses, self.resting = 0, REST_MESSAGES
            return None
        self.misses = 0
        view = memoryview(data)
        request = plan.new_request(plan.model_name, plan.model_version)
        request.inputs = [
            Tensor(
                planned.name,
                planned.datatype.name,
                planned.shape,
                datatypes.tensor_from_raw(
                    planned.datatype, planned.shape, view[start:stop], planned.name
                ),
                dict(planned.parameters) if planned.parameters else {},
            )
            for planned, (start, stop) in zip(plan.inputs, raw, strict=True)
        ]
        return request

    def keep(self, key: Key, message: Any, request: InferRequest) -> None:
        """Keep the plan of a message decoded in full into `request`, when it may serve
        others."""
        inputs = []
        for tensor, decoded in zip(message.inputs, request.inputs, strict=True):
            if shared_memory.REGION in tensor.parameters or tensor.HasField("contents"):
                return
            inputs.append(
                InputPlan(
                    decoded.name,
                    BY_NAME[decoded.datatype],
                    decoded.shape,
                    int(decoded.data.size),
                    0,
                    dict(decoded.parameters),
                )
            )
        plan = plan_for(request, inputs)
        if plan is not None:
            self.plans.keep(key[0], plan)
