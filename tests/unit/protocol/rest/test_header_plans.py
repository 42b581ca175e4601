"""protocol/request_plans.py over HTTP (protocol/rest/header_plans.py): a binary request's JSON
header decoded once, looked up after; every request still gets its own objects and its own
checks of the binary section."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from protocol.datatypes import serialize_bytes
from protocol.errors import InvalidArgument
from protocol.request_plans import RequestPlans
from protocol.rest import decode
from tests.support.requests import request_fields


@pytest.fixture(autouse=True)
def fresh_plans(monkeypatch: pytest.MonkeyPatch) -> RequestPlans:
    plans = RequestPlans(entries=4)
    monkeypatch.setattr(decode, "_PLANS", plans)
    return plans


def _body(inputs: list[tuple[str, str, list[int], bytes]], **document: object) -> tuple[bytes, int]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": datatype,
                    "shape": shape,
                    "parameters": {"binary_data_size": len(data)},
                }
                for name, datatype, shape, data in inputs
            ],
            **document,
        }
    )
    return header + b"".join(data for *_, data in inputs), len(header)


def _decode(body: bytes, header_length: int) -> decode.InferRequest:
    return decode.decode_infer_request(bytearray(body), header_length, "m", "1", max_bytes=1 << 20)


def test_a_header_seen_again_decodes_the_same_from_its_plan(fresh_plans: RequestPlans) -> None:
    first = np.arange(4, dtype=np.float32).tobytes()
    body, length = _body(
        [("A", "FP32", [1, 4], first), ("B", "INT64", [2], np.array([7, 8]).tobytes())],
        id="req-1",
        parameters={"priority": 2},
        outputs=[{"name": "OUT", "parameters": {"binary_data": True, "classification": 2}}],
    )
    full = _decode(body, length)
    assert len(fresh_plans) == 1
    planned = _decode(body, length)
    assert request_fields(planned) == request_fields(full)
    assert planned.inputs[0].data.tolist() == [[0.0, 1.0, 2.0, 3.0]]
    # the next request's bytes are its own, read from its body
    other = body[:length] + np.full(4, 5, dtype=np.float32).tobytes() + body[length + 16 :]
    assert _decode(other, length).inputs[0].data.tolist() == [[5.0] * 4]


def test_each_request_from_a_plan_has_its_own_objects() -> None:
    body, length = _body(
        [("A", "FP32", [1], b"\0" * 4)],
        parameters={"priority": 1},
        outputs=[{"name": "OUT", "parameters": {"binary_data": True}}],
    )
    _decode(body, length)
    one, two = _decode(body, length), _decode(body, length)
    one.parameters["changed"] = True
    assert one.outputs is not None and two.outputs is not None
    one.outputs[0].parameters["changed"] = True
    one.inputs[0].parameters["changed"] = True
    assert "changed" not in two.parameters
    assert "changed" not in two.outputs[0].parameters
    assert "changed" not in two.inputs[0].parameters


def test_a_binary_section_of_another_size_gets_the_full_decode_and_its_error() -> None:
    body, length = _body([("A", "FP32", [1, 4], b"\0" * 16)])
    _decode(body, length)
    with pytest.raises(InvalidArgument, match="unexpected additional input data for model 'm'"):
        _decode(body + b"\0", length)
    with pytest.raises(InvalidArgument, match="expecting 1 additional bytes for model 'm'"):
        _decode(body[:-1], length)


def test_bytes_elements_are_parsed_for_every_request() -> None:
    first = serialize_bytes(np.array([b"ab", b"cd"], dtype=object))
    second = serialize_bytes(np.array([b"xy", b"zw"], dtype=object))
    body, length = _body([("S", "BYTES", [2], first)])
    _decode(body, length)
    request = _decode(body[:length] + second, length)
    assert request.inputs[0].data.tolist() == [b"xy", b"zw"]
    broken = second[:-2] + b"\xff\xff"  # same size, but the last length prefix is cut
    with pytest.raises(InvalidArgument):
        _decode(body[:length] + b"\x09\x00\x00\x00" + broken[4:], length)


def test_refused_headers_and_per_request_data_are_never_kept(fresh_plans: RequestPlans) -> None:
    body, length = _body([("A", "FP33", [1], b"\0" * 4)])
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="invalid datatype 'FP33'"):
            _decode(body, length)
    mismatch, length = _body([("A", "FP32", [2], b"\0" * 4)])
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="input byte size mismatch"):
            _decode(mismatch, length)
    json_data = orjson.dumps(
        {
            "inputs": [
                {"name": "A", "datatype": "FP32", "shape": [1], "data": [1.0]},
                {
                    "name": "B",
                    "datatype": "FP32",
                    "shape": [1],
                    "parameters": {"binary_data_size": 4},
                },
            ]
        }
    )
    _decode(json_data + b"\0" * 4, len(json_data))
    in_region = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "B",
                    "datatype": "FP32",
                    "shape": [1],
                    "parameters": {"binary_data_size": 4},
                }
            ],
            "outputs": [
                {
                    "name": "O",
                    "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4},
                }
            ],
        }
    )
    _decode(in_region + b"\0" * 4, len(in_region))
    assert len(fresh_plans) == 0


def test_the_table_is_bounded(fresh_plans: RequestPlans) -> None:
    for index in range(10):
        body, length = _body([(f"A{index}", "FP32", [1], b"\0" * 4)])
        _decode(body, length)
    assert len(fresh_plans) == 4
    big, length = _body([("A" * 20_000, "FP32", [1], b"\0" * 4)])
    _decode(big, length)
    assert len(fresh_plans) == 4 and fresh_plans.max_key < length
