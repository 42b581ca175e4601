"""--http-max-input-size for request bodies: the one owner of the limit and of its error.

Why a module: two readers take HTTP bodies (the routed ASGI endpoints in server/http/routes.py and
the direct infer path in server/http/fast_path.py), and both must refuse the same bodies the same
way: a declared Content-Length over the limit before anything is read, and a running total over the
limit as chunks arrive, so an oversized body is never buffered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from protocol.errors import InvalidArgument, TooLarge

Chunk = bytes | bytearray


class BodyLimit:
    """The size limit of one HTTP frontend (built once, read on every request)."""

    __slots__ = ("max_bytes",)

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

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
        async for chunk in chunks:
            body.add(chunk)
        return body.join()


class BodyBuffer:
    """The chunks of one body as they arrive (kept, not copied), with their running total."""

    __slots__ = ("limit", "parts", "total")

    def __init__(self, limit: BodyLimit) -> None:
        self.limit = limit
        self.parts: list[Chunk] = []
        self.total = 0

    def add(self, chunk: Chunk) -> None:
        self.total += len(chunk)
        self.limit.check(self.total)
        if chunk:
            self.parts.append(chunk)

    def join(self) -> Chunk:
        """One chunk as it came (no copy), several joined, none as b""."""
        parts = self.parts
        return parts[0] if len(parts) == 1 else b"".join(parts)
