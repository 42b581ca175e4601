"""Checks of parameter values as they arrive decoded from either wire (JSON or gRPC
InferParameter), shared by the codecs and the shared-memory parameters."""

from __future__ import annotations

from typing import Any

from protocol.errors import InvalidArgument


def is_uint(value: Any) -> bool:
    """An unsigned integer (bool is refused: it is an int to Python, not to JSON)."""
    return type(value) is int and value >= 0


def is_bool(value: Any) -> bool:
    return type(value) is bool


# Trace settings that hold one integer, with the lowest value each takes (trace_count's -1 is
# "no limit") and the range Triton's texts name: it parses them with std::stoi.
TRACE_NUMBER_LOW = {"trace_rate": 0, "trace_count": -1, "log_frequency": 0}
_TRACE_RANGE = {"trace_rate": "[ 0, 4294967295 ]", "log_frequency": "[ 0, 4294967295 ]"}
_INT32_MAX = 2**31 - 1


def check_trace_number(key: str, text: str, grpc: bool = False) -> int:
    """A trace setting's integer text, refused (400 / INVALID_ARGUMENT) in Triton's words: not
    an integer, out of range, or trace_count below -1 (whose text differs by one space between
    Triton's HTTP and gRPC frontends). Stricter than std::stoi on purpose: "12abc" and a
    negative rate are a client's mistake, not 12 and a wrapped unsigned number."""
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] in "+-" else stripped
    if not digits.isascii() or not digits.isdigit():
        raise InvalidArgument(f"Unable to parse '{key}', got: {text}")
    value = int(stripped)
    low = TRACE_NUMBER_LOW[key]
    if key == "trace_count" and value < low:
        space = " " if grpc else ""
        raise InvalidArgument(
            f"Unable to parse 'trace_count'. Expecting value >= -1, got:{space}{text}"
        )
    if value < low or value > _INT32_MAX:
        span = _TRACE_RANGE.get(key, f"[ -1, {_INT32_MAX} ]")
        raise InvalidArgument(f"Unable to parse '{key}', value is out of range {span}, got: {text}")
    return value
