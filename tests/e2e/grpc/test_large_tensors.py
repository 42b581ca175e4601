"""Large tensors over gRPC on both servers (`--grpc-server aio` and `threads`), where
protocol/grpc/wire.py reads the raw contents in place and writes the answer from the arrays:
the values come back intact, unary and streamed, whatever the order of the message's records;
a large message that is damaged is INVALID_ARGUMENT with protobuf's words, never UNKNOWN."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from harness.serverproc import ServerProcess, running_server
from harness.testmodels import build_identity_fp32
from protocol.proto import grpc_service_pb2 as pb

pytestmark = pytest.mark.e2e

ELEMENTS = 300_000  # 1.2 MB of FP32: well past wire.SCAN_FROM_BYTES
OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
]
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module", params=["aio", "threads"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("large_models")
    build_identity_fp32(repo)
    args = ["--grpc-server", request.param]
    with running_server([repo], args, log_dir=tmp_path_factory.mktemp("logs")) as process:
        yield process


@pytest.fixture
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url, options=OPTIONS) as opened:
        yield opened


def values(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((2, ELEMENTS // 2)).astype(np.float32)


def request_bytes(data: np.ndarray, request_id: str = "r", raw_first: bool = False) -> bytes:
    """A ModelInferRequest for identity_fp32; `raw_first`: raw_input_contents before inputs."""
    head = pb.ModelInferRequest(model_name="identity_fp32", id=request_id)
    head.inputs.add(name="INPUT", datatype="FP32", shape=list(data.shape))
    raw = pb.ModelInferRequest(raw_input_contents=[data.tobytes()]).SerializeToString()
    return raw + head.SerializeToString() if raw_first else head.SerializeToString() + raw


def unary(channel: grpc.Channel):  # type: ignore[no-untyped-def]
    return channel.unary_unary(
        MODEL_INFER,
        request_serializer=lambda data: data,
        response_deserializer=pb.ModelInferResponse.FromString,
    )


def output(response: pb.ModelInferResponse) -> np.ndarray:
    (tensor,) = response.outputs
    return np.frombuffer(response.raw_output_contents[0], np.float32).reshape(tuple(tensor.shape))


def test_tritonclient_gets_its_large_tensor_back(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url, channel_args=OPTIONS)
    data = values(1)
    tensor = grpcclient.InferInput("INPUT", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    for _ in range(3):
        result = client.infer("identity_fp32", [tensor], request_id="t")
        assert np.array_equal(result.as_numpy("OUTPUT"), data)
        assert result.get_response().id == "t"
    client.close()


@pytest.mark.parametrize("raw_first", [False, True], ids=["inputs-first", "raw-first"])
def test_a_unary_answer_is_the_tensor_sent(channel: grpc.Channel, raw_first: bool) -> None:
    data = values(2)
    response = unary(channel)(request_bytes(data, "u", raw_first), timeout=60)
    assert response.id == "u" and response.model_name == "identity_fp32"
    assert np.array_equal(output(response), data)


def test_streamed_answers_are_the_tensors_sent(channel: grpc.Channel) -> None:
    stream = channel.stream_stream(
        MODEL_STREAM_INFER,
        request_serializer=lambda data: data,
        response_deserializer=pb.ModelStreamInferResponse.FromString,
    )
    sent = {str(seed): values(seed) for seed in range(3)}
    answers = list(stream(iter([request_bytes(d, i) for i, d in sent.items()]), timeout=60))
    assert len(answers) == 3
    for answer in answers:
        assert not answer.error_message
        assert np.array_equal(output(answer.infer_response), sent[answer.infer_response.id])


DAMAGED = {
    "cut short": lambda data: data[:-1000],
    "a length past the end": lambda data: data + b"\x3a\xff\xff\x7f",
    "a truncated varint": lambda data: data + b"\xff\xff",
    "a group": lambda data: data + b"\xa3\x06",
}


@pytest.mark.parametrize("damage", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_large_message_is_invalid_argument(channel: grpc.Channel, damage) -> None:  # type: ignore[no-untyped-def]
    damaged = damage(request_bytes(values(3)))
    with pytest.raises(grpc.RpcError) as error:
        unary(channel)(damaged, timeout=60)
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("malformed request message: Error parsing")
    # the server goes on answering
    assert np.array_equal(output(unary(channel)(request_bytes(values(4)), timeout=60)), values(4))


def test_a_field_7_sent_as_a_varint_is_an_unknown_field(channel: grpc.Channel) -> None:
    """As protobuf reads it: not raw contents, so the input has none (the model's error)."""
    head = pb.ModelInferRequest(model_name="identity_fp32", id="v")
    head.inputs.add(name="INPUT", datatype="FP32", shape=[1, ELEMENTS])
    padding = pb.ModelInferRequest(id="x" * 100_000).SerializeToString()  # large enough to scan
    with pytest.raises(grpc.RpcError) as error:
        unary(channel)(padding + head.SerializeToString() + b"\x38\x05", timeout=60)
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed" not in error.value.details()
