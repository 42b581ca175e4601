"""ModelInfer's bytes on the wire with the tensor bytes left where they are.

Why: protobuf's Python messages own their bytes fields. Parsing a ModelInferRequest copies each
raw_input_contents entry into protobuf's arena, and reading it back copies it again into a new
`bytes`; an answer's raw_output_contents are copied into the message from the arrays and once
more by SerializeToString (which, for megabytes, costs 4-5 memcpys: bench/FINDINGS.md, "gRPC
tensor bytes"). Here only the small fields go through protobuf:

- `parse_infer_request` walks the top level of a received ModelInferRequest, keeps each field-7
  (raw_input_contents) entry as a memoryview of the received bytes, and lets protobuf parse the
  rest. Anything the walk does not expect (a truncated varint, a length past the end, a group,
  a tag of field 0) sends the whole message to protobuf's own parse, so a malformed message
  gets exactly protobuf's answer, and protobuf stays the judge of every field it parses.
- `InferAnswer.SerializeToString` writes the small fields with protobuf and appends each
  field-6 (raw_output_contents) entry, tag and length before the output array's own bytes, in
  one `b"".join`: the arrays' bytes are copied once, into the bytes grpc sends. A stream's
  answer (`StreamAnswer`) is the same bytes behind the tag and length of its field 2.

Small messages are left to protobuf whole (`SCAN_FROM_BYTES`): there the walk's Python loop
costs more than the copies it saves. Nothing here imports grpc.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from protocol.proto import grpc_service_pb2 as pb

SCAN_FROM_BYTES = 96 << 10  # a request of fewer bytes is parsed by protobuf whole (measured)
# Top-level records the walk reads before it leaves the message to protobuf: a real request has
# a few per input; 64 MiB of two-byte records would keep the Python loop (and, on grpc.aio,
# the event loop) busy for seconds where protobuf's C parse takes milliseconds.
SCAN_MAX_RECORDS = 4096
RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
RAW_OUTPUT_FIELD = 6  # ModelInferResponse.raw_output_contents
INFER_RESPONSE_FIELD = 2  # ModelStreamInferResponse.infer_response
_LENGTH_DELIMITED, _VARINT, _FIXED64, _FIXED32 = 2, 0, 1, 5
_RAW_INPUT_TAG = RAW_INPUT_FIELD << 3 | _LENGTH_DELIMITED
_RAW_OUTPUT_TAG = bytes([RAW_OUTPUT_FIELD << 3 | _LENGTH_DELIMITED])
_INFER_RESPONSE_TAG = bytes([INFER_RESPONSE_FIELD << 3 | _LENGTH_DELIMITED])
_MAX_TAG = (1 << 32) - 1
_MAX_VARINT_BYTES = 10


class InferRequestMessage:
    """A received ModelInferRequest: protobuf's message of its small fields, and its
    raw_input_contents as views of the received bytes (which they keep alive). It answers
    what the servicers and protocol/grpc/codec.py read of a ModelInferRequest."""

    __slots__ = ("message", "raw_input_contents", "size")

    def __init__(self, message: pb.ModelInferRequest, raw: list[memoryview], size: int) -> None:
        self.message = message
        self.raw_input_contents = raw
        self.size = size

    @property
    def model_name(self) -> str:
        return self.message.model_name

    @property
    def model_version(self) -> str:
        return self.message.model_version

    @property
    def id(self) -> str:
        return self.message.id

    @property
    def parameters(self) -> Any:
        return self.message.parameters

    @property
    def inputs(self) -> Any:
        return self.message.inputs

    @property
    def outputs(self) -> Any:
        return self.message.outputs

    def ByteSize(self) -> int:
        """The received message's size."""
        return self.size


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it; (-1, pos) when it is cut off or longer
    than protobuf allows."""
    value = shift = 0
    end = min(len(data), pos + _MAX_VARINT_BYTES)
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    return -1, pos


def scan(data: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]] | None:
    """The (start, stop) spans of the other fields' records and of the field-7 entries'
    contents, in order; None when the top level is not a sequence of well-formed records, or
    has more than SCAN_MAX_RECORDS of them."""
    end = len(data)
    pos = keep_from = 0
    kept: list[tuple[int, int]] = []
    raw: list[tuple[int, int]] = []
    records = 0
    while pos < end:
        records += 1
        if records > SCAN_MAX_RECORDS:
            return None
        start = pos
        tag = data[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = _varint(data, pos)
            if tag < 0 or tag > _MAX_TAG:
                return None
        wire = tag & 7
        if tag >> 3 == 0:
            return None
        if wire == _LENGTH_DELIMITED:
            if pos < end and data[pos] < 0x80:  # a length under 128: one byte, as for tags
                length = data[pos]
                pos += 1
            else:
                length, pos = _varint(data, pos)
            if length < 0 or length > end - pos:
                return None
            if tag == _RAW_INPUT_TAG:
                if keep_from < start:
                    kept.append((keep_from, start))
                raw.append((pos, pos + length))
                keep_from = pos + length
            pos += length
        elif wire == _VARINT:
            value, pos = _varint(data, pos)
            if value < 0:
                return None
        elif wire == _FIXED64:
            pos += 8
        elif wire == _FIXED32:
            pos += 4
        else:  # groups, and wire types protobuf refuses: its own parse decides
            return None
        if pos > end:
            return None
    if keep_from < end:
        kept.append((keep_from, end))
    return kept, raw


def parse_infer_request(data: bytes) -> pb.ModelInferRequest | InferRequestMessage:
    """A received ModelInferRequest, its raw_input_contents not copied when it is large;
    raises protobuf's DecodeError exactly where `ModelInferRequest.FromString` would."""
    if len(data) < SCAN_FROM_BYTES:
        return pb.ModelInferRequest.FromString(data)
    spans = scan(data)
    if spans is None or not spans[1]:
        return pb.ModelInferRequest.FromString(data)
    kept, raw = spans
    view = memoryview(data)
    rest = b"".join([view[start:stop] for start, stop in kept])
    try:
        message = pb.ModelInferRequest.FromString(rest)
    except Exception:  # a field protobuf refuses: its error, as for the whole message
        return pb.ModelInferRequest.FromString(data)
    return InferRequestMessage(message, [view[start:stop] for start, stop in raw], len(data))


# ----- answers ------------------------------------------------------------------------------
def _length_prefix(tag: bytes, length: int) -> bytes:
    """A length-delimited record's tag and varint length."""
    out = bytearray(tag)
    while length >= 0x80:
        out.append(length & 0x7F | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out)


class InferAnswer:
    """A ModelInferResponse whose raw_output_contents stay the outputs' own buffers until it is
    serialized: `message` holds every other field, or `head` holds them already serialized
    (an answer encoded from a plan, protocol/grpc/codec.py). `SerializeToString` is what grpc's
    response serializer calls (server/grpc/services.py) and is what protobuf would write (map
    entries in whichever order protobuf's own serialization of `message` puts them)."""

    __slots__ = ("_message", "_head", "raw")

    def __init__(
        self,
        message: pb.ModelInferResponse | None,
        raw: Sequence[bytes | memoryview],
        head: bytes | None = None,
    ) -> None:
        self._message = message
        self._head = head
        self.raw = raw

    @property
    def message(self) -> pb.ModelInferResponse:
        """Every field but the raw contents, to read or change (a stream's answer sets its
        final flag): an answer given as `head` is parsed back the first time it is asked."""
        if self._message is None:
            self._message = pb.ModelInferResponse.FromString(self._head or b"")
            self._head = None
        return self._message

    def parts(self) -> tuple[list[bytes | memoryview], int]:
        """The serialized message in pieces (the arrays' buffers among them), and its size."""
        head = self._head
        if head is None:
            head = self.message.SerializeToString()
        parts: list[bytes | memoryview] = [head]
        size = len(head)
        for entry in self.raw:
            prefix = _length_prefix(_RAW_OUTPUT_TAG, len(entry))
            parts += (prefix, entry)
            size += len(prefix) + len(entry)
        return parts, size

    def SerializeToString(self) -> bytes:
        return b"".join(self.parts()[0])

    def ByteSize(self) -> int:
        head = len(self._head) if self._head is not None else self.message.ByteSize()
        return head + sum(
            len(_length_prefix(_RAW_OUTPUT_TAG, len(entry))) + len(entry) for entry in self.raw
        )

    def to_message(self) -> pb.ModelInferResponse:
        """The same answer as one protobuf message (copies the outputs: for tests)."""
        message = pb.ModelInferResponse()
        message.CopyFrom(self.message)
        message.raw_output_contents.extend([bytes(entry) for entry in self.raw])
        return message


class StreamAnswer:
    """A ModelStreamInferResponse carrying an InferAnswer (`infer_response`, no
    `error_message`), serialized the same way: the outputs' bytes copied once."""

    __slots__ = ("answer",)

    def __init__(self, answer: InferAnswer) -> None:
        self.answer = answer

    def SerializeToString(self) -> bytes:
        parts, size = self.answer.parts()
        return b"".join([_length_prefix(_INFER_RESPONSE_TAG, size), *parts])

    def ByteSize(self) -> int:
        size = self.answer.ByteSize()
        return len(_length_prefix(_INFER_RESPONSE_TAG, size)) + size

    def to_message(self) -> pb.ModelStreamInferResponse:
        """The same answer as one protobuf message (for tests)."""
        return pb.ModelStreamInferResponse(infer_response=self.answer.to_message())


def serialize(answer: Any) -> bytes:
    """grpc's response serializer for ModelInfer and ModelStreamInfer: an InferAnswer, a
    StreamAnswer or a protobuf message."""
    return answer.SerializeToString()
