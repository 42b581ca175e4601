"""server/http/parsers.py's pieces that need no process: the inline-or-offload decision for
compressed bodies, BYTES tensors in transit, and the vectorised nesting check (issue 13, item 1).
The processes themselves are exercised end to end in tests/e2e/http/test_offload.py."""

from __future__ import annotations

import random
import re
import zlib

import numpy as np
import pytest

from protocol.errors import InvalidArgument, TooLarge
from protocol.rest.decode import check_json_depth
from server.http.parsers import PackedBytes, inflate_small, parse_json_document


def test_small_compressed_bodies_inflate_inline_and_large_ones_are_left_to_a_worker() -> None:
    small = zlib.compress(b'{"ready": true}')
    assert inflate_small(small, "deflate", 1 << 20, 1024) == b'{"ready": true}'
    big = zlib.compress(b" " * 5000)
    assert inflate_small(big, "deflate", 1 << 20, 1024) is None  # stopped at the threshold
    with pytest.raises(TooLarge):  # past the real limit: the same 413 as before
        inflate_small(big, "deflate", 1000, 4096)


def test_packed_bytes_round_trip_in_steps() -> None:
    items = [b"", b"a", "é".encode(), b"x" * 1000] * 5000
    array = np.empty(len(items), dtype=object)
    array[:] = items
    array = array.reshape(100, 200)
    for step in (None, 7, 1 << 16):
        packed = PackedBytes(array, step=step)
        out = packed.unpack()
        assert out.shape == (100, 200) and out.dtype == object
        assert out.reshape(-1).tolist() == items


def test_the_json_document_parse_keeps_its_error_texts() -> None:
    assert parse_json_document(b"  ", None, 100, 10) is None
    with pytest.raises(InvalidArgument, match="failed to parse the request JSON buffer"):
        parse_json_document(b'{"a": tru', None, 100, 10)
    with pytest.raises(InvalidArgument, match=r"JSON nesting depth exceeds .* \(3\)"):
        parse_json_document(b"[[[[1]]]]", None, 100, 3)


_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')


def _regex_depth_ok(text: bytes, limit: int) -> bool:
    """The nesting check as it was (regexes), as the reference for the vectorised one."""
    if text.count(b"[") + text.count(b"{") <= limit:
        return True
    text = _STRING.sub(b"", _ESCAPE.sub(b"", text))
    depth = 0
    for char in text:
        if char in b"[{":
            depth += 1
            if depth > limit:
                return False
        elif char in b"]}":
            depth -= 1
    return True


@pytest.mark.parametrize("alphabet", [b'[]{}"\\a,', b'[{"\\\\\\'])
def test_vectorised_depth_check_agrees_with_the_regex_one(alphabet: bytes) -> None:
    rng = random.Random(13)
    for _ in range(5000):
        text = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        limit = rng.randint(0, 4)
        try:
            check_json_depth(text, limit)
            ok = True
        except InvalidArgument:
            ok = False
        assert ok == _regex_depth_ok(text, limit), (text, limit)
