"""server/observability/log_escaping.py: no log record carries a control character."""

from __future__ import annotations

import io
import logging

import pytest

from server.observability import log_escaping


@pytest.fixture
def stream() -> io.StringIO:
    log_escaping.install()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("test_log_escaping")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield out
    logger.removeHandler(handler)


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_arguments_and_messages_are_escaped(stream: io.StringIO) -> None:
    log = logging.getLogger("test_log_escaping")
    log.info("successfully loaded '%s'", "x'\nINFO successfully loaded 'simple")
    log.info("names %s and %r, count %d", ["a\nb"], "c\rd", 3)
    log.info("an f-string with\na newline")
    log.info("%(who)s said", {"who": "me\nINFO forged"})
    assert _lines(stream) == [
        "INFO successfully loaded 'x'\\nINFO successfully loaded 'simple'",
        "INFO names ['a\\nb'] and 'c\\\\rd', count 3",
        "INFO an f-string with\\na newline",
        "INFO me\\nINFO forged said",
    ]


def test_an_exception_message_is_escaped_and_its_frames_kept(stream: io.StringIO) -> None:
    log = logging.getLogger("test_log_escaping")
    try:
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise ValueError("bad name\nINFO forged line") from exc
    except ValueError:
        log.exception("unexpected error in %s", "/v2/x")
    lines = _lines(stream)
    assert lines[0] == "ERROR unexpected error in /v2/x"
    assert "ValueError: bad name\\nINFO forged line" in lines
    assert not any(line.startswith("INFO forged") for line in lines)
    assert any(line.startswith("  File ") for line in lines)
    assert "KeyError: 'inner'" in lines


def test_uvicorn_access_formatter_still_reads_its_arguments(stream: io.StringIO) -> None:
    from uvicorn.logging import AccessFormatter

    handler = logging.getLogger("test_log_escaping").handlers[0]
    handler.setFormatter(AccessFormatter("%(message)s", use_colors=False))
    logging.getLogger("test_log_escaping").info(
        '%s - "%s %s HTTP/%s" %d', "127.0.0.1:1", "GET", "/v2/models/a\nb", "1.1", 404
    )
    assert _lines(stream) == ['127.0.0.1:1 - "GET /v2/models/a\\nb HTTP/1.1" 404']
