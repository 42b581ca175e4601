"""The generate extension's codec (protocol/rest/generate.py), the ResponseStream
(protocol/stream.py) and the custom metrics collector (server/observability/custom_metrics.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from protocol.errors import InternalError, InvalidArgument
from protocol.rest.generate import InputSchema, decode_generate, encode_generate, sse_event
from protocol.stream import ResponseStream, StreamItem
from protocol.types import InferResponse, Tensor
from server.observability.custom_metrics import CustomMetricLimits, CustomMetrics

SCHEMA = {
    "text_input": InputSchema("BYTES", (1,)),
    "ids": InputSchema("INT64", (1, -1)),
    "flag": InputSchema("BOOL", (1,)),
}


def test_fields_become_inputs_and_parameters() -> None:
    request = decode_generate(
        b'{"text_input": "hi", "ids": [1, 2, 3], "flag": true, '
        b'"temperature": 0.5, "id": "r", "parameters": {"k": 3}}',
        "m",
        "",
        SCHEMA,
    )
    tensors = {t.name: t for t in request.inputs}
    assert tensors["text_input"].data.tolist() == [b"hi"]
    assert tensors["ids"].shape == (1, 3) and tensors["ids"].data.tolist() == [[1, 2, 3]]
    assert tensors["flag"].data.tolist() == [True]
    assert request.parameters == {"temperature": 0.5, "id": "r", "k": 3}
    assert request.id == "r" and request.outputs is None


@pytest.mark.parametrize(
    "body, message",
    [
        (
            b'{"x": [1]}',
            "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'.",
        ),
        (b'{"parameters": 1}', "Expected JSON object for keyword: 'parameters'"),
        (b'{"flag": "yes"}', "input 'flag': attempt to access JSON non-boolean as boolean"),
        (b'{"text_input": ["a", "b"]}', "Unable to convert the value of 'text_input'"),
        (b'{"text_input": "a", "text_input": "b"}', "input 'text_input' already exists in request"),
        (b"[1]", "the generate request must be a JSON object"),
        (b'{"a": ', "failed to parse the request JSON buffer"),
    ],
)
def test_bad_bodies_are_invalid_arguments(body: bytes, message: str) -> None:
    with pytest.raises(
        InvalidArgument,
        match=message.replace("(", r"\(")
        .replace(")", r"\)")
        .replace("[", r"\[")
        .replace("]", r"\]"),
    ):
        decode_generate(body, "m", "", SCHEMA)


def test_answers_unwrap_one_element_outputs() -> None:
    response = InferResponse(
        "m",
        "1",
        "r",
        [
            Tensor("text_output", "BYTES", (1,), np.array([b"tok"], dtype=object)),
            Tensor("logits", "FP32", (1, 2), np.array([[0.5, 1.5]], dtype=np.float32)),
        ],
    )
    assert encode_generate(response) == {
        "id": "r",
        "model_name": "m",
        "model_version": "1",
        "text_output": "tok",
        "logits": [0.5, 1.5],
    }
    assert sse_event({"a": 1}) == b'data: {"a":1}\n\n'


def test_stream_orders_acks_and_cancels() -> None:
    async def run() -> None:
        stream = ResponseStream(asyncio.get_running_loop())
        consumed, cancelled = [], []
        stream.attach(lambda: consumed.append(1), lambda: cancelled.append(1))
        stream.set_converter(
            lambda outputs: InferResponse(
                "m",
                "1",
                outputs=[
                    Tensor(name, "INT32", value.shape, value) for name, value in outputs.items()
                ],
            )
        )
        stream.push(StreamItem({"X": np.array([1], np.int32)}))
        stream.push(StreamItem(error=InternalError("boom")))
        stream.push(StreamItem(final=True))
        stream.push(StreamItem({"X": np.array([9], np.int32)}))  # after final: dropped
        first = await stream.next()
        assert first.response is not None and first.response.outputs[0].data.tolist() == [1]
        assert (await stream.next()).error.message == "boom"  # type: ignore[union-attr]
        assert (await stream.next()).final
        assert consumed == [1, 1]  # the final item is not acked
        other = ResponseStream(asyncio.get_running_loop())
        await asyncio.to_thread(other.push_threadsafe, StreamItem({"X": np.zeros(1)}))
        assert (await other.next()).outputs is not None  # from another thread, in order
        other.attach(lambda: None, lambda: cancelled.append(1))
        other.cancel()
        other.cancel()
        assert cancelled == [1]

    asyncio.run(run())


def test_custom_metrics_render_each_kind_and_stay_bounded() -> None:
    metrics = CustomMetrics(CustomMetricLimits(max_families=2, max_series=1))
    family = {"action": "family", "description": "d"}
    assert metrics.declare({**family, "family": "tokens", "kind": "counter"}) is None
    assert metrics.declare({**family, "family": "lat", "kind": "histogram"}) is None
    assert "--custom-metric-max-families" in str(
        metrics.declare({**family, "family": "third", "kind": "gauge"})
    )
    series = {"action": "series", "family": "tokens"}
    assert metrics.declare({**series, "labels": {"m": "a"}}) is None
    assert "--custom-metric-max-series" in str(metrics.declare({**series, "labels": {"m": "b"}}))
    assert metrics.declare({"action": "series", "family": "lat", "buckets": [1.0, 5.0]}) is None
    metrics.apply({"action": "increment", "family": "tokens", "labels": {"m": "a"}, "value": 2})
    metrics.apply({"action": "increment", "family": "tokens", "labels": {"m": "a"}, "value": 3})
    metrics.apply({"action": "increment", "family": "tokens", "labels": {"m": "b"}, "value": 1})
    for value in (0.5, 1.0, 7.0):
        metrics.apply(
            {
                "action": "observe",
                "family": "lat",
                "labels": {},
                "value": value,
                "buckets": [1.0, 5.0],
            }
        )
    families = {family.name: family for family in metrics.collect()}
    assert set(families) == {"tokens", "lat"}
    assert [(s.labels, s.value) for s in families["tokens"].samples] == [({"m": "a"}, 5.0)]
    buckets = {s.labels["le"]: s.value for s in families["lat"].samples if s.name == "lat_bucket"}
    assert buckets == {"1.0": 2, "5.0": 2, "+Inf": 3}
