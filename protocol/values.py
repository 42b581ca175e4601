"""Checks of parameter values as they arrive decoded from either wire (JSON or gRPC
InferParameter), shared by the codecs and the shared-memory parameters."""

from __future__ import annotations

from typing import Any


def is_uint(value: Any) -> bool:
    """An unsigned integer (bool is refused: it is an int to Python, not to JSON)."""
    return type(value) is int and value >= 0


def is_bool(value: Any) -> bool:
    return type(value) is bool
