"""The internal types the frontends convert into and out of, each exactly once.

Tensors hold numpy arrays: fixed-size dtypes are usually zero-copy views over the wire buffer,
BYTES tensors are object arrays of `bytes`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class Tensor:
    """A named tensor: KServe datatype name, shape and row-major data."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output parameters.

    `binary` is None when the output did not say (the request-level default then applies).
    `classification` is 0 when no top-k classification was asked for.
    """

    name: str
    binary: bool | None = None
    classification: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class InferRequest:
    """One inference request as every layer below the frontends sees it."""

    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    # None means "every output of the model".
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    # Filled when a scheduler admits it (scheduler/validation.py, scheduler/policy.py).
    batch_size: int = 0
    priority: int = 0
    timeout_us: int = 0
    # Filled by the sequence batcher: the `sequence_id` (uint64 or string; 0 = none) and
    # Triton's request flags (1 START, 2 END), which Python models read.
    correlation_id: int | str = 0
    sequence_flags: int = 0
    # Monotonic nanoseconds at which the frontend finished decoding it.
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    # The answers of a request to a decoupled model (protocol/stream.py ResponseStream),
    # set by the infer path; None for every other request.
    stream: Any = None
    # A sampled request's trace record (server/observability/tracing.py), stamped as the request
    # passes, and the client's W3C traceparent (read only in OpenTelemetry trace mode).
    trace: Any = None
    traceparent: str = ""
    # Where tracing is possible, the frontend's receive timestamps: ((name, ns), ...).
    received: tuple = ()

    def input(self, name: str) -> Tensor | None:
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        return None


@dataclass(slots=True)
class InferResponse:
    """The answer to one InferRequest: outputs in the order the model produces them."""

    model_name: str
    model_version: str
    id: str = ""
    outputs: list[Tensor] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)


# ----- what the core answers besides inference (both codecs encode these) ------------------


@dataclass(frozen=True)
class TensorMetadata:
    """One input or output of a model as metadata shows it (wire datatype, -1 for any size)."""

    name: str
    datatype: str
    shape: list[int]


@dataclass(frozen=True)
class ModelMetadata:
    """A model's metadata: the versions it serves and its tensors."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


@dataclass(frozen=True)
class IndexEntry:
    """One row of the repository index; "" where Triton leaves a field out."""

    name: str
    version: str = ""
    state: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class DurationSnapshot:
    """A statistics duration: how many times, and their total nanoseconds."""

    count: int = 0
    ns: int = 0


@dataclass(frozen=True, slots=True)
class BatchStatisticsSnapshot:
    """The compute durations of the executions of one batch size."""

    batch_size: int
    compute_input: DurationSnapshot = DurationSnapshot()
    compute_infer: DurationSnapshot = DurationSnapshot()
    compute_output: DurationSnapshot = DurationSnapshot()


@dataclass(frozen=True, slots=True)
class StatisticsSnapshot:
    """One version's statistics copied at one instant (scheduler/stats.py builds it under its
    lock), so the counts agree with each other and the codecs never see the live counters."""

    name: str
    version: str
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: DurationSnapshot = DurationSnapshot()
    fail: DurationSnapshot = DurationSnapshot()
    queue: DurationSnapshot = DurationSnapshot()
    compute_input: DurationSnapshot = DurationSnapshot()
    compute_infer: DurationSnapshot = DurationSnapshot()
    compute_output: DurationSnapshot = DurationSnapshot()
    cache_hit: DurationSnapshot = DurationSnapshot()
    cache_miss: DurationSnapshot = DurationSnapshot()
    # Ordered by batch size.
    batch_stats: tuple[BatchStatisticsSnapshot, ...] = ()
    pending: int = 0
