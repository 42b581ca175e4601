"""The one internal request/response type. Each frontend converts into it exactly once.

Tensors hold numpy arrays: fixed-size dtypes are usually zero-copy views over the wire buffer,
BYTES tensors are object arrays of `bytes`.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Optional

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
    binary: Optional[bool] = None
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
    outputs: Optional[list[RequestedOutput]] = None
    parameters: dict[str, Any] = field(default_factory=dict)
    # Filled by validation (scheduler/validation.py) once the model config is known.
    batch_size: int = 0
    priority: int = 0
    timeout_us: int = 0
    # Monotonic nanoseconds at which the frontend finished decoding it.
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    # Set by the scheduler when the request is admitted; the caller awaits it.
    future: Optional[asyncio.Future] = None

    def input(self, name: str) -> Optional[Tensor]:
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
