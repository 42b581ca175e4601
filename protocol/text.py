"""Client-chosen text, made safe to put into an error or a log line.

A model name, version, request or sequence id, header value or region name comes from a
client: shown raw, a newline in it writes a forged line into the server's log (a fake
"successfully loaded 'simple'"), and a 100 KiB name makes an error too large for gRPC's
metadata (8 KiB of headers, where `grpc-message` is percent-encoded). So such text is shown
through `shown()` (control characters escaped, cut at `echo_limit()` characters), every
ServerError's message passes `bounded_message()` (escaped, at most MAX_ERROR_BYTES), and the
server's log records pass `escape_controls()` (server/observability/log_escaping.py).
"""

from __future__ import annotations

import re

DEFAULT_ECHO_CHARS = 200  # --max-echo-chars
# An error message's UTF-8 bytes; percent-encoded as gRPC's grpc-message, at most 3x this,
# which leaves room under the 8 KiB metadata limit for the status and other trailers.
MAX_ERROR_BYTES = 2048

# C0 and C1 controls, DEL, the Unicode line and paragraph separators, and the bidirectional
# overrides and isolates (which reorder what a reader of the log sees).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

_echo_chars = DEFAULT_ECHO_CHARS


def set_echo_limit(chars: int) -> None:
    """Set once at start (--max-echo-chars) in each server process."""
    global _echo_chars
    if chars < 16:
        raise ValueError(f"the echo limit must be at least 16 characters, got {chars}")
    _echo_chars = chars


def echo_limit() -> int:
    return _echo_chars


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """`text` with every control character written as an escape (`\\n`, `\\x1b`, `\\u2028`):
    one line, whatever it held. Text without any is returned as it is (one regex search)."""
    if _CONTROLS.search(text) is None:
        return text
    return _CONTROLS.sub(_escape_one, text)


def has_controls(text: str) -> bool:
    return _CONTROLS.search(text) is not None


def cut(text: str, limit: int) -> str:
    """`text` cut at `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({len(text) - limit} more characters)"


def shown(value: object, limit: int | None = None) -> str:
    """A client-chosen value as an error or a log line shows it, between single quotes:
    control characters and quotes escaped (so a name cannot close its quotes and carry a
    line of its own, such as "successfully loaded 'simple'"), then cut at the echo limit
    (--max-echo-chars). A normal name is shown as it is."""
    text = value if isinstance(value, str) else str(value)
    text = escape_controls(text)
    if "'" in text:
        text = text.replace("'", "\\'")
    return cut(text, _echo_chars if limit is None else limit)


def bounded_message(message: str) -> str:
    """An error's message as a client receives it: escaped, and at most MAX_ERROR_BYTES of
    UTF-8 (so it always fits gRPC's metadata), cut with a note of how much was left out."""
    text = escape_controls(message)
    if len(text) * 4 <= MAX_ERROR_BYTES:
        return text
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= MAX_ERROR_BYTES:
        return text
    note = f"...({len(text)} characters in all)"
    head = encoded[: MAX_ERROR_BYTES - len(note)].decode("utf-8", "ignore")
    return head + note
