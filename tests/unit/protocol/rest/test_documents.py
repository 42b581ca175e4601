"""The REST codec's documents besides infer (protocol/rest/encode.py, decode.py): model
metadata, statistics and the repository index as exact JSON bytes, and the repository
index / load / unload request bodies with their error texts."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from protocol.errors import InvalidArgument
from protocol.rest.decode import (
    decode_index_ready,
    decode_load_parameters,
    decode_unload_dependents,
)
from protocol.rest.encode import (
    encode_model_metadata,
    encode_repository_index,
    encode_statistics,
    encode_statistics_response,
)
from protocol.types import (
    BatchStatisticsSnapshot,
    DurationSnapshot,
    IndexEntry,
    ModelMetadata,
    StatisticsSnapshot,
    TensorMetadata,
)
from scheduler.stats import VersionStatistics

# --------------------------------------------------------------------------- metadata, index


def test_model_metadata_bytes() -> None:
    meta = ModelMetadata(
        "m",
        ["1", "2"],
        "onnxruntime_onnx",
        [TensorMetadata("I", "FP32", [-1, 3])],
        [TensorMetadata("O", "BYTES", [])],
    )
    assert orjson.dumps(encode_model_metadata(meta)) == (
        b'{"name":"m","versions":["1","2"],"platform":"onnxruntime_onnx",'
        b'"inputs":[{"name":"I","datatype":"FP32","shape":[-1,3]}],'
        b'"outputs":[{"name":"O","datatype":"BYTES","shape":[]}]}'
    )


def test_repository_index_leaves_out_what_is_unset() -> None:
    entries = [
        IndexEntry("a"),
        IndexEntry("b", "1", "READY"),
        IndexEntry("c", "2", "UNAVAILABLE", "unloaded"),
        IndexEntry("d", "", "LOADING"),
    ]
    assert orjson.dumps(encode_repository_index(entries)) == (
        b'[{"name":"a"},{"name":"b","version":"1","state":"READY"},'
        b'{"name":"c","version":"2","state":"UNAVAILABLE","reason":"unloaded"},'
        b'{"name":"d","state":"LOADING"}]'
    )
    assert encode_repository_index([]) == []


# --------------------------------------------------------------------------- statistics


def test_statistics_bytes_from_a_snapshot() -> None:
    one = DurationSnapshot(1, 5)
    snapshot = StatisticsSnapshot(
        "m",
        "3",
        last_inference_ms=7,
        inference_count=5,
        execution_count=2,
        success=one,
        fail=DurationSnapshot(2, 9),
        queue=one,
        compute_input=one,
        compute_infer=one,
        compute_output=one,
        batch_stats=(
            BatchStatisticsSnapshot(1, one, one, one),
            BatchStatisticsSnapshot(4, DurationSnapshot(1, 2), one, one),
        ),
        pending=3,
    )
    d = b'{"count":1,"ns":5}'
    zero = b'{"count":0,"ns":0}'
    assert orjson.dumps(encode_statistics(snapshot)) == (
        b'{"name":"m","version":"3","last_inference":7,"inference_count":5,"execution_count":2,'
        b'"inference_stats":{"success":'
        + d
        + b',"fail":{"count":2,"ns":9},"queue":'
        + d
        + b',"compute_input":'
        + d
        + b',"compute_infer":'
        + d
        + b',"compute_output":'
        + d
        + b',"cache_hit":'
        + zero
        + b',"cache_miss":'
        + zero
        + b'},"response_stats":{},'
        b'"batch_stats":[{"batch_size":1,"compute_input":'
        + d
        + b',"compute_infer":'
        + d
        + b',"compute_output":'
        + d
        + b'},{"batch_size":4,"compute_input":{"count":1,"ns":2},'
        b'"compute_infer":' + d + b',"compute_output":' + d + b'}],"memory_usage":[]}'
    )


def test_statistics_response_from_live_counters() -> None:
    stats = VersionStatistics("m", "1")
    stats.record_execution(4, 1, 2, 3)
    stats.record_execution(1, 1, 1, 1)
    document = encode_statistics_response([stats.snapshot()])
    (entry,) = document["model_stats"]
    assert [b["batch_size"] for b in entry["batch_stats"]] == [1, 4]  # ordered by size
    assert (entry["inference_count"], entry["execution_count"]) == (5, 2)
    assert encode_statistics_response([]) == {"model_stats": []}


def test_snapshot_is_a_copy_and_reset_keeps_identity_and_pending() -> None:
    stats = VersionStatistics("m", "1")
    stats.record_success(100, 10, 20, 30, 40)
    stats.record_execution(2, 20, 30, 40)
    stats.pending_changed(2)
    before = stats.snapshot()
    stats.record_success(1, 1, 1, 1, 1)
    assert before.success == DurationSnapshot(1, 100)  # not moved by later counts
    stats.reset()
    after = stats.snapshot()
    assert after == StatisticsSnapshot("m", "1", pending=2)
    with pytest.raises(AttributeError):
        after.inference_count = 3  # type: ignore[misc]


# --------------------------------------------------------------------------- repository requests


@pytest.mark.parametrize(
    "payload, ready",
    [(None, False), ({}, False), ({"ready": True}, True), ({"ready": False, "other": 1}, False)],
)
def test_index_ready(payload: Any, ready: bool) -> None:
    assert decode_index_ready(payload) is ready


@pytest.mark.parametrize(
    "payload, message",
    [
        ([], "the repository index request must be a JSON object"),
        ({"ready": 1}, "Invalid value for 'ready': expected a boolean"),
    ],
)
def test_index_errors(payload: Any, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        decode_index_ready(payload)
    assert info.value.message == message


def test_load_parameters() -> None:
    payload = {
        "parameters": {
            "config": '{"backend":"onnxruntime"}',
            "file:1/model.onnx": base64.b64encode(b"\x00\x01").decode(),
            "other": "ignored",
        }
    }
    assert decode_load_parameters("m", payload) == (
        '{"backend":"onnxruntime"}',
        {"1/model.onnx": b"\x00\x01"},
    )
    for empty in (None, {}, [], {"parameters": {}}):  # an empty body is a plain load
        assert decode_load_parameters("m", empty) == (None, {})


@pytest.mark.parametrize(
    "payload, message",
    [
        ("x", "the request body must be a JSON object"),
        ({"parameters": []}, "'parameters' must be a JSON object"),
        (
            {"parameters": {"config": {}}},
            "load failed for model 'm': parameter 'config' must be a string",
        ),
        (
            {"parameters": {"file:a": "not base64!"}},
            "load failed for model 'm': file content for 'file:a' is not valid base64",
        ),
    ],
)
def test_load_errors(payload: Any, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        decode_load_parameters("m", payload)
    assert info.value.message == message


def test_unload_dependents() -> None:
    assert decode_unload_dependents(None) is False
    assert decode_unload_dependents({"parameters": {"unload_dependents": True}}) is True
    with pytest.raises(InvalidArgument) as info:
        decode_unload_dependents({"parameters": {"unload_dependents": "yes"}})
    assert info.value.message == "'unload_dependents' must be a boolean"
    with pytest.raises(InvalidArgument, match="the request body must be a JSON object"):
        decode_unload_dependents(3)
