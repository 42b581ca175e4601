"""gRPC calls that hold the server (issue 28, items 4 and 7): a ModelStreamInfer client that
never reads its answers, a stream opened without a request, and calls past
--grpc-max-concurrent-streams on a warm channel. What a client sees: memory stays bounded and
the stream's requests wait; an idle stream ends with UNAVAILABLE; calls past the limit wait
and succeed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from examples.build_repository import build_simple
from harness.serverproc import ServerProcess, running_server
from harness.testmodels import build_identity_fp32

pytestmark = pytest.mark.e2e

STREAMS_LIMIT = 10
FIRST_REQUEST_TIMEOUT_MS = 1000
ELEMENTS = 15_000  # 60 KB of FP32 a request, as in the issue


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("flow_models")
    build_simple(repo)
    build_identity_fp32(repo)
    args = [
        "--grpc-max-concurrent-streams",
        str(STREAMS_LIMIT),
        "--grpc-stream-first-request-timeout",
        str(FIRST_REQUEST_TIMEOUT_MS),
    ]
    with running_server([repo], args, log_dir=tmp_path_factory.mktemp("logs")) as process:
        yield process


@pytest.fixture
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(autouse=True)
def still_live(server: ServerProcess) -> Iterator[None]:
    yield
    assert server.alive()
    with grpc.insecure_channel(server.grpc_url) as channel:
        live = service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(
            service_pb2.ServerLiveRequest(), timeout=5
        )
    assert live.live


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def identity_request(index: int, payload: bytes) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="identity_fp32", id=str(index))
    tensor = request.inputs.add(name="INPUT", datatype="FP32")
    tensor.shape.extend([1, ELEMENTS])
    request.raw_input_contents.append(payload)
    return request


@pytest.mark.slow
def test_unread_stream_answers_stay_bounded(server: ServerProcess, stub) -> None:
    """Item 4: 3,000 requests of 60 KB, no answer read. The server stops reading the stream
    (so the client's sends block on HTTP/2 flow control) instead of growing by 800 MB; once the
    client reads, every request is answered, in full."""
    total = 3000
    payload = np.arange(ELEMENTS, dtype=np.float32).tobytes()
    sent = [0]

    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        for index in range(total):
            yield identity_request(index, payload)
            sent[0] += 1

    before = rss_mb(server.pid)
    answers = stub.ModelStreamInfer(requests(), timeout=120)
    peak, last, steady_since = before, -1, time.monotonic()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and time.monotonic() - steady_since < 3:
        time.sleep(0.25)
        peak = max(peak, rss_mb(server.pid))
        if sent[0] != last:
            last, steady_since = sent[0], time.monotonic()
    assert sent[0] < total, "every request was taken although no answer was read"
    assert peak - before < 200, f"server grew {peak - before:.0f} MB on one unread stream"

    ids = set()
    for answer in answers:
        assert not answer.error_message
        assert answer.infer_response.raw_output_contents[0] == payload
        ids.add(answer.infer_response.id)
        if len(ids) == total:
            break
    answers.cancel()
    assert ids == {str(index) for index in range(total)}


def test_stream_without_request_ends(server: ServerProcess, stub) -> None:
    """A stream that sends nothing is ended with UNAVAILABLE after the first-request timeout
    (it would otherwise hold its call and the connection for ever)."""
    hold = threading.Event()

    def nothing() -> Iterator[service_pb2.ModelInferRequest]:
        hold.wait(30)
        return
        yield  # pragma: no cover

    began = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as raised:
            for _ in stub.ModelStreamInfer(nothing(), timeout=30):
                pass
    finally:
        hold.set()
    took = time.monotonic() - began
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no request on this stream within 1 s" in raised.value.details()
    assert 0.5 < took < 10


def test_stream_may_pause_after_its_first_request(server: ServerProcess, stub) -> None:
    """The timeout is for the first request only: a stream may then pause longer than it."""
    payload = np.ones(ELEMENTS, np.float32).tobytes()

    def paced() -> Iterator[service_pb2.ModelInferRequest]:
        yield identity_request(0, payload)
        time.sleep(2 * FIRST_REQUEST_TIMEOUT_MS / 1000)
        yield identity_request(1, payload)

    ids = [answer.infer_response.id for answer in stub.ModelStreamInfer(paced(), timeout=30)]
    assert ids == ["0", "1"]


def test_calls_past_concurrent_streams_limit_wait(server: ServerProcess) -> None:
    """Item 7: 5,000 calls on a warm channel, 300 at a time against a limit of 10 streams:
    every call waits for a stream and succeeds (grpc-core's overload protection used to
    refuse about half with RST_STREAM REFUSED_STREAM, UNAVAILABLE)."""
    total, concurrency = 5000, 300
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    slots = threading.Semaphore(concurrency)
    lock = threading.Lock()
    errors: list[str] = []
    done = threading.Event()
    finished = [0]

    def callback(result, error) -> None:
        with lock:
            if error is not None:
                errors.append(str(error))
            else:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
            finished[0] += 1
            if finished[0] == total:
                done.set()
        slots.release()

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.infer("simple", inputs)  # warm: the server's SETTINGS are known
        for _ in range(total):
            slots.acquire()
            client.async_infer("simple", inputs, callback)
        assert done.wait(120), f"{finished[0]} of {total} calls finished"
    assert not errors, f"{len(errors)} of {total} failed, e.g. {errors[0]}"
