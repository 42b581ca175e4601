"""What the REST request modules (rest_decode, rest_inputs) and the encoder share, in a module of
its own so that neither direction imports the other."""

from __future__ import annotations

from typing import Any

Buffer = bytes | bytearray | memoryview

HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"


def is_uint(value: Any) -> bool:
    """A JSON unsigned integer (bool is refused: it is an int to Python, not to JSON)."""
    return type(value) is int and value >= 0


def is_bool(value: Any) -> bool:
    return type(value) is bool
