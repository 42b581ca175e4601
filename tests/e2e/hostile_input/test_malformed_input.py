"""Input that used to answer 500 / INTERNAL / UNKNOWN is refused as 400 / INVALID_ARGUMENT
(issue 13, item 5): zero-element tensors whose shapes numpy cannot hold, more dimensions than
numpy allows, an unknown trace setting with an empty value, and gRPC messages that do not
parse. Raw HTTP, tritonclient and a raw gRPC channel against the shared example server."""

from __future__ import annotations

import json
import socket
import struct

import grpc
import httpx
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from protocol.proto import grpc_service_pb2 as pb
from protocol.proto.grpc_service_pb2_grpc import GRPCInferenceServiceStub

pytestmark = pytest.mark.e2e

HUGE = 2**63 - 1  # [HUGE, 0] holds no element, but numpy refuses to build that array
GARBAGE = b"\xff\xff\xff\xff"  # not a protobuf message of any type


def _post(server, model: str, body: bytes, header_length: int | None = None) -> httpx.Response:
    headers = (
        {} if header_length is None else {"Inference-Header-Content-Length": str(header_length)}
    )
    return httpx.post(
        f"{server.base}/v2/models/{model}/infer", content=body, headers=headers, timeout=30
    )


def _simple_inputs(**fields) -> list[dict]:
    return [
        {"name": name, "shape": [HUGE, 0], "datatype": "INT32", **fields}
        for name in ("INPUT0", "INPUT1")
    ]


@pytest.mark.parametrize(
    "model, body, binary",
    [
        ("simple", {"inputs": _simple_inputs(data=[])}, False),
        ("simple", {"inputs": _simple_inputs(parameters={"binary_data_size": 0})}, True),
        (
            "identity_bytes",
            {"inputs": [{"name": "INPUT", "shape": [HUGE, 0], "datatype": "BYTES", "data": []}]},
            False,
        ),
        (
            "identity_bytes",
            {
                "inputs": [
                    {
                        "name": "INPUT",
                        "shape": [0, 2**62],
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": 0},
                    }
                ]
            },
            True,
        ),
    ],
    ids=["json", "binary", "bytes-json", "bytes-binary"],
)
def test_zero_element_tensors_with_huge_shapes_are_400_over_http(
    example_server, model, body, binary
) -> None:
    payload = json.dumps(body).encode()
    reply = _post(example_server, model, payload, len(payload) if binary else None)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "is too large" in error and "of input 'INPUT" in error


def _grpc_stub(server) -> tuple[grpc.Channel, GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(server.grpc_url)
    return channel, GRPCInferenceServiceStub(channel)


def _infer_status(
    stub: GRPCInferenceServiceStub, request: pb.ModelInferRequest
) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(request, timeout=30)
    return error.value.code(), error.value.details()


def _request(
    model: str, datatype: str, shape: list[int], names: tuple[str, ...]
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    for name in names:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    return request


def test_shapes_numpy_cannot_hold_are_invalid_arguments_over_grpc(example_server) -> None:
    channel, stub = _grpc_stub(example_server)
    with channel:
        raw = _request("simple", "INT32", [HUGE, 0], ("INPUT0", "INPUT1"))
        raw.raw_input_contents.extend([b"", b""])
        typed = _request("simple", "INT32", [HUGE, 0], ("INPUT0", "INPUT1"))
        strings = _request("identity_bytes", "BYTES", [0, HUGE], ("INPUT",))
        strings.raw_input_contents.append(b"")
        for request in (raw, typed, strings):
            code, details = _infer_status(stub, request)
            assert code is grpc.StatusCode.INVALID_ARGUMENT, details
            assert "is too large" in details and "of input 'INPUT" in details
        # 65 dimensions with raw contents (was INTERNAL "maximum supported dimension")
        many = _request("simple", "INT32", [1] * 65, ("INPUT0", "INPUT1"))
        many.raw_input_contents.extend([struct.pack("<i", 1)] * 2)
        code, details = _infer_status(stub, many)
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert details == "invalid shape for input 'INPUT0': 65 dimensions exceed the maximum of 64"


SHORT_STRINGS = (struct.pack("<I", 2) + b"ab") * 3  # three strings, 18 bytes
SHORT_STRINGS_ERROR = (
    "incomplete string length indicator for inference input 'INPUT', "
    "expecting 4 bytes but only 0 bytes available"
)


def test_a_bytes_shape_far_beyond_its_data_is_refused_at_once(example_server) -> None:
    """Shape [2**31 - 1] over 18 bytes of strings (found by the nightly gRPC fuzzer): the
    server built a 16 GiB object array before reading the data, which took a minute or failed
    with INTERNAL. Now the data is read first. (HTTP refuses the shape before that, with 413:
    what it claims is over --http-max-input-size.)"""
    channel, stub = _grpc_stub(example_server)
    with channel:
        request = _request("identity_bytes", "BYTES", [2**31 - 1], ("INPUT",))
        request.raw_input_contents.append(SHORT_STRINGS)
        code, details = _infer_status(stub, request)
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert details == SHORT_STRINGS_ERROR
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT",
                    "shape": [2**31 - 1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(SHORT_STRINGS)},
                }
            ]
        }
    )
    reply = _post(example_server, "identity_bytes", header.encode() + SHORT_STRINGS, len(header))
    assert reply.status_code == 413
    assert "exceeds the maximum allowed input size" in reply.json()["error"]


def test_an_empty_unknown_trace_setting_is_an_invalid_argument(example_server) -> None:
    with grpcclient.InferenceServerClient(example_server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as error:
            client.update_trace_settings(settings={"log_file": None})  # was INTERNAL KeyError
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert error.value.message() == "unknown trace setting 'log_file'"
        assert client.get_trace_settings().settings["trace_level"].value == ["OFF"]


def test_undecodable_grpc_messages_are_invalid_arguments(example_server) -> None:
    """grpcio answers a failing deserializer with UNKNOWN; ours never fails, and the handler
    refuses what did not parse."""
    channel, stub = _grpc_stub(example_server)
    with channel:
        for method in (
            "/inference.GRPCInferenceService/ModelInfer",
            "/inference.GRPCInferenceService/ServerLive",
            "/grpc.health.v1.Health/Check",
        ):
            call = channel.unary_unary(
                method,
                request_serializer=lambda data: data,
                response_deserializer=lambda data: data,
            )
            with pytest.raises(grpc.RpcError) as error:
                call(GARBAGE, timeout=30)
            assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT, method
            assert error.value.details().startswith("malformed request message: Error parsing")

        # in a stream, a malformed message is one failed request; the stream goes on
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda data: data,
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        valid = pb.ModelInferRequest(model_name="simple", id="ok")
        for name in ("INPUT0", "INPUT1"):
            valid.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            valid.raw_input_contents.append(struct.pack("<16i", *range(16)))
        answers = list(stream(iter([GARBAGE, valid.SerializeToString()]), timeout=30))
        errors = [a.error_message for a in answers if a.error_message]
        assert len(answers) == 2
        assert len(errors) == 1 and errors[0].startswith("malformed request message")
        assert [a.infer_response.id for a in answers if not a.error_message] == ["ok"]
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=30).live


# ----- bytes the HTTP parser cannot read (issue "A new user's first hour", item 5) --------------


def _raw_exchange(port: int, data: bytes) -> tuple[bytes, bool]:
    """What the server answers to `data` on a fresh connection, and whether it then closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            return answer, False  # still open ten seconds after the answer
        return answer, True


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"GARBAGE\r\n\r\n", "Invalid method encountered"),
        (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n", "header"),
        (b"GET /v2/health/live HTTP/9.9\r\n\r\n", "Invalid HTTP version"),
    ],
    ids=["garbage", "bad-header-line", "bad-version"],
)
@pytest.mark.parametrize("listener", ["http", "metrics"])
def test_malformed_http_is_a_json_400_and_the_connection_closes(
    example_server, data: bytes, reason: str, listener: str
) -> None:
    port = example_server.http_port if listener == "http" else example_server.metrics_port
    answer, closed = _raw_exchange(port, data)
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert lines[0] == "HTTP/1.1 400 Bad Request", answer
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert error.startswith("malformed HTTP request: ") and reason in error, error
    assert closed, "the connection stayed open after the 400"
    assert httpx.get(f"{example_server.base}/v2/health/live", timeout=10).status_code == 200


@pytest.mark.parametrize(
    "data, status, what",
    [
        (
            b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n",
            "431 Request Header Fields Too Large",
            "headers",
        ),
        (
            b"GET /v2/health/live HTTP/1.1\r\n" + b"X-Many: 0123456789abcdef\r\n" * 5_000 + b"\r\n",
            "431 Request Header Fields Too Large",
            "headers",
        ),
        # headers that never end: refused once the bound is passed, not at their end
        (
            b"GET /v2/health/live HTTP/1.1\r\nX-Big: " + b"a" * 100_000,
            "431 Request Header Fields Too Large",
            "headers",
        ),
        (
            b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            "414 Request-URI Too Long",
            "URL",
        ),
    ],
    ids=["one-huge-header", "many-headers", "unfinished-huge-header", "over-long-request-line"],
)
def test_heads_over_the_bound_are_refused_in_json_and_the_connection_closes(
    example_server, data: bytes, status: str, what: str
) -> None:
    """A 200 KB header used to be accepted (uvicorn's httptools protocol has no header bound)."""
    answer, closed = _raw_exchange(example_server.http_port, data)
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert lines[0] == f"HTTP/1.1 {status}", answer[:200]
    assert headers["content-type"] == "application/json"
    error = f"request {what} passed 65536 bytes (--http-max-header-size)"
    assert json.loads(body) == {"error": error}
    assert closed, "the connection stayed open after the refusal"
    assert httpx.get(f"{example_server.base}/v2/health/live", timeout=10).status_code == 200


def test_headers_just_under_the_bound_are_served(example_server) -> None:
    data = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 60_000 + b"\r\n\r\n"
    answer, _ = _raw_exchange_first(example_server.http_port, data)
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]


def _raw_exchange_first(port: int, data: bytes) -> tuple[bytes, bool]:
    """The first bytes the server answers to `data` (a kept-alive connection stays open)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        return sock.recv(65536), False
