"""server/http/body.py: the one owner of --http-max-input-size for both HTTP body readers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from protocol.errors import InvalidArgument, Overloaded, TooLarge
from server.http.body import (
    BodyBudget,
    BodyBudgetExhausted,
    BodyBuffer,
    BodyLimit,
    resolve_inflight_budget,
)

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


# ----- --http-max-inflight-body-size: the bodies of all connections together -------------------
def test_the_budget_is_charged_per_chunk_and_given_back_once() -> None:
    budget = BodyBudget(10)
    limit = BodyLimit(8, budget)
    first, second = BodyBuffer(limit), BodyBuffer(limit)
    first.add(b"1234")
    second.add(b"123")
    assert budget.held == 7
    first.release()
    first.release()  # a second release gives nothing back twice
    assert budget.held == 3
    second.release()
    assert budget.held == 0


def test_a_chunk_past_the_budget_refuses_its_body_and_its_bytes_come_back() -> None:
    budget = BodyBudget(10)
    limit = BodyLimit(8, budget)
    holder, refused = BodyBuffer(limit), BodyBuffer(limit)
    holder.add(b"123456")
    refused.add(b"12")
    with pytest.raises(BodyBudgetExhausted) as error:
        refused.add(b"123")  # 6 + 5 > 10, though this body (5) is within its own limit
    assert isinstance(error.value, Overloaded) and error.value.retry_after == 1
    assert error.value.message == (
        "request bodies in flight exceed the server's budget of 10 bytes "
        "(--http-max-inflight-body-size); retry later"
    )
    refused.release()
    assert budget.held == 6  # only the holder's bytes are still counted
    holder.release()
    fresh = BodyBuffer(limit)
    fresh.add(b"12345678")  # with the others given back, a whole body fits again
    assert budget.held == 8


def test_a_body_refused_for_its_own_size_gives_its_bytes_back() -> None:
    budget = BodyBudget(100)
    buffer = BodyBuffer(BodyLimit(4, budget))
    with pytest.raises(TooLarge):
        buffer.add(b"12345")
    buffer.release()
    assert budget.held == 0


def test_collect_gives_the_budget_back_whether_it_joins_or_refuses() -> None:
    budget = BodyBudget(100)
    limit = BodyLimit(10, budget)
    assert _collect(limit, [b"12345", b"678"])[0] == b"12345678"
    assert budget.held == 0
    with pytest.raises(TooLarge):
        _collect(limit, [b"123456", b"78901"])
    assert budget.held == 0


def test_the_default_budget_holds_16_default_bodies_and_at_least_two_of_the_limit() -> None:
    assert resolve_inflight_budget(None, 64 * 1024 * 1024) == 1 << 30
    assert resolve_inflight_budget(None, 1 << 30) == 2 << 30
    assert resolve_inflight_budget(5000, 4096) == 5000
    assert BodyLimit(10).budget.max_bytes == 1 << 30
