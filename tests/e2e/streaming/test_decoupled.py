"""Decoupled Python models against a real server: tritonclient gRPC streaming (sync and
asyncio), the refusals of unary infer, response-sender misuse, cancellation, custom metrics,
and perf_analyzer --streaming.

Models: the example `token_stream` (examples/streaming.py) and the test models in
tests/support/streamingmodels.py.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness.procutil import wait_for
from harness.serverproc import ServerProcess, running_server
from tests.support import tools
from tests.support.streamingmodels import build_streaming_repository

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = build_streaming_repository(tmp_path_factory.mktemp("streaming"))
    with running_server([repo], log_dir=tmp_path_factory.mktemp("logs")) as process:
        yield process


def _text(value: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value.encode()], dtype=object))
    return tensor


def _count(count: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([count], dtype=np.int32))
    return tensor


def _stream(server: ServerProcess, model: str, inputs: list, **kwargs) -> list:
    """Every (result, error) of one streamed request, to its final response (or `_expect`
    answers)."""
    expect = kwargs.pop("_expect", None)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(lambda result, error: answers.put((result, error)))
    client.async_stream_infer(model, inputs, **kwargs)
    collected = []
    while True:
        result, error = answers.get(timeout=30)
        collected.append((result, error))
        if error is None and result.get_response().parameters["triton_final_response"].bool_param:
            break
        if len(collected) == expect:
            break
    client.stop_stream()
    client.close()
    return collected


def test_tokens_stream_in_order_with_an_empty_final_response(server: ServerProcess) -> None:
    answers = _stream(
        server,
        "token_stream",
        [_text("the quick brown fox")],
        request_id="r1",
        enable_empty_final_response=True,
    )
    assert all(error is None for _, error in answers)
    words = [result.as_numpy("text_output")[0] for result, _ in answers[:-1]]
    assert words == [b"the", b"quick", b"brown", b"fox"]
    assert [int(result.as_numpy("index")[0]) for result, _ in answers[:-1]] == [0, 1, 2, 3]
    finals = [
        result.get_response().parameters["triton_final_response"].bool_param
        for result, _ in answers
    ]
    assert finals == [False, False, False, False, True]
    last = answers[-1][0].get_response()
    assert last.model_version == "" and last.id == "r1" and not last.outputs
    assert all(result.get_response().model_version == "1" for result, _ in answers[:-1])


def test_without_empty_final_response_only_the_tokens_arrive(server: ServerProcess) -> None:
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: answers.put((result, error)))
        client.async_stream_infer("token_stream", [_text("a b c")])
        client.stop_stream()  # waits for the server to end the stream
    got = [answers.get_nowait() for _ in range(answers.qsize())]
    assert [result.as_numpy("text_output")[0] for result, _ in got] == [b"a", b"b", b"c"]
    assert not any(
        result.get_response().parameters["triton_final_response"].bool_param for result, _ in got
    )


def test_asyncio_client_streams_several_requests(server: ServerProcess) -> None:
    async def run() -> dict[str, list]:
        client = grpcaio.InferenceServerClient(server.grpc_url)

        async def requests():
            for index, text in enumerate(("one two", "three four five")):
                yield {
                    "model_name": "token_stream",
                    "inputs": [_text(text)],
                    "request_id": str(index),
                    "enable_empty_final_response": True,
                }

        seen: dict[str, list] = {"0": [], "1": []}
        finals = 0
        async for result, error in client.stream_infer(requests()):
            assert error is None
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
                if finals == 2:
                    break
                continue
            seen[response.id].append(result.as_numpy("text_output")[0])
        await client.close()
        return seen

    seen = asyncio.run(run())
    assert seen == {"0": [b"one", b"two"], "1": [b"three", b"four", b"five"]}


def test_unary_and_http_infer_refuse_decoupled_models(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("token_stream", [_text("x")])
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert caught.value.message() == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy"
    )
    tensor = httpclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"x"], dtype=object))
    with httpclient.InferenceServerClient(server.http_url) as client:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("token_stream", [tensor])
    assert caught.value.status() == "501"
    assert (
        "HTTP end point doesn't support models with decoupled transaction policy"
        in caught.value.message()
    )


def test_per_response_errors_parameters_and_requested_outputs(server: ServerProcess) -> None:
    wanted = [grpcclient.InferRequestedOutput("OUT"), grpcclient.InferRequestedOutput("NAMES")]
    answers = _stream(
        server,
        "chatty",
        [_count(3)],
        outputs=wanted,
        parameters={"error_at": 1},
        enable_empty_final_response=True,
    )
    assert answers[0][1] is None and int(answers[0][0].as_numpy("OUT")[0]) == 0
    assert answers[0][0].as_numpy("NAMES")[0] == b"OUT,NAMES"
    assert answers[0][0].get_response().parameters["index"].int64_param == 0
    assert answers[1][0] is None and "token 1 failed" in answers[1][1].message()
    assert int(answers[2][0].as_numpy("OUT")[0]) == 2
    assert answers[3][0].get_response().parameters["triton_final_response"].bool_param
    only_out = _stream(
        server, "chatty", [_count(1)], outputs=wanted[:1], enable_empty_final_response=True
    )
    response = only_out[0][0].get_response()
    assert [output.name for output in response.outputs] == ["OUT"]
    wait_for(
        lambda: (
            "chatty after final: Unable to send response. Response sender has been "
            "closed." in server.log()
        ),
        "the sender's refusal after FINAL",
        timeout=10,
    )


def test_decoupled_execute_must_return_none(server: ServerProcess) -> None:
    answers = _stream(server, "chatty", [_count(2)], parameters={"return_list": True}, _expect=1)
    assert answers[0][0] is None
    assert (
        "using the decoupled mode and the execute function must return None"
        in answers[0][1].message()
    )


def test_non_decoupled_model_may_answer_through_its_sender_once(server: ServerProcess) -> None:
    tensor = httpclient.InferInput("X", [2], "INT32")
    tensor.set_data_from_numpy(np.array([3, 4], dtype=np.int32))
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer("sender", [tensor])
    assert result.as_numpy("Y").tolist() == [6, 8]
    wait_for(
        lambda: (
            "sender second send: Unable to send response. Non-decoupled model cannot "
            "send more than one response." in server.log()
        ),
        "the second send's refusal",
        timeout=10,
    )


def _metric(server: ServerProcess, prefix: str) -> list[str]:
    text = httpx.get(server.metrics_url, timeout=10).text
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_cancelling_the_stream_reaches_the_model_and_frees_it(server: ServerProcess) -> None:
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(lambda result, error: answers.put((result, error)))
    client.async_stream_infer("chatty", [_count(10_000)], parameters={"delay_ms": 20})
    first, error = answers.get(timeout=30)
    assert error is None and int(first.as_numpy("OUT")[0]) == 0
    client.stop_stream(cancel_requests=True)
    client.close()
    wait_for(
        lambda: "chatty cancelled at" in server.log(), "the model to see the cancel", timeout=15
    )
    # Nothing is left pending, and the model serves the next request at once.
    wait_for(
        lambda: (
            _metric(server, 'nv_inference_pending_request_count{model="chatty"')
            == ['nv_inference_pending_request_count{model="chatty",version="1"} 0']
        ),
        "no pending request",
        timeout=10,
    )
    answers_after = _stream(server, "chatty", [_count(2)], enable_empty_final_response=True)
    assert len(answers_after) == 3


def test_a_worker_that_dies_mid_stream_ends_the_stream_with_an_error(server: ServerProcess) -> None:
    pid = int(re.findall(r"chatty worker pid (\d+)", server.log())[-1])
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(lambda result, error: answers.put((result, error)))
        client.async_stream_infer("chatty", [_count(10_000)], parameters={"delay_ms": 20})
        assert answers.get(timeout=30)[1] is None
        os.kill(pid, signal.SIGKILL)
        while True:
            result, error = answers.get(timeout=30)
            if error is not None:
                break
        client.stop_stream()
    assert (
        "the worker process was killed by SIGKILL while this request was running" in error.message()
    )
    wait_for(
        lambda: len(re.findall(r"chatty worker pid", server.log())) >= 2, "the worker to restart"
    )
    assert len(_stream(server, "chatty", [_count(1)], enable_empty_final_response=True)) == 2


def test_custom_metrics_reach_the_metrics_endpoint(server: ServerProcess) -> None:
    _stream(server, "chatty", [_count(4)], enable_empty_final_response=True)
    lines = _metric(server, "chatty_tokens_total")
    assert len(lines) == 1 and lines[0].startswith('chatty_tokens_total{model="chatty"}')
    assert float(lines[0].split()[-1]) >= 4
    assert "# TYPE chatty_tokens_total counter" in httpx.get(server.metrics_url).text


def test_statistics_count_decoupled_requests(server: ServerProcess) -> None:
    before = httpx.get(f"{server.base}/v2/models/token_stream/stats").json()
    _stream(server, "token_stream", [_text("x y")], enable_empty_final_response=True)
    after = httpx.get(f"{server.base}/v2/models/token_stream/stats").json()

    def count(stats: dict) -> int:
        return stats["model_stats"][0]["inference_stats"]["success"]["count"]

    assert count(after) == count(before) + 1


@tools.needs_perf_analyzer
def test_perf_analyzer_streams_a_decoupled_model(server: ServerProcess, tmp_path: Path) -> None:
    data = tmp_path / "input.json"
    data.write_text('{"data": [{"text_input": ["one two three"]}]}')
    command = [
        tools.perf_analyzer(),
        "-m",
        "token_stream",
        "-i",
        "grpc",
        "--streaming",
        "-u",
        server.grpc_url,
        "--input-data",
        str(data),
        "--concurrency-range",
        "1:2",
        "--measurement-interval",
        "500",
        "--max-trials",
        "4",
        "--stability-percentage",
        "1000",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Throughput:" in output, output
