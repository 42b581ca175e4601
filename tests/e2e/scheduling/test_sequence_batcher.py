"""Stateful models with tritonclient: sequences over HTTP, gRPC and gRPC streaming.

The accumulator models (examples/sequences.py) answer the running sum of each sequence, so
every response of every interleaved sequence has one right value; the Python model also says
which correlation ID (and of which Python type) it saw, and what CORRID input the batcher fed it.
"""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.sequences import build_accumulator_onnx, build_sequences, write_accumulator
from harness.serverproc import ServerProcess, running_server
from tests.support import tools

pytestmark = pytest.mark.e2e

START_ERROR = (
    "inference request for sequence {} to model '{}' must specify the START flag on "
    "the first request of the sequence"
)


PY_STATE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "ACC_IN").as_numpy()
            total = (state + value).astype(np.int32)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("ACC_OUT", total)]))
        return responses
"""
PY_STATE_CONFIG = """
name: "accumulator_py_state"
backend: "python"
max_batch_size: 4
sequence_batching {
  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
  oldest { max_candidate_sequences: 4 }
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sequences")
    build_sequences(repo)
    write_accumulator(
        repo,
        "accumulator_strid",
        corrid_type="TYPE_STRING",
        strategy="oldest { max_candidate_sequences: 8 }",
    )
    write_accumulator(repo, "accumulator_idle", idle_us=300_000)
    build_accumulator_onnx(repo, "accumulator_onnx_idle", idle_us=300_000)
    (repo / "accumulator_py_state" / "1").mkdir(parents=True)
    (repo / "accumulator_py_state" / "1" / "model.py").write_text(PY_STATE_MODEL)
    (repo / "accumulator_py_state" / "config.pbtxt").write_text(PY_STATE_CONFIG)
    with running_server([repo], log_dir=tmp_path_factory.mktemp("logs")) as process:
        yield process


def _input(module, value: int):
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return tensor


def _run_sequence(client, module, model: str, corrid, values: list[int]) -> list[tuple]:
    """Send one sequence; return (OUTPUT, SEQUENCE or None) of each response."""
    answers = []
    for step, value in enumerate(values):
        result = client.infer(
            model,
            [_input(module, value)],
            sequence_id=corrid,
            sequence_start=step == 0,
            sequence_end=step == len(values) - 1,
        )
        label = result.as_numpy("SEQUENCE")
        answers.append(
            (int(result.as_numpy("OUTPUT")[0][0]), None if label is None else label[0][0].decode())
        )
    return answers


def _metric(server: ServerProcess, name: str, model: str) -> float:
    prefix = f'{name}{{model="{model}",version="1"}} '
    for line in httpx.get(server.metrics_url).text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    raise AssertionError(f"{prefix} not found")


@pytest.mark.parametrize(
    "model, module",
    [
        ("accumulator", httpclient),
        ("accumulator_oldest", httpclient),
        ("accumulator_onnx", httpclient),
        ("accumulator_py_state", httpclient),
        ("accumulator", grpcclient),
        ("accumulator_onnx", grpcclient),
    ],
    ids=[
        "direct-http",
        "oldest-http",
        "onnx-state-http",
        "python-state-http",
        "direct-grpc",
        "onnx-state-grpc",
    ],
)
def test_interleaved_sequences_from_concurrent_clients(
    server: ServerProcess, model: str, module
) -> None:
    """Six clients at once (more sequences than the four slots): every running sum is right."""
    errors: list[BaseException] = []
    seen: dict[int, list[tuple]] = {}
    url = server.http_url if module is httpclient else server.grpc_url

    def client(corrid: int) -> None:
        try:
            connection = module.InferenceServerClient(url)
            values = [corrid * 100 + step for step in range(6)]
            seen[corrid] = (_run_sequence(connection, module, model, corrid, values), values)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(corrid,)) for corrid in range(1, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    for corrid, (answers, values) in seen.items():
        assert [total for total, _ in answers] == list(np.cumsum(values))
        if model in ("accumulator", "accumulator_oldest"):
            assert {label for _, label in answers} == {f"int:{corrid}:{corrid}"}


def test_grpc_string_correlation_ids_reach_the_model(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    first = _run_sequence(client, grpcclient, "accumulator_strid", "conv-a", [1, 2])
    assert first == [(1, "str:conv-a:conv-a"), (3, "str:conv-a:conv-a")]
    # A uint64 ID past int64 (tritonclient's gRPC parameter is int64, so over HTTP) reaches
    # the model and its CORRID input intact.
    big = 2**64 - 5
    http = httpclient.InferenceServerClient(server.http_url)
    assert _run_sequence(http, httpclient, "accumulator", big, [4, 5]) == [
        (4, f"int:{big}:{big}"),
        (9, f"int:{big}:{big}"),
    ]


def test_grpc_stream_interleaved_sequences(server: ServerProcess) -> None:
    """One stream carries five sequences, their requests interleaved; each answer carries the
    running sum of its own sequence."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        sequences = {
            corrid: [corrid, 2 * corrid, 3 * corrid, 4 * corrid] for corrid in range(11, 16)
        }
        for step in range(4):
            for corrid, values in sequences.items():
                for model in ("accumulator", "accumulator_onnx"):
                    client.async_stream_infer(
                        model,
                        [_input(grpcclient, values[step])],
                        request_id=f"{model}/{corrid}/{step}",
                        sequence_id=corrid,
                        sequence_start=step == 0,
                        sequence_end=step == 3,
                    )
        got: dict[str, int] = {}
        for _ in range(4 * 5 * 2):
            result, error = answers.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            got[response.id] = int(result.as_numpy("OUTPUT")[0][0])
    finally:
        client.stop_stream()
    for corrid, values in sequences.items():
        for model in ("accumulator", "accumulator_onnx"):
            assert [got[f"{model}/{corrid}/{step}"] for step in range(4)] == list(np.cumsum(values))


def test_missing_correlation_id_and_start_are_refused(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}
    url = f"{server.base}/v2/models/accumulator/infer"
    answer = httpx.post(url, json=body)
    assert answer.status_code == 400
    assert answer.json() == {
        "error": "inference request to model 'accumulator' must specify "
        "a non-zero or non-empty correlation ID"
    }
    answer = httpx.post(
        url, json={**body, "parameters": {"sequence_id": 999, "sequence_end": True}}
    )
    assert answer.status_code == 400
    assert answer.json() == {"error": START_ERROR.format(999, "accumulator")}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as error:
        client.infer("accumulator_strid", [_input(grpcclient, 1)], sequence_id="never-started")
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert START_ERROR.format("never-started", "accumulator_strid") in error.value.message()
    # A string ID for a model whose CORRID input is an integer type cannot be fed to it.
    with pytest.raises(InferenceServerException) as error:
        client.infer(
            "accumulator", [_input(grpcclient, 1)], sequence_id="text", sequence_start=True
        )
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert (
        "has the string correlation ID 'text', but its control input 'CORRID' takes "
        "UINT64 correlation IDs" in error.value.message()
    )
    # An ended sequence is unknown again.
    _run_sequence(client, grpcclient, "accumulator", 31, [1, 1])
    with pytest.raises(InferenceServerException) as error:
        client.infer("accumulator", [_input(grpcclient, 1)], sequence_id=31)
    assert START_ERROR.format(31, "accumulator") in error.value.message()


def test_stream_error_comes_back_in_the_stream(server: ServerProcess) -> None:
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("accumulator", [_input(grpcclient, 1)], sequence_id=4242)
        _, error = answers.get(timeout=30)
        assert START_ERROR.format(4242, "accumulator") in str(error)
        client.async_stream_infer(
            "accumulator",
            [_input(grpcclient, 2)],
            sequence_id=4242,
            sequence_start=True,
            sequence_end=True,
        )
        result, error = answers.get(timeout=30)
        assert error is None and int(result.as_numpy("OUTPUT")[0][0]) == 2
    finally:
        client.stop_stream()


@pytest.mark.parametrize("model", ["accumulator_idle", "accumulator_onnx_idle"])
def test_idle_sequence_is_released(server: ServerProcess, model: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    before = _metric(server, "ascend_sequence_idle_released_total", model)
    client.infer(model, [_input(httpclient, 3)], sequence_id=77, sequence_start=True)
    assert _metric(server, "ascend_sequence_active", model) == 1
    deadline = time.monotonic() + 30
    while _metric(server, "ascend_sequence_idle_released_total", model) == before:
        assert time.monotonic() < deadline, "the idle sequence was never released"
        time.sleep(0.1)
    assert _metric(server, "ascend_sequence_active", model) == 0
    with pytest.raises(InferenceServerException) as error:
        client.infer(model, [_input(httpclient, 1)], sequence_id=77)
    assert error.value.status() == "400"
    assert error.value.message() == START_ERROR.format(77, model)
    # A new START begins from zero: the released state is gone.
    result = client.infer(
        model, [_input(httpclient, 5)], sequence_id=77, sequence_start=True, sequence_end=True
    )
    assert int(result.as_numpy("OUTPUT")[0][0]) == 5


def test_statistics_count_requests_not_padding(server: ServerProcess) -> None:
    """Two sequences, then one alone: its batch of two carries a not-ready padding row, which
    the batch statistics count and inference_count does not."""
    client = httpclient.InferenceServerClient(server.http_url)
    model = "accumulator_onnx"
    stats = client.get_inference_statistics(model)["model_stats"][0]
    count, metric = stats["inference_count"], _metric(server, "nv_inference_count", model)
    _run_sequence(client, httpclient, model, 501, [1])
    _run_sequence(client, httpclient, model, 502, [1, 1])
    after = client.get_inference_statistics(model)["model_stats"][0]
    assert after["inference_count"] == count + 3
    assert _metric(server, "nv_inference_count", model) == metric + 3
    assert (
        after["inference_stats"]["success"]["count"]
        == stats["inference_stats"]["success"]["count"] + 3
    )


def test_server_metadata_advertises_sequences(server: ServerProcess) -> None:
    extensions = httpx.get(f"{server.base}/v2").json()["extensions"]
    assert "sequence" in extensions and "sequence(string_id)" in extensions
    config = httpx.get(f"{server.base}/v2/models/accumulator_oldest/config").json()
    assert config["sequence_batching"]["max_sequence_idle_microseconds"] == 5_000_000
    assert config["sequence_batching"]["oldest"]["preferred_batch_size"] == [2, 4]


@tools.needs_perf_analyzer
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_sequence_mode(server: ServerProcess, protocol: str) -> None:
    url = server.http_url if protocol == "http" else server.grpc_url
    command = [
        tools.perf_analyzer(),
        "-m",
        "accumulator_onnx",
        "-i",
        protocol,
        "-u",
        url,
        "--sequence-length",
        "5",
        "--num-of-sequences",
        "4",
        "--concurrency-range",
        "2",
        "--measurement-interval",
        "500",
        "--max-trials",
        "4",
        "--stability-percentage",
        "1000",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    output = run.stdout + run.stderr
    assert "Throughput:" in output and "infer/sec" in output, output
    # perf_analyzer's own end-of-run race, not the server's: in its default (async) sequence
    # mode, ConcurrencyWorker::HandleExitConditions calls CompleteOngoingSequences, which sends
    # each context's END request *before* WaitForOngoingRequests, while that sequence's previous
    # request is still in flight on another connection. When the END is admitted first, the
    # request left behind continues a sequence that has ended, and the answer is Triton's
    # ("Thread [0] had error: ... must specify the START flag ...", exit status 2; about one run
    # in 80 here). At most one per context is tolerated; any other error fails the test.
    race = re.compile(
        r"sequence \d+ to model 'accumulator_onnx' must specify the START flag", re.IGNORECASE
    )
    lines = output.splitlines()
    raced = [line for line in lines if race.search(line)]
    assert len(raced) <= 2, output  # --concurrency-range 2
    assert not [line for line in lines if "error" in line.lower() and line not in raced], output
    # raced, perf_analyzer exits 2, or 0 when the raced request ended its last window's count
    assert run.returncode in ((0, 2) if raced else (0,)), output
