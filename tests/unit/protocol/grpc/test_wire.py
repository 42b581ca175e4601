"""protocol/grpc/wire.py: a received ModelInferRequest reads as protobuf reads it, with its raw
contents as views of the received bytes; a malformed one fails exactly as protobuf fails; an
answer serializes to the bytes protobuf would write (compared canonically: protobuf fixes no order
for map entries, and upb's differs between two equal messages)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.grpc import codec, wire
from protocol.proto import grpc_service_pb2 as pb
from protocol.types import InferResponse, Tensor

texts = st.text(max_size=12)


@pytest.fixture(autouse=True)
def scan_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk runs for every message here, not only for large ones."""
    monkeypatch.setattr(wire, "SCAN_FROM_BYTES", 0)


def as_protobuf(parsed: pb.ModelInferRequest | wire.InferRequestMessage) -> pb.ModelInferRequest:
    if isinstance(parsed, pb.ModelInferRequest):
        return parsed
    message = pb.ModelInferRequest()
    message.CopyFrom(parsed.message)
    message.raw_input_contents.extend([bytes(raw) for raw in parsed.raw_input_contents])
    return message


def canonical(data: bytes, kind: type = pb.ModelInferResponse) -> bytes:
    """A serialized message re-serialized with map entries in key order."""
    return kind.FromString(data).SerializeToString(deterministic=True)


def outcome(parse, data: bytes) -> tuple[str, object]:
    """What a parse gives: the message's canonical bytes, or the exception's type and text."""
    try:
        return "ok", as_protobuf(parse(data)).SerializeToString(deterministic=True)
    except Exception as exc:
        return "error", (type(exc), str(exc))


@st.composite
def requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(
        model_name=draw(texts), model_version=draw(texts), id=draw(texts)
    )
    for key in draw(st.lists(texts, max_size=3, unique=True)):
        message.parameters[key].int64_param = draw(st.integers(-(2**63), 2**63 - 1))
    for _ in range(draw(st.integers(0, 3))):
        tensor = message.inputs.add(
            name=draw(texts),
            datatype=draw(st.sampled_from(["UINT8", "FP32", "BYTES"])),
            shape=draw(st.lists(st.integers(0, 2**40), max_size=3)),
        )
        if draw(st.booleans()):
            tensor.parameters["shared_memory_region"].string_param = draw(texts)
    for _ in range(draw(st.integers(0, 2))):
        message.outputs.add(name=draw(texts))
    sizes = st.one_of(st.integers(0, 300), st.integers(16_000, 70_000))
    for size in draw(st.lists(sizes, max_size=4)):
        message.raw_input_contents.append(draw(st.binary(min_size=size, max_size=size)))
    return message


def records(message: pb.ModelInferRequest) -> list[bytes]:
    """Each top-level record of the message's serialization on its own."""
    parts = []
    for field, value in message.ListFields():
        for item in value if field.is_repeated else [value]:
            one = pb.ModelInferRequest()
            target = getattr(one, field.name)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                target[item].CopyFrom(value[item])
            elif field.is_repeated:
                (target.add().CopyFrom(item) if field.message_type else target.append(item))
            else:
                setattr(one, field.name, item)
            parts.append(one.SerializeToString())
    return parts


@settings(max_examples=150, deadline=None)
@given(requests())
def test_a_valid_request_reads_as_protobuf_reads_it(message: pb.ModelInferRequest) -> None:
    data = message.SerializeToString()
    parsed = wire.parse_infer_request(data)
    assert as_protobuf(parsed) == pb.ModelInferRequest.FromString(data)
    if message.raw_input_contents:  # the raw contents are the received bytes themselves
        assert isinstance(parsed, wire.InferRequestMessage)
        assert not parsed.message.raw_input_contents
        assert [bytes(raw) for raw in parsed.raw_input_contents] == list(message.raw_input_contents)
        assert all(raw.obj is data for raw in parsed.raw_input_contents)
        assert parsed.ByteSize() == len(data)


@settings(max_examples=100, deadline=None)
@given(requests(), st.randoms(use_true_random=False))
def test_records_in_any_order_read_as_protobuf_reads_them(
    message: pb.ModelInferRequest, rng: random.Random
) -> None:
    """A client may send raw_input_contents before the inputs, or mix the records."""
    parts = records(message)
    rng.shuffle(parts)
    data = b"".join(parts)
    assert outcome(wire.parse_infer_request, data) == outcome(pb.ModelInferRequest.FromString, data)


@settings(max_examples=300, deadline=None)
@given(requests(), st.data())
def test_a_damaged_request_fails_or_reads_exactly_as_protobuf(
    message: pb.ModelInferRequest, data: st.DataObject
) -> None:
    """Cut off anywhere, a byte changed anywhere, junk appended: the same outcome either way."""
    wire_bytes = bytearray(message.SerializeToString() or b"\x0a\x00")
    kind = data.draw(st.sampled_from(["cut", "flip", "append"]))
    if kind == "cut":
        wire_bytes = wire_bytes[: data.draw(st.integers(0, len(wire_bytes)))]
    elif kind == "flip":
        wire_bytes[data.draw(st.integers(0, len(wire_bytes) - 1))] = data.draw(st.integers(0, 255))
    else:
        wire_bytes += data.draw(st.binary(min_size=1, max_size=12))
    damaged = bytes(wire_bytes)
    assert outcome(wire.parse_infer_request, damaged) == outcome(
        pb.ModelInferRequest.FromString, damaged
    )


RAW = b"\x3a\x04abcd"  # field 7, length 4
CASES = {
    "truncated varint in a tag": RAW + b"\xff\xff",
    "truncated length": RAW + b"\x3a\xff",
    "a tag with no length after it": RAW + b"\x3a",
    "a two-byte length": RAW + b"\x3a\x80\x01" + b"x" * 128,
    "length past the end": RAW + b"\x3a\x10abc",
    "huge declared length": RAW + b"\x3a\xff\xff\xff\xff\x0f",
    "varint of eleven bytes": RAW + b"\x08" + b"\xff" * 10 + b"\x01",
    "field 7 as a varint": RAW + b"\x38\x05",
    "field 7 as fixed32": RAW + b"\x3d\x01\x02\x03\x04",
    "unknown field": RAW + b"\xa0\x06\x01",
    "unknown length-delimited field": RAW + b"\xa2\x06\x02hi",
    "a group": RAW + b"\xa3\x06\xa4\x06",
    "an end group alone": RAW + b"\xa4\x06",
    "field 0": RAW + b"\x02\x00",
    "wire type 7": RAW + b"\x0f",
    "a model name that is not UTF-8": RAW + b"\x0a\x02\xff\xfe",
    "an input that does not parse": RAW + b"\x2a\x02\x08",
    "field 7 before the inputs": RAW
    + pb.ModelInferRequest(inputs=[{"name": "X"}]).SerializeToString(),
}


@pytest.mark.parametrize("data", CASES.values(), ids=CASES.keys())
def test_malformed_and_unusual_messages_read_as_protobuf_reads_them(data: bytes) -> None:
    assert outcome(wire.parse_infer_request, data) == outcome(pb.ModelInferRequest.FromString, data)


def test_a_message_of_very_many_records_is_left_to_protobuf() -> None:
    """Hostile input: a raw entry then 100,000 one-field records is not walked in Python."""
    data = RAW + b"\xa0\x06\x01" * 100_000
    parsed = wire.parse_infer_request(data)
    assert type(parsed) is pb.ModelInferRequest
    assert list(parsed.raw_input_contents) == [b"abcd"]
    few = RAW + b"\xa0\x06\x01" * (wire.SCAN_MAX_RECORDS - 1)
    assert type(wire.parse_infer_request(few)) is wire.InferRequestMessage


def test_field_7_before_inputs_still_gives_views() -> None:
    data = CASES["field 7 before the inputs"]
    parsed = wire.parse_infer_request(data)
    assert isinstance(parsed, wire.InferRequestMessage)
    assert [bytes(r) for r in parsed.raw_input_contents] == [b"abcd"]
    assert parsed.inputs[0].name == "X"


def test_small_requests_are_left_to_protobuf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "SCAN_FROM_BYTES", 1 << 10)
    small = pb.ModelInferRequest(raw_input_contents=[b"x" * 100]).SerializeToString()
    large = pb.ModelInferRequest(raw_input_contents=[b"x" * 2000]).SerializeToString()
    assert type(wire.parse_infer_request(small)) is pb.ModelInferRequest
    assert type(wire.parse_infer_request(large)) is wire.InferRequestMessage


def test_decoded_tensors_are_views_of_the_received_bytes() -> None:
    values = np.arange(6000, dtype=np.float32)
    message = pb.ModelInferRequest(model_name="m", id="r")
    message.inputs.add(name="X", datatype="FP32", shape=[2, 3000])
    message.raw_input_contents.append(values.tobytes())
    data = message.SerializeToString()
    request = codec.decode_infer_request(wire.parse_infer_request(data))
    tensor = request.inputs[0].data
    assert (request.model_name, request.id) == ("m", "r")
    assert np.array_equal(tensor.reshape(-1), values)
    assert np.shares_memory(tensor, np.frombuffer(data, np.uint8))


# ----- answers ------------------------------------------------------------------------------
def sample_response() -> InferResponse:
    return InferResponse(
        "m",
        "1",
        id="r",
        outputs=[
            Tensor("A", "FP32", (2, 3), np.arange(6, dtype=np.float32).reshape(2, 3)),
            Tensor("B", "INT64", (3,), np.arange(9, dtype=np.int64)[::3]),  # not contiguous
            Tensor("C", "BYTES", (2,), np.array([b"ab", "cd"], dtype=object)),
            Tensor("D", "FP32", (0,), np.zeros(0, np.float32)),
            Tensor("S", "FP32", (4,), np.zeros(4, np.float32), {"shared_memory_region": "r"}),
            Tensor("L", "UINT8", (200_000,), np.full(200_000, 7, np.uint8)),
        ],
        parameters={"sequence_id": 3},
    )


def test_an_answer_serializes_to_protobufs_own_bytes() -> None:
    answer = codec.encode_infer_answer(sample_response(), "other")
    message = answer.to_message()
    data = answer.SerializeToString()
    assert canonical(data) == message.SerializeToString(deterministic=True)
    assert answer.ByteSize() == len(data) == message.ByteSize()
    parsed = pb.ModelInferResponse.FromString(data)
    assert parsed.id == "r" and [o.name for o in parsed.outputs] == ["A", "B", "C", "D", "S", "L"]
    assert np.frombuffer(parsed.raw_output_contents[1], np.int64).tolist() == [0, 3, 6]
    assert parsed.raw_output_contents[2] == b"\x02\x00\x00\x00ab\x02\x00\x00\x00cd"
    assert parsed.raw_output_contents[3] == parsed.raw_output_contents[4] == b""
    assert parsed.raw_output_contents[5] == b"\x07" * 200_000


def planless(response: InferResponse) -> bytes:
    """The answer as protobuf alone writes it: every field built in the message."""
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for tensor in response.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
    message.raw_output_contents.extend(
        [np.ascontiguousarray(t.data).tobytes() for t in response.outputs]
    )
    return message.SerializeToString()


@settings(max_examples=60, deadline=None)
@given(
    model=texts,
    version=st.sampled_from(["", "1", "17"]),
    request_id=texts,
    outputs=st.lists(
        st.tuples(texts, st.lists(st.integers(0, 3) | st.integers(128, 70_000), max_size=3)),
        max_size=3,
    ),
)
def test_an_answer_without_parameters_is_the_bytes_protobuf_writes(
    model: str, version: str, request_id: str, outputs: list[tuple[str, list[int]]]
) -> None:
    """Such an answer's head is its scalar fields and remembered output records joined:
    byte for byte protobuf's message, every time its signature is seen again, and the same
    once a stream sets its final flag on it."""
    small = [(name, tuple(shape)) for name, shape in outputs if np.prod(shape) < 4096]
    tensors = [Tensor(name, "UINT8", shape, np.zeros(shape, np.uint8)) for name, shape in small]
    response = InferResponse(model, version, id=request_id, outputs=tensors)
    for _ in range(2):  # built, then remembered
        answer = codec.encode_infer_answer(response)
        assert answer.SerializeToString() == planless(response)
        assert answer.ByteSize() == len(planless(response))
    streamed = codec.stream_response(codec.encode_infer_answer(response), final=True)
    parsed = pb.ModelStreamInferResponse.FromString(wire.serialize(streamed))
    assert parsed.infer_response.parameters["triton_final_response"].bool_param is True
    assert parsed.infer_response.id == request_id
    assert [o.name for o in parsed.infer_response.outputs] == [t.name for t in tensors]


def test_the_remembered_output_records_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "_output_records", {})
    monkeypatch.setattr(codec, "OUTPUT_RECORDS_KEPT", 4)
    for rows in range(1, 10):  # nine shapes: nine signatures
        response = InferResponse(
            "m", "1", outputs=[Tensor("O", "FP32", (rows, 2), np.ones((rows, 2), np.float32))]
        )
        assert codec.encode_infer_answer(response, "x").SerializeToString() == planless(
            InferResponse("m", "1", id="x", outputs=response.outputs)
        )
    assert len(codec._output_records) == 4
    listed = InferResponse(
        "m", "1", outputs=[Tensor("O", "FP32", [1, 2], np.ones((1, 2), np.float32))]
    )
    assert codec.encode_infer_answer(listed).SerializeToString() == planless(listed)  # a list shape


def test_an_answer_keeps_the_output_arrays_until_serialized() -> None:
    data = np.full(100_000, 3, np.uint8)
    answer = codec.encode_infer_answer(
        InferResponse("m", "1", outputs=[Tensor("O", "UINT8", (100_000,), data)])
    )
    assert np.shares_memory(np.frombuffer(answer.raw[0], np.uint8), data)
    assert canonical(wire.serialize(answer)) == canonical(answer.to_message().SerializeToString())
    assert canonical(wire.serialize(answer.to_message())) == canonical(answer.SerializeToString())


@pytest.mark.parametrize("final", [True, False])
def test_a_stream_answer_serializes_to_protobufs_own_bytes(final: bool) -> None:
    answer = codec.stream_response(codec.encode_infer_answer(sample_response(), "s"), final)
    assert isinstance(answer, wire.StreamAnswer)
    data = wire.serialize(answer)
    stream = pb.ModelStreamInferResponse
    assert canonical(data, stream) == answer.to_message().SerializeToString(deterministic=True)
    assert answer.ByteSize() == len(data)
    parsed = pb.ModelStreamInferResponse.FromString(data)
    assert not parsed.error_message
    assert parsed.infer_response.parameters["triton_final_response"].bool_param is final
    assert parsed.infer_response.raw_output_contents[5] == b"\x07" * 200_000


def test_protobuf_stream_answers_keep_their_shape() -> None:
    """The flag-only final answer and failures stay protobuf messages, as before."""
    empty = codec.stream_empty_final("m", "r")
    assert (empty.infer_response.model_name, empty.infer_response.id) == ("m", "r")
    assert empty.infer_response.parameters["triton_final_response"].bool_param
    assert not empty.infer_response.model_version and not empty.infer_response.outputs
    plain = codec.stream_response(pb.ModelInferResponse(id="a"), False)
    assert isinstance(plain, pb.ModelStreamInferResponse)
    assert wire.serialize(plain) == plain.SerializeToString()


@pytest.mark.parametrize("length", [0, 1, 127, 128, 16_383, 16_384, 2_097_152, 2**31 - 1])
def test_length_prefixes_are_protobufs_varints(length: int) -> None:
    prefix = wire._length_prefix(b"\x32", length)
    assert prefix[0] == 0x32
    assert wire._varint(prefix, 1) == (length, len(prefix))
