"""The HTTP bodies of the trace and logging extensions -> the settings changes the core takes.

Trace values are strings, `trace_level` a list of strings, and `null` clears a model's override
(or resets a global setting); log values are booleans, an unsigned verbose level and strings.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import InvalidArgument
from protocol.text import shown


def decode_trace_settings(document: Any) -> dict[str, list[str] | None]:
    """`{"trace_rate": "10", "trace_level": ["TIMESTAMPS"], "trace_count": null, ...}`."""
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise InvalidArgument("trace setting request must be a JSON object")
    changes: dict[str, list[str] | None] = {}
    for key, value in document.items():
        if value is None:
            changes[key] = None
        elif isinstance(value, list):
            if not all(isinstance(item, str) for item in value):
                raise InvalidArgument(f"Unable to parse '{shown(key)}': expected strings")
            changes[key] = list(value) or None
        elif isinstance(value, str):
            changes[key] = [value]
        elif type(value) is int:  # lenient: a number where Triton wants its text
            changes[key] = [str(value)]
        else:
            raise InvalidArgument(f"Unable to parse '{shown(key)}': expected a string")
    return changes


def encode_trace_settings(settings: dict[str, list[str]]) -> dict[str, Any]:
    """Triton's JSON: `trace_level` as a list of strings, every other setting as a string."""
    return {
        key: list(values) if key == "trace_level" else (values[0] if values else "")
        for key, values in settings.items()
    }


def decode_log_settings(document: Any) -> dict[str, Any]:
    """`{"log_info": false, "log_verbose_level": 1, ...}`; the values are checked by the core."""
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise InvalidArgument("log setting request must be a JSON object")
    return dict(document)
