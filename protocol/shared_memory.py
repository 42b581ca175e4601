"""The shared-memory extension's wire pieces, shared by both codecs: the tensor parameters that
name a region, the register request's JSON body, and the marker of an output written to shared
memory (sent back with no data).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from protocol.errors import InvalidArgument
from protocol.values import is_uint

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
PARAMETERS = (REGION, OFFSET, BYTE_SIZE)


def in_shared_memory(parameters: dict[str, Any]) -> bool:
    """A tensor whose data is in a registered region (an input) or goes to one (an output)."""
    return REGION in parameters


def placeholder(numpy_type: Any) -> np.ndarray:
    """The data of an input until the process that owns the regions reads it
    (server/core/client_shm.py); it travels through the frontend link as nothing."""
    return np.empty(0, dtype=numpy_type if numpy_type is not None else object)


def decode_register(document: Any) -> tuple[str, int, int]:
    """`{"key", "offset"?, "byte_size"}` -> (key, offset, byte_size), with Triton's texts."""
    if not isinstance(document, dict):
        raise InvalidArgument("Shared memory register request must be a JSON object")
    if "key" not in document:
        raise InvalidArgument("Shared memory register request has no 'key' field")
    key = document["key"]
    if not isinstance(key, str):
        raise InvalidArgument("Unable to parse 'key': expected a string")
    offset = document.get("offset", 0)
    if not is_uint(offset):
        raise InvalidArgument("Unable to parse 'offset': expected a non-negative integer")
    if "byte_size" not in document:
        raise InvalidArgument("Shared memory register request has no 'byte_size' field")
    byte_size = document["byte_size"]
    if not is_uint(byte_size):
        raise InvalidArgument("Unable to parse 'byte_size': expected a non-negative integer")
    return key, offset, byte_size


def cuda_unsupported(name: str) -> InvalidArgument:
    """What Triton built without GPU support answers a CUDA registration."""
    if not name:
        return InvalidArgument("'region name' is necessary to register cuda shared memory region")
    return InvalidArgument(
        f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
    )
