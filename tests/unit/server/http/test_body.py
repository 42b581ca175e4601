"""server/http/body.py: the one owner of --http-max-input-size for both HTTP body readers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from protocol.errors import InvalidArgument, TooLarge
from server.http.body import BodyBuffer, BodyLimit

TOO_LARGE = (
    "request body size exceeds the maximum allowed input size of 10 bytes. "
    "Use --http-max-input-size to increase the limit."
)


async def _chunks(parts: list[bytes], seen: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        seen.append(part)
        yield part


def _collect(
    limit: BodyLimit, parts: list[bytes], headers: dict[str, str] | None = None
) -> tuple[bytes, list[bytes]]:
    seen: list[bytes] = []
    body = asyncio.run(limit.collect(_chunks(parts, seen), headers or {}))
    return body, seen


def test_the_error_text_is_triton_like_and_unchanged() -> None:
    error = BodyLimit(10).too_large()
    assert isinstance(error, TooLarge) and error.message == TOO_LARGE
    assert error.http_status() == 413


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    with pytest.raises(TooLarge, match="maximum allowed input size of 10 bytes"):
        _collect(BodyLimit(10), [b"x"], {"content-length": "11"})
    BodyLimit(10).check_declared({"content-length": "10"})
    BodyLimit(10).check_declared({})


def test_a_malformed_content_length_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="invalid Content-Length '-1'"):
        BodyLimit(10).check_declared({"content-length": "-1"})


def test_the_running_total_is_refused_as_chunks_arrive() -> None:
    seen: list[bytes] = []

    async def run() -> None:
        await BodyLimit(10).collect(_chunks([b"123456", b"78901", b"never read"], seen), {})

    with pytest.raises(TooLarge) as error:
        asyncio.run(run())
    assert error.value.message == TOO_LARGE
    assert seen == [b"123456", b"78901"]  # the chunk after the one over the limit is not read


def test_bodies_within_the_limit_come_back_whole() -> None:
    limit = BodyLimit(10)
    assert _collect(limit, [b"12345", b"", b"67890"])[0] == b"1234567890"
    assert _collect(limit, [])[0] == b""
    one = b"abc"
    assert _collect(limit, [one])[0] is one  # a single chunk is not copied


def test_the_buffer_keeps_uvicorn_chunks_without_copying() -> None:
    buffer = BodyBuffer(BodyLimit(10))
    chunk = bytearray(b"12345")
    buffer.add(chunk)
    assert buffer.join() is chunk and buffer.total == 5
    buffer.add(bytearray(b"67890"))
    assert buffer.join() == b"1234567890"
    with pytest.raises(TooLarge):
        buffer.add(b"1")
