"""protocol/compression.py: bounded request inflation and response encoding choice."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import pytest

from protocol.compression import (
    ACCEPT_ENCODING,
    choose_response_encoding,
    compress,
    decompress,
)
from protocol.errors import InvalidArgument, TooLarge, Unsupported

PAYLOAD = b'{"inputs":[]}' + bytes(range(256)) * 64
LIMIT = 1 << 20


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    "encoding,body",
    [
        ("gzip", gzip.compress(PAYLOAD)),
        ("GZip", gzip.compress(PAYLOAD)),
        ("x-gzip", gzip.compress(PAYLOAD)),
        ("deflate", zlib.compress(PAYLOAD)),  # HTTP deflate is zlib-wrapped
        ("deflate", _raw_deflate(PAYLOAD)),  # tolerated: some clients send raw deflate
        ("deflate", gzip.compress(PAYLOAD)),  # auto-detected like Triton's windowBits 15|32
        ("gzip", gzip.compress(PAYLOAD[:100]) + gzip.compress(PAYLOAD[100:])),  # two members
        (
            "gzip, deflate",
            zlib.compress(gzip.compress(PAYLOAD)),
        ),  # applied in order, undone in reverse
    ],
)
def test_decompress_round_trip(encoding: str, body: bytes) -> None:
    assert bytes(decompress(body, encoding, LIMIT)) == PAYLOAD


@pytest.mark.parametrize("encoding", [None, "", "identity", " Identity "])
def test_identity_returns_the_body_itself(encoding: str | None) -> None:
    assert decompress(PAYLOAD, encoding, LIMIT) is PAYLOAD


def test_identity_body_over_the_limit() -> None:
    with pytest.raises(TooLarge):
        decompress(b"x" * 11, None, 10)


@pytest.mark.parametrize("encoding", ["br", "compress", "zstd", "gzip, br"])
def test_unknown_encoding_is_unsupported(encoding: str) -> None:
    with pytest.raises(Unsupported) as caught:
        decompress(b"abc", encoding, LIMIT)
    assert caught.value.message.startswith("Unsupported compression type")
    assert caught.value.http_status() == 501
    assert ACCEPT_ENCODING == "gzip, deflate"


def test_limit_is_inclusive() -> None:
    body = gzip.compress(b"a" * 1000)
    assert len(decompress(body, "gzip", 1000)) == 1000
    with pytest.raises(TooLarge):
        decompress(body, "gzip", 999)


def test_gzip_bomb_stops_at_the_limit_without_a_big_allocation() -> None:
    bomb = gzip.compress(bytes(64 << 20), compresslevel=9)  # 64 MiB of zeros in ~64 KiB
    assert len(bomb) < 128 << 10
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge) as caught:
            decompress(bomb, "gzip", LIMIT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.message == (
        f"Decompressed request body exceeds the maximum allowed input size of {LIMIT} bytes. "
        "Use --http-max-input-size to increase the limit."
    )
    assert peak < 4 * LIMIT


def test_deflate_bomb_is_bounded_too() -> None:
    with pytest.raises(TooLarge):
        decompress(zlib.compress(bytes(8 << 20)), "deflate", LIMIT)


@pytest.mark.parametrize(
    "encoding,body,fragment",
    [
        ("gzip", b"not gzip at all", "failed to decompress the request body"),
        ("gzip", gzip.compress(PAYLOAD)[:-10], "truncated"),
        ("deflate", zlib.compress(PAYLOAD)[:20], "truncated"),
        ("gzip", b"", "truncated"),
    ],
)
def test_corrupt_bodies_are_invalid(encoding: str, body: bytes, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        decompress(body, encoding, LIMIT)
    assert fragment in caught.value.message


@pytest.mark.parametrize(
    "header,expected",
    [
        (None, None),
        ("", None),
        ("identity", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip, deflate", "gzip"),
        ("deflate, gzip", "gzip"),
        ("gzip;q=0.5, deflate", "deflate"),
        ("gzip;q=0.5, deflate;q=0.8, identity;q=0.9", None),
        ("GZIP;Q=1.0", "gzip"),
        ("gzip;q=0", None),
        ("gzip;q=0, deflate;q=0.1", "deflate"),
        ("br, zstd", None),
        ("*", "gzip"),
        ("*;q=0.3, identity;q=0.5", None),
        ("*;q=0.3, gzip;q=0", "deflate"),
        ("deflate;q=0.4, *;q=0.5", "gzip"),
        ("gzip;q=abc, deflate;q=0.2", "deflate"),
        ("gzip;q=2", None),
        (" gzip ; q=0.7 , deflate ; q=0.7 ", "gzip"),
    ],
)
def test_choose_response_encoding(header: str | None, expected: str | None) -> None:
    assert choose_response_encoding(header) == expected


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compress_round_trip(encoding: str) -> None:
    body = compress(PAYLOAD, encoding)
    assert len(body) < len(PAYLOAD)
    restored = gzip.decompress(body) if encoding == "gzip" else zlib.decompress(body)
    assert restored == PAYLOAD
    assert bytes(decompress(body, encoding, LIMIT)) == PAYLOAD


def test_compress_accepts_memoryview_and_identity() -> None:
    assert gzip.decompress(compress(memoryview(PAYLOAD), "gzip")) == PAYLOAD
    assert compress(PAYLOAD, None) is PAYLOAD
    assert compress(PAYLOAD, "identity") is PAYLOAD
    with pytest.raises(Unsupported):
        compress(PAYLOAD, "br")
