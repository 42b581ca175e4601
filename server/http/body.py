"""The bounds on HTTP request bodies: --http-max-input-size per body, and
--http-max-inflight-body-size for the bodies held by all connections together.

Why a module: two readers take HTTP bodies (the routed ASGI endpoints in server/http/routes.py and
the direct infer path in server/http/fast_path.py), and both must refuse the same bodies the same
way: a declared Content-Length over the limit before anything is read, and a running total over the
limit as chunks arrive, so an oversized body is never buffered. The per-body limit alone let
connections x 64 MiB be held at once (4,096 connections); the budget counts every body's bytes
from its first chunk until its request is answered, and a chunk that would pass it refuses that
body (503 with Retry-After: the server is busy, the body itself may be fine; the connection is
closed, the bytes are given back).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from protocol.errors import InvalidArgument, Overloaded, TooLarge

Chunk = bytes | bytearray

# The default budget: 16 bodies of the default 64 MiB limit at once, and never less than two
# bodies of the configured limit (so one largest body always fits beside another).
DEFAULT_INFLIGHT_BODY_SIZE = 1 << 30


def resolve_inflight_budget(requested: int | None, max_input_size: int) -> int:
    """--http-max-inflight-body-size, or its default for this --http-max-input-size."""
    if requested is not None:
        return requested
    return max(DEFAULT_INFLIGHT_BODY_SIZE, 2 * max_input_size)


class BodyBudget:
    """Bytes of request bodies held at once by one HTTP frontend (one per server process).

    Plain counters on the event loop: a reader adds a chunk's size as it takes the chunk and
    subtracts the body's total once its request is answered or refused.
    """

    __slots__ = ("held", "max_bytes", "reserved")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        # The part not yet received of the bodies being received into arrays of their own
        # (server/http/receive.py): committed memory all the same, so every check is against
        # held + reserved.
        self.reserved = 0

    def committed(self) -> int:
        """Bytes held, plus the rest of the bodies whose arrays are already allocated."""
        return self.held + self.reserved

    def exhausted(self) -> Overloaded:
        return BodyBudgetExhausted(
            f"request bodies in flight exceed the server's budget of {self.max_bytes} bytes "
            f"(--http-max-inflight-body-size); retry later"
        )


class BodyBudgetExhausted(Overloaded):
    """A body refused because the bodies of all connections together would pass the budget;
    its answer also closes the connection (the rest of the body is never read)."""


class BodyLimit:
    """The size limit of one HTTP frontend (built once, read on every request)."""

    __slots__ = ("budget", "max_bytes")

    def __init__(self, max_bytes: int, budget: BodyBudget | None = None) -> None:
        self.max_bytes = max_bytes
        self.budget = budget or BodyBudget(resolve_inflight_budget(None, max_bytes))

    def too_large(self) -> TooLarge:
        return TooLarge(
            f"request body size exceeds the maximum allowed input size of "
            f"{self.max_bytes} bytes. Use --http-max-input-size to increase the limit."
        )

    def check_declared(self, headers: Mapping[str, str]) -> None:
        """Refuse a Content-Length over the limit before reading the body."""
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise InvalidArgument(f"invalid Content-Length '{declared}'")
            if int(declared) > self.max_bytes:
                raise self.too_large()

    def check(self, size: int) -> None:
        """Refuse a body (or the part of it read so far) over the limit."""
        if size > self.max_bytes:
            raise self.too_large()

    async def collect(self, chunks: AsyncIterator[bytes], headers: Mapping[str, str]) -> bytes:
        """The whole body as sent, refused as soon as it is known to be over the limit."""
        self.check_declared(headers)
        body = BodyBuffer(self)
        try:
            async for chunk in chunks:
                body.add(chunk)
            return body.join()
        finally:
            body.release()  # joined or refused, the caller now holds the bytes alone


class BodyBuffer:
    """The chunks of one body as they arrive (kept, not copied), with their running total,
    which is charged to the frontend's BodyBudget until `release()` (call it in a `finally`)."""

    __slots__ = ("limit", "parts", "total")

    def __init__(self, limit: BodyLimit) -> None:
        self.limit = limit
        self.parts: list[Chunk] = []
        self.total = 0

    def add(self, chunk: Chunk) -> None:
        size = len(chunk)
        total = self.total = self.total + size
        budget = self.limit.budget
        budget.held += size  # charged first: release() gives back exactly self.total
        if total > self.limit.max_bytes:
            raise self.limit.too_large()
        if budget.committed() > budget.max_bytes:
            raise budget.exhausted()
        if chunk:
            self.parts.append(chunk)

    def release(self) -> None:
        """Give the body's bytes back to the budget (once; later calls do nothing)."""
        self.limit.budget.held -= self.total
        self.total = 0

    def join(self) -> Chunk:
        """One chunk as it came (no copy), several joined, none as b""."""
        parts = self.parts
        return parts[0] if len(parts) == 1 else b"".join(parts)
