"""No log record of a server process holds a control character that a client could choose.

Sites quote client text with protocol/text.py's `shown()`, which keeps messages readable and
short; this is the guarantee underneath, for every logger and handler of the process (ours,
uvicorn's access and error logs, libraries'): a LogRecord factory escapes control characters
in the record's format string, its arguments and its exception's message as the record is
made, so a newline in a model name, header or id can never start a forged line. It changes
only records that hold one (a regex search per argument otherwise).

Escaping at record creation rather than in a handler's Filter or Formatter covers handlers
configured later too (uvicorn installs its own when it starts) and leaves the arguments in
place for formatters that read them (uvicorn's access formatter unpacks `record.args`).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from protocol.text import escape_controls

_PLAIN = (int, float, bool, type(None), bytes)


class _Escaped:
    """An argument of another type, shown through str() or repr() with controls escaped."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __str__(self) -> str:
        return escape_controls(str(self.value))

    def __repr__(self) -> str:
        return escape_controls(repr(self.value))


def _safe_arg(value: Any) -> Any:
    if isinstance(value, str):
        return escape_controls(value)
    if isinstance(value, _PLAIN):
        return value  # bytes: %s shows their repr, which escapes them already
    return _Escaped(value)


def _exception_text(exc_info: Any) -> str:
    """The traceback as logging writes it, with each exception's own message escaped (the
    frames are the server's source lines, kept as they are)."""
    exc_type, exc, tb = exc_info
    te = traceback.TracebackException(exc_type, exc, tb)
    own: set[str] = set()
    pending: list[traceback.TracebackException] = [te]
    seen: set[int] = set()
    while pending:
        one = pending.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        own.update(one.format_exception_only())
        pending.extend(e for e in (one.__cause__, one.__context__) if e is not None)
    parts = []
    for chunk in te.format():
        if chunk in own:
            ending = "\n" if chunk.endswith("\n") else ""
            chunk = escape_controls(chunk[: len(chunk) - len(ending)]) + ending
        parts.append(chunk)
    text = "".join(parts)
    return text[:-1] if text.endswith("\n") else text


def escape_record(record: logging.LogRecord) -> logging.LogRecord:
    """Escape what a client may have chosen in `record`, in place."""
    if isinstance(record.msg, str):
        record.msg = escape_controls(record.msg)
    args = record.args
    if isinstance(args, tuple):
        record.args = tuple(_safe_arg(a) for a in args)
    elif isinstance(args, dict):
        record.args = {k: _safe_arg(v) for k, v in args.items()}
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        try:
            record.exc_text = _exception_text(record.exc_info)
        except Exception:  # never lose the record over its traceback
            pass
    return record


_installed: list[Callable[..., logging.LogRecord]] = []


def install() -> None:
    """Make every log record of this process escaped (once per process; the server's start and
    each frontend process's call it)."""
    if _installed:
        return
    previous = logging.getLogRecordFactory()
    _installed.append(previous)

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return escape_record(previous(*args, **kwargs))

    logging.setLogRecordFactory(factory)
