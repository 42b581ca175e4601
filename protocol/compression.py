"""Content-Encoding for infer bodies (protocol.md 1.8).

Requests: gzip / deflate bodies are inflated with the size limit enforced *while* inflating,
one bounded chunk at a time, so a small gzip bomb never allocates more than the limit.
Responses: the encoding is chosen from Accept-Encoding (q weights) among gzip, deflate and
identity, and the whole body (JSON plus binary) is compressed.
"""

from __future__ import annotations

import zlib

from protocol.errors import InvalidArgument, TooLarge, Unsupported

Buffer = bytes | bytearray | memoryview

# The value a 501 answer to an unknown Content-Encoding should carry in its Accept-Encoding header.
ACCEPT_ENCODING = "gzip, deflate"
SUPPORTED_ENCODINGS = ("gzip", "deflate", "identity")

# zlib window bits: 15 with +32 auto-detects a zlib or a gzip header (what Triton's decoder does),
# -15 is raw deflate, which some clients send for "deflate" despite RFC 9110.
_AUTO_WBITS = 15 | 32
_RAW_WBITS = -15
_GZIP_WBITS = 15 | 16
_ZLIB_WBITS = 15
_CHUNK = 1 << 20  # most bytes one inflate step may produce
_IN_CHUNK = 1 << 16  # compressed bytes fed to zlib at a time
_DEFAULT_LEVEL = 6
_SERVER_PREFERENCE = {"gzip": 2, "deflate": 1, "identity": 0}


def decompress(body: Buffer, content_encoding: str | None, max_size: int) -> Buffer:
    """The request body with its Content-Encoding undone, never larger than `max_size` bytes.

    Identity bodies come back unchanged (no copy); inflated ones come back as a bytearray
    (grown in place, never copied again). A comma list of codings is undone last first, as
    RFC 9110 orders them.
    """
    codings = _parse_content_encoding(content_encoding)
    data: Buffer = body
    for coding in reversed(codings):
        data = _inflate(data, coding, max_size)
    if len(data) > max_size:
        raise _too_large(max_size)
    return data


def _parse_content_encoding(content_encoding: str | None) -> list[str]:
    """The codings named by the header, identity dropped; unknown ones are 501 (Unsupported)."""
    if not content_encoding:
        return []
    codings = []
    for token in content_encoding.split(","):
        coding = token.strip().lower()
        if coding in ("", "identity"):
            continue
        if coding not in ("gzip", "deflate", "x-gzip"):
            raise Unsupported(
                f"Unsupported compression type '{token.strip()}'; "
                "supported: gzip, deflate, identity"
            )
        codings.append("gzip" if coding == "x-gzip" else coding)
    return codings


def _inflate(data: Buffer, coding: str, max_size: int) -> bytearray:
    """Inflate `data`, raising TooLarge as soon as the output passes `max_size`."""
    out = bytearray()
    remaining: Buffer = data
    wbits = _wbits_for(coding, data)
    while True:
        inflater = zlib.decompressobj(wbits)
        remaining = _inflate_member(inflater, remaining, out, max_size)
        # gzip allows several members back to back; zlib streams have exactly one.
        if coding != "gzip" or not remaining:
            break
    return out


def _wbits_for(coding: str, data: Buffer) -> int:
    """Auto-detect zlib/gzip headers; a deflate body with neither header is raw deflate."""
    if coding == "deflate" and not _has_stream_header(data):
        return _RAW_WBITS
    return _AUTO_WBITS


def _has_stream_header(data: Buffer) -> bool:
    """Whether `data` starts like a zlib stream or a gzip member."""
    if len(data) < 2:
        return True  # let zlib report the truncation
    first, second = data[0], data[1]
    if (first, second) == (0x1F, 0x8B):
        return True
    return (first & 0x0F) == 8 and ((first << 8) | second) % 31 == 0


def _inflate_member(inflater, data: Buffer, out: bytearray, max_size: int) -> Buffer:
    """Inflate one stream into `out`; returns the bytes after its end.

    Input goes in slices of _IN_CHUNK and output comes out in steps of at most _CHUNK, so
    neither zlib's unconsumed tail nor one step's output is ever large.
    """
    view = memoryview(data)
    try:
        for start in range(0, len(view), _IN_CHUNK):
            end = start + _IN_CHUNK
            _inflate_slice(inflater, view[start:end], out, max_size)
            if inflater.eof:
                rest = view[end:]
                return inflater.unused_data + rest if len(rest) else inflater.unused_data
    except zlib.error as exc:
        raise InvalidArgument(f"failed to decompress the request body: {exc}") from None
    if not inflater.eof:
        raise InvalidArgument(
            "failed to decompress the request body: the compressed data is truncated"
        )
    return b""


def _inflate_slice(inflater, pending: Buffer, out: bytearray, max_size: int) -> None:
    """Feed one input slice, draining output in bounded steps until the slice is used up."""
    while True:
        budget = min(_CHUNK, max_size + 1 - len(out))
        chunk = inflater.decompress(pending, budget)
        out += chunk
        if len(out) > max_size:
            raise _too_large(max_size)
        pending = inflater.unconsumed_tail
        # Output short of the budget means zlib ran out of input, not of room.
        if inflater.eof or (not pending and len(chunk) < budget):
            return


def _too_large(max_size: int) -> TooLarge:
    return TooLarge(
        f"Decompressed request body exceeds the maximum allowed input size of {max_size} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


def is_compressed(content_encoding: str | None) -> bool:
    """Whether a Content-Encoding names any coding but identity (a body to inflate)."""
    if not content_encoding:
        return False
    return any(
        token.strip().lower() not in ("", "identity") for token in content_encoding.split(",")
    )


def choose_response_encoding(accept_encoding: str | None) -> str | None:
    """ "gzip" or "deflate" when the client prefers it, None for identity.

    The highest q wins; ties go to gzip, then deflate, then identity. `*` stands for any coding
    not listed. Identity is also the answer when nothing acceptable is offered, since refusing
    a response over this is worse than sending it plain.
    """
    if not accept_encoding:
        return None
    weights = _parse_accept_encoding(accept_encoding)
    wildcard = weights.pop("*", None)
    candidates = {}
    for coding in _SERVER_PREFERENCE:
        weight = weights.get(coding, wildcard if coding != "identity" else None)
        if weight is not None and weight > 0:
            candidates[coding] = weight
    if not candidates:
        return None
    best = max(candidates, key=lambda c: (candidates[c], _SERVER_PREFERENCE[c]))
    return None if best == "identity" else best


def _parse_accept_encoding(header: str) -> dict[str, float]:
    """`gzip;q=0.8, deflate` -> {"gzip": 0.8, "deflate": 1.0}; malformed q values count as 0."""
    weights: dict[str, float] = {}
    for item in header.split(","):
        coding, _, params = item.partition(";")
        coding = coding.strip().lower()
        if not coding:
            continue
        if coding == "x-gzip":
            coding = "gzip"
        weights[coding] = max(weights.get(coding, 0.0), _q_value(params))
    return weights


def _q_value(params: str) -> float:
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def compress(body: Buffer, encoding: str | None, level: int = _DEFAULT_LEVEL) -> Buffer:
    """`body` as gzip or deflate (zlib-wrapped, which is what HTTP deflate means).

    Identity (None) returns the body itself.
    """
    if encoding is None or encoding == "identity":
        return body
    if encoding == "gzip":
        wbits = _GZIP_WBITS
    elif encoding == "deflate":
        wbits = _ZLIB_WBITS
    else:
        raise Unsupported(f"Unsupported compression type '{encoding}'")
    compressor = zlib.compressobj(level, zlib.DEFLATED, wbits)
    return compressor.compress(body) + compressor.flush()
