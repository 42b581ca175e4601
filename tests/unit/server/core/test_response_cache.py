"""The response cache's store: keys that never alias, LRU within its bytes, oversized answers
not stored, a closed copy's entries gone, stored answers independent of the caller's."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from protocol.types import InferRequest, InferResponse, RequestedOutput, Tensor
from server.core.response_cache import ResponseCache, VersionCache, request_key
from server.settings import parse_cache_config


def fp32(name: str, values: list[float], shape: tuple[int, ...] | None = None) -> Tensor:
    data = np.array(values, dtype=np.float32)
    return Tensor(name, "FP32", shape or data.shape, data)


def request(*inputs: Tensor, **parameters: object) -> InferRequest:
    return InferRequest("m", inputs=list(inputs), parameters=dict(parameters))


def answer(nbytes: int) -> InferResponse:
    data = np.zeros(nbytes, dtype=np.uint8)
    return InferResponse("m", "1", outputs=[Tensor("Y", "UINT8", data.shape, data)])


def key(req: InferRequest, generation: int = 1) -> bytes:
    return request_key("m", generation, req)


def test_the_key_covers_names_types_shapes_bytes_parameters_and_outputs() -> None:
    base = key(request(fp32("X", [1, 2, 3, 4])))
    assert key(request(fp32("X", [1, 2, 3, 4]))) == base
    different = [
        request(fp32("Z", [1, 2, 3, 4])),  # name
        request(Tensor("X", "INT32", (4,), np.array([1, 2, 3, 4], dtype=np.int32))),  # type
        request(fp32("X", [1, 2, 3, 4], (2, 2))),  # shape
        request(fp32("X", [1, 2, 3, 5])),  # bytes
        request(fp32("X", [1, 2, 3, 4]), offset=1),  # a parameter the model reads
    ]
    assert len({base, *(key(r) for r in different)}) == len(different) + 1
    assert request_key("other", 1, request(fp32("X", [1, 2, 3, 4]))) != base
    assert key(request(fp32("X", [1, 2, 3, 4])), generation=2) != base
    asked = request(fp32("X", [1, 2, 3, 4]))
    asked.outputs = [RequestedOutput("Y")]
    assert key(asked) != base
    # Scheduling and encoding parameters do not change the answer.
    assert key(request(fp32("X", [1, 2, 3, 4]), priority=1, timeout=5)) == base
    assert key(request(fp32("X", [1, 2, 3, 4]), binary_data_output=True)) == base


def test_fields_are_length_prefixed_so_no_two_requests_alias() -> None:
    def strings(*items: bytes) -> InferRequest:
        data = np.array(list(items), dtype=object)
        return request(Tensor("S", "BYTES", data.shape, data))

    # The same concatenated bytes, split differently, or moved between name and data.
    assert key(strings(b"ab", b"c")) != key(strings(b"a", b"bc"))
    one = request(Tensor("XY", "UINT8", (1,), np.array([1], dtype=np.uint8)))
    two = request(Tensor("X", "UINT8", (2,), np.array([ord("Y"), 1], dtype=np.uint8)))
    assert key(one) != key(two)
    assert key(request(fp32("X", [1]), a="bc")) != key(request(fp32("X", [1]), ab="c"))
    assert key(request(fp32("X", [1]), a=1)) != key(request(fp32("X", [1]), a="1"))
    assert key(request(fp32("X", [1]), a=True)) != key(request(fp32("X", [1]), a=1))


def test_least_recently_used_entries_go_first_and_the_size_is_never_exceeded() -> None:
    cache = ResponseCache(3000, 1 << 16)
    copy = cache.bind("m", True)
    assert copy is not None
    for name in ("a", "b", "c"):
        assert copy.store(name.encode(), answer(600))
    assert cache.used <= 3000 and len(cache) == 3
    assert copy.lookup(b"a") is not None  # a is now the most recently used
    assert copy.store(b"d", answer(600))
    assert cache.used <= 3000
    assert copy.lookup(b"b") is None and cache.evictions == 1
    assert all(copy.lookup(k) is not None for k in (b"a", b"c", b"d"))


def test_an_answer_larger_than_the_cache_is_not_stored() -> None:
    cache = ResponseCache(1024, 1 << 16)
    copy = cache.bind("m", True)
    assert copy is not None and copy.store(b"small", answer(100))
    assert not copy.store(b"big", answer(2000))
    assert copy.lookup(b"big") is None and copy.lookup(b"small") is not None


def test_a_closed_copy_loses_its_entries_and_stores_nothing_more() -> None:
    cache = ResponseCache(1 << 20, 1 << 16)
    old, new = cache.bind("m", True), cache.bind("m", True)
    assert isinstance(old, VersionCache) and isinstance(new, VersionCache)
    assert old.generation != new.generation
    old.store(b"k", answer(10))
    new.store(b"n", answer(10))
    old.close()
    assert old.lookup(b"k") is None and not old.store(b"k2", answer(10))
    assert new.lookup(b"n") is not None and cache.used == new.lookup(b"n").size  # type: ignore[union-attr]


def test_a_model_without_response_cache_gets_no_copy() -> None:
    assert ResponseCache(1 << 20, 1 << 16).bind("m", False) is None


def test_stored_answers_are_copies_the_caller_cannot_change() -> None:
    cache = ResponseCache(1 << 20, 1 << 16)
    copy = cache.bind("m", True)
    assert copy is not None
    response = answer(4)
    copy.store(b"k", response)
    response.outputs[0].data[:] = 7  # the caller (or the backend's buffer) changes afterwards
    entry = copy.lookup(b"k")
    assert entry is not None
    hit = entry.answer(InferRequest("m", id="r2"))
    assert hit.id == "r2" and list(hit.outputs[0].data) == [0, 0, 0, 0]
    with pytest.raises(ValueError):
        hit.outputs[0].data[0] = 1


def test_identical_answers_stored_at_once_count_once() -> None:
    cache = ResponseCache(1 << 20, 1 << 16)
    copy = cache.bind("m", True)
    assert copy is not None
    threads = [threading.Thread(target=copy.store, args=(b"k", answer(100))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 1 and cache.used == copy.lookup(b"k").size  # type: ignore[union-attr]


def test_cache_config_takes_tritons_syntax() -> None:
    assert parse_cache_config([]) == 0
    assert parse_cache_config(["local,size=1048576"]) == 1048576
    for bad, text in (
        (["redis,host=x"], "only 'local'"),
        (["local,size=8192", "redis,port=1"], "multiple cache configurations"),
        (["local,size=0"], "positive"),
        (["local,size=lots"], "positive"),
        (["local,bytes=5"], "unknown setting"),
        (["local"], "expected <cache>,<key>=<value>"),
    ):
        with pytest.raises(ValueError, match=text):
            parse_cache_config(bad)
