"""REST response encoding (protocol/rest/encode.py): what the core answers -> the HTTP body, and
round trips through the decoder and through tritonclient."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from protocol.errors import InternalError
from protocol.rest.encode import encode_error, encode_infer_response
from protocol.types import InferResponse, RequestedOutput, Tensor
from tests.support.rest_cases import (
    MODEL,
    binary_blobs,
    bytes_blob,
    decode_body,
    fp32_bytes,
    json_body,
    make_response,
    split_body,
    tensor_entry,
)

# --------------------------------------------------------------------------- responses

_F32 = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
_I64 = np.array([[-1, 2**40]], dtype=np.int64)
_STR = np.array([b"ab", "ç".encode(), b""], dtype=object)


def test_json_response_round_trip() -> None:
    response = make_response(
        Tensor("f", "FP32", (2, 3), _F32),
        Tensor("i", "INT64", (1, 2), _I64),
        Tensor("s", "BYTES", (3,), _STR),
        Tensor("b", "BOOL", (2,), np.array([True, False])),
        id="r1",
        parameters={"p": 1},
    )
    body, header_length = encode_infer_response(response, None, False)
    assert header_length is None
    document = orjson.loads(body)
    assert list(document) == ["id", "model_name", "model_version", "parameters", "outputs"]
    assert (document["id"], document["model_name"], document["model_version"]) == ("r1", MODEL, "3")
    assert document["parameters"] == {"p": 1}
    f, i, s, b = document["outputs"]
    assert f == {
        "name": "f",
        "datatype": "FP32",
        "shape": [2, 3],
        "data": _F32.reshape(-1).tolist(),
    }
    assert np.array(i["data"], np.int64).reshape(i["shape"]).tolist() == _I64.tolist()
    assert s["data"] == ["ab", "ç", ""]
    assert b["data"] == [True, False]


def test_binary_response_round_trip() -> None:
    response = make_response(
        Tensor("f", "FP32", (2, 3), _F32),
        Tensor("s", "BYTES", (3,), _STR),
        Tensor("e", "INT32", (0,), np.zeros(0, np.int32)),
    )
    body, header_length = encode_infer_response(response, None, True)
    document, tail = split_body(body, header_length)
    assert "id" not in document
    sizes = [o["parameters"]["binary_data_size"] for o in document["outputs"]]
    assert sizes == [24, 3 * 4 + 4, 0]
    assert all("data" not in o for o in document["outputs"])
    blobs = binary_blobs(document, tail)
    assert np.frombuffer(blobs["f"], np.float32).reshape(2, 3).tolist() == _F32.tolist()
    assert blobs["s"] == bytes_blob(b"ab", "ç".encode(), b"")
    assert blobs["e"] == b""


@pytest.mark.parametrize(
    "binary_default,requested,expected_binary",
    [
        (False, None, {"a": False, "b": False}),
        (True, None, {"a": True, "b": True}),
        (True, [RequestedOutput("a", binary=False), RequestedOutput("b")], {"a": False, "b": True}),
        (
            False,
            [RequestedOutput("a", binary=True), RequestedOutput("b", binary=None)],
            {"a": True, "b": False},
        ),
        (False, [RequestedOutput("b", binary=True)], {"a": False, "b": True}),
    ],
)
def test_per_output_binary_beats_the_default(
    binary_default: bool, requested: list | None, expected_binary: dict
) -> None:
    a, b = np.array([1, 2], np.int32), np.array([3.5], np.float64)
    response = make_response(Tensor("a", "INT32", (2,), a), Tensor("b", "FP64", (1,), b))
    body, header_length = encode_infer_response(response, requested, binary_default)
    assert (header_length is not None) == any(expected_binary.values())
    document, tail = split_body(body, header_length)
    blobs = binary_blobs(document, tail)
    for output, array in zip(document["outputs"], (a, b), strict=False):
        binary = expected_binary[output["name"]]
        assert ("data" not in output) == binary
        values = (
            np.frombuffer(blobs[output["name"]], array.dtype)
            if binary
            else np.array(output["data"], array.dtype)
        )
        assert values.tolist() == array.tolist()


def test_json_output_conversions() -> None:
    strided = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
    big_endian = np.array([1, 256], dtype=">i4")
    response = make_response(
        Tensor("h", "FP16", (2,), np.array([0.5, -1.25], np.float16)),
        Tensor("bf", "BF16", (2,), np.array([0x3F80, 0xC000], np.uint16)),
        Tensor("t", "FP64", (3, 2), strided),
        Tensor("be", "INT32", (2,), big_endian),
        Tensor("bad", "BYTES", (1,), np.array([b"\xff\xfeok"], dtype=object)),
        Tensor("u", "BYTES", (1,), np.array(["unicode"])),
    )
    document = orjson.loads(encode_infer_response(response, None, False)[0])
    data = {o["name"]: o["data"] for o in document["outputs"]}
    assert data["h"] == [0.5, -1.25]
    assert data["bf"] == [1.0, -2.0]
    assert data["t"] == strided.reshape(-1).tolist()
    assert data["be"] == [1, 256]
    assert data["bad"] == ["\ufffd\ufffdok"]
    assert data["u"] == ["unicode"]


def test_binary_output_normalises_dtype_and_layout() -> None:
    strided = np.arange(8, dtype=np.int32)[::2]
    response = make_response(
        Tensor("s", "INT32", (4,), strided),
        Tensor("d", "FP32", (2,), np.array([1.5, 2.5], np.float64)),
        Tensor("bf", "BF16", (1,), np.array([1.0], np.float32)),
    )
    body, header_length = encode_infer_response(response, None, True)
    blobs = binary_blobs(*split_body(body, header_length))
    assert np.frombuffer(blobs["s"], np.int32).tolist() == [0, 2, 4, 6]
    assert np.frombuffer(blobs["d"], np.float32).tolist() == [1.5, 2.5]
    assert np.frombuffer(blobs["bf"], np.uint16).tolist() == [0x3F80]


def test_output_parameters_and_binary_size_merge() -> None:
    response = make_response(
        Tensor("a", "INT8", (1,), np.array([1], np.int8), parameters={"k": "v"})
    )
    document, _ = split_body(*encode_infer_response(response, None, True))
    assert document["outputs"][0]["parameters"] == {"k": "v", "binary_data_size": 1}
    document, _ = split_body(*encode_infer_response(response, None, False))
    assert document["outputs"][0]["parameters"] == {"k": "v"}


def test_unknown_output_datatype_is_internal() -> None:
    response = make_response(Tensor("a", "FP8", (1,), np.zeros(1)))
    with pytest.raises(InternalError):
        encode_infer_response(response, None, False)


def test_decoded_request_round_trips_through_the_encoder() -> None:
    header = json_body(
        tensor_entry("x", "FP32", [2, 2], binary_data_size=16),
        tensor_entry("s", "BYTES", [1], ["q"]),
        outputs=[{"name": "x", "parameters": {"binary_data": True}}, {"name": "s"}],
    )
    request = decode_body(header + fp32_bytes(1, 2, 3, 4), len(header))
    response = make_response(*request.inputs)
    body, header_length = encode_infer_response(
        response, request.outputs, request.parameters.get("binary_data_output", False)
    )
    document, tail = split_body(body, header_length)
    assert np.frombuffer(binary_blobs(document, tail)["x"], np.float32).tolist() == [1, 2, 3, 4]
    assert document["outputs"][1]["data"] == ["q"]


def test_encode_error() -> None:
    assert orjson.loads(encode_error("bad 'thing' \"quoted\"")) == {
        "error": "bad 'thing' \"quoted\""
    }


# --------------------------------------------------------------------------- tritonclient


def test_tritonclient_request_and_response_round_trip() -> None:
    """The bodies tritonclient builds decode, and what we encode parses back in tritonclient."""
    httpclient = pytest.importorskip("tritonclient.http")
    from protocol.compression import compress

    arrays = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "f16": np.array([[0.5, -1.5]], dtype=np.float16),
        "i32": np.array([[1, -2, 3]], dtype=np.int32),
        "flag": np.array([[True, False]]),
        "text": np.array([[b"ab", "ç".encode()]], dtype=object),
    }
    datatypes = {"f32": "FP32", "f16": "FP16", "i32": "INT32", "flag": "BOOL", "text": "BYTES"}
    inputs = []
    for name, array in arrays.items():
        infer_input = httpclient.InferInput(name, list(array.shape), datatypes[name])
        infer_input.set_data_from_numpy(array, binary_data=name not in ("i32", "flag"))
        inputs.append(infer_input)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=name != "text") for name in arrays]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs, request_id="r9", parameters={"custom": 3}
    )

    request = decode_body(body, json_size)
    assert request.id == "r9" and request.parameters["custom"] == 3
    for tensor in request.inputs:
        assert tensor.data.tolist() == arrays[tensor.name].tolist()

    response = InferResponse(MODEL, "1", request.id, outputs=request.inputs)
    payload, header_length = encode_infer_response(response, request.outputs, False)
    for encoding in (None, "gzip", "deflate"):
        result = httpclient.InferenceServerClient.parse_response_body(
            compress(payload, encoding), header_length=header_length, content_encoding=encoding
        )
        assert result.get_response()["id"] == "r9"
        for name, array in arrays.items():
            got = result.as_numpy(name)
            assert got.shape == array.shape
            if name == "text":  # JSON BYTES come back to tritonclient as str
                got = np.vectorize(str.encode, otypes=[object])(got)
            assert got.tolist() == array.tolist()


def test_tritonclient_default_outputs_are_binary() -> None:
    httpclient = pytest.importorskip("tritonclient.http")
    infer_input = httpclient.InferInput("x", [2], "INT64")
    infer_input.set_data_from_numpy(np.array([7, 8], np.int64))
    body, json_size = httpclient.InferenceServerClient.generate_request_body([infer_input])
    request = decode_body(body, json_size)
    assert request.outputs is None
    assert request.parameters.get("binary_data_output") is True
    payload, header_length = encode_infer_response(
        InferResponse(MODEL, "1", outputs=request.inputs), request.outputs, True
    )
    result = httpclient.InferenceServerClient.parse_response_body(
        payload, header_length=header_length
    )
    assert result.as_numpy("x").tolist() == [7, 8]


# ------------------------------------------------------------- remembered answer heads


def _binary_answer(values: np.ndarray, version: str = "1") -> InferResponse:
    return InferResponse(
        model_name="add",
        model_version=version,
        outputs=[
            Tensor("OUTPUT0", "FP32", values.shape, values, {}),
            Tensor("OUTPUT1", "FP32", values.shape, -values, {}),
        ],
    )


def test_an_all_binary_answer_is_encoded_from_its_remembered_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from protocol.rest import encode

    monkeypatch.setattr(encode, "_answer_heads", {})
    asked = [RequestedOutput("OUTPUT0", True), RequestedOutput("OUTPUT1", True)]
    first = encode.encode_infer_response_parts(_binary_answer(_F32), asked, False)
    assert len(encode._answer_heads) == 1
    second_values = _F32 + 1
    parts, json_length = encode.encode_infer_response_parts(
        _binary_answer(second_values), asked, False
    )
    assert len(encode._answer_heads) == 1 and parts[0] == first[0][0]  # the same head, reused
    header = orjson.loads(parts[0])
    assert json_length == len(parts[0])
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [24, 24]
    assert bytes(parts[1]) == second_values.tobytes()  # this answer's values, not the first's
    assert bytes(parts[2]) == (-second_values).tobytes()
    # another shape or version is another head, encoded in full
    other = encode.encode_infer_response_parts(_binary_answer(_F32[:1], "2"), asked, False)
    assert orjson.loads(other[0][0])["model_version"] == "2"
    assert orjson.loads(other[0][0])["outputs"][0]["shape"] == [1, 3]
    assert len(encode._answer_heads) == 2


@pytest.mark.parametrize(
    "case",
    ["json output", "bytes output", "answer id", "output parameters"],
)
def test_answers_whose_json_varies_are_not_remembered(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from protocol.rest import encode

    monkeypatch.setattr(encode, "_answer_heads", {})
    response = _binary_answer(_F32)
    asked: list[RequestedOutput] | None = None
    if case == "json output":
        asked = [RequestedOutput("OUTPUT0", True), RequestedOutput("OUTPUT1", False)]
    elif case == "bytes output":
        response.outputs.append(Tensor("s", "BYTES", (3,), _STR, {}))
    elif case == "answer id":
        response.id = "r1"
    else:
        response.outputs[0].parameters = {"shared_memory_region": "r"}
    encode.encode_infer_response_parts(response, asked, True)
    assert encode._answer_heads == {}


def test_a_remembered_head_is_kept_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from protocol.rest import encode

    monkeypatch.setattr(encode, "_answer_heads", {})
    monkeypatch.setattr(encode, "ANSWER_HEADS_KEPT", 2)
    for rows in range(1, 5):
        parts, _ = encode.encode_infer_response_parts(
            _binary_answer(np.zeros((rows, 2), np.float32)), None, True
        )
        assert orjson.loads(parts[0])["outputs"][0]["shape"] == [rows, 2]
    assert len(encode._answer_heads) == 2
