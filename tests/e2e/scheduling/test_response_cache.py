"""The response cache against a real server, over HTTP and gRPC with tritonclient.

`--cache-config local,size=N` on the server and `response_cache { enable: true }` in a model's
config: a repeated request is answered from the cache (the same values, no execution), counted
in the statistics' cache_hit / cache_miss and in Triton's nv_cache_* metrics, while
nv_inference_count and exec_count count executions only. A reloaded copy never answers from
its predecessor's entries; decoupled and sequence models refuse the cache at load; an ensemble
caches its own answer; system shared memory inputs are hashed by content and a hit writes its
outputs into the client's region.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

CACHE_BYTES = 64 * 1024

IDENTITY = """
name: "%s"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
%s
"""
CACHED = "response_cache { enable: true }"

ADDER_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

ADD = %s


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            import json
            offset = float(json.loads(request.parameters() or "{}").get("offset", 0))
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", (x + ADD + offset).astype(np.float32))]))
        return responses
"""
ADDER = """
name: "adder"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
response_cache { enable: true }
"""
DECOUPLED = """
name: "streamer"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
model_transaction_policy { decoupled: true }
response_cache { enable: true }
"""
SEQUENCE = """
name: "stateful"
backend: "identity"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
sequence_batching { }
response_cache { enable: true }
"""
ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling {
  step [ { model_name: "plain" input_map { key: "INPUT0" value: "IN" }
           output_map { key: "OUTPUT0" value: "OUT" } } ]
}
response_cache { enable: true }
"""
ONE_ANSWER_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
ONE_ANSWER = DECOUPLED.replace("streamer", "one_answer").replace(
    "response_cache { enable: true }", ""
)
STREAM_ENSEMBLE = """
name: "ens_stream"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling {
  step [ { model_name: "one_answer" input_map { key: "X" value: "IN" }
           output_map { key: "Y" value: "OUT" } } ]
}
response_cache { enable: true }
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cache_repo")
    write(root / "ident" / "config.pbtxt", IDENTITY % ("ident", CACHED))
    (root / "ident" / "1").mkdir()
    write(root / "plain" / "config.pbtxt", IDENTITY % ("plain", ""))
    (root / "plain" / "1").mkdir()
    write(root / "adder" / "config.pbtxt", ADDER)
    write(root / "adder" / "1" / "model.py", ADDER_MODEL % 1)
    write(root / "streamer" / "config.pbtxt", DECOUPLED)
    write(root / "streamer" / "1" / "model.py", ADDER_MODEL % 1)
    write(root / "stateful" / "config.pbtxt", SEQUENCE)
    (root / "stateful" / "1").mkdir()
    write(root / "ens" / "config.pbtxt", ENSEMBLE)
    write(root / "one_answer" / "config.pbtxt", ONE_ANSWER)
    write(root / "one_answer" / "1" / "model.py", ONE_ANSWER_MODEL)
    write(root / "ens_stream" / "config.pbtxt", STREAM_ENSEMBLE)
    (root / "ens_stream" / "1").mkdir()
    (root / "ens" / "1").mkdir()
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    args = [
        "--model-control-mode=explicit",
        f"--cache-config=local,size={CACHE_BYTES}",
        *(f"--load-model={name}" for name in ("ident", "plain", "adder", "ens")),
    ]
    with running_server([repo], args) as proc:
        yield proc


def http(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


def grpc(server: ServerProcess) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def infer_identity(client, module, values: np.ndarray, model: str = "ident") -> np.ndarray:
    inputs = [module.InferInput("INPUT0", list(values.shape), "FP32")]
    inputs[0].set_data_from_numpy(values)
    return client.infer(model, inputs).as_numpy("OUTPUT0")


def stats(server: ServerProcess, model: str) -> dict:
    """The first version's inference statistics, as tritonclient's HTTP client returns them."""
    answer = http(server).get_inference_statistics(model)
    return answer["model_stats"][0]


def counts(server: ServerProcess, model: str) -> tuple[int, int, int, int, int]:
    """(success, cache hits, cache misses, inference_count, execution_count)."""
    s = stats(server, model)
    inference = s["inference_stats"]
    return (
        inference["success"]["count"],
        inference["cache_hit"]["count"],
        inference["cache_miss"]["count"],
        s["inference_count"],
        s["execution_count"],
    )


def metric(server: ServerProcess, name: str, model: str) -> float:
    text = httpx.get(server.metrics_url).text
    found = re.search(rf'^{name}{{model="{model}",version="1"}} (\S+)$', text, re.M)
    assert found, f"{name} for {model} not in /metrics"
    return float(found.group(1))


def test_a_repeated_request_is_answered_from_the_cache_over_both_protocols(
    server: ServerProcess,
) -> None:
    values = np.arange(6, dtype=np.float32).reshape(1, 6)
    before = counts(server, "ident")
    np.testing.assert_array_equal(infer_identity(http(server), httpclient, values), values)
    np.testing.assert_array_equal(infer_identity(http(server), httpclient, values), values)
    np.testing.assert_array_equal(infer_identity(grpc(server), grpcclient, values), values)
    success, hits, misses, inferences, executions = counts(server, "ident")
    assert success - before[0] == 3
    assert (hits - before[1], misses - before[2]) == (2, 1)
    assert (inferences - before[3], executions - before[4]) == (1, 1)  # hits are not executed
    s = stats(server, "ident")["inference_stats"]
    assert s["cache_hit"]["ns"] > 0 and s["cache_miss"]["ns"] > 0
    # gRPC statistics say the same.
    g = grpc(server).get_inference_statistics("ident", as_json=True)["model_stats"][0]
    assert int(g["inference_stats"]["cache_hit"]["count"]) == hits
    assert int(g["inference_stats"]["cache_miss"]["count"]) == misses
    # Triton's metrics: hits and misses per model; inferences and executions exclude hits.
    assert metric(server, "nv_cache_num_hits_per_model", "ident") == hits
    assert metric(server, "nv_cache_num_misses_per_model", "ident") == misses
    assert metric(server, "nv_cache_hit_duration_per_model", "ident") >= 0
    assert metric(server, "nv_cache_miss_duration_per_model", "ident") > 0
    assert metric(server, "nv_inference_count", "ident") == inferences
    assert metric(server, "nv_inference_exec_count", "ident") == executions
    assert metric(server, "nv_inference_request_success", "ident") == success


def test_other_inputs_shapes_and_model_parameters_are_other_entries(server: ServerProcess) -> None:
    client = http(server)
    base = counts(server, "ident")
    infer_identity(client, httpclient, np.ones((1, 4), np.float32))
    infer_identity(client, httpclient, np.ones((2, 2), np.float32))  # same bytes, other shape
    infer_identity(client, httpclient, np.full((1, 4), 2, np.float32))
    after = counts(server, "ident")
    assert (after[1] - base[1], after[2] - base[2]) == (0, 3)

    def adder(offset: float | None) -> np.ndarray:
        inputs = [httpclient.InferInput("X", [1, 2], "FP32")]
        inputs[0].set_data_from_numpy(np.array([[1, 2]], np.float32))
        parameters = None if offset is None else {"offset": offset}
        return client.infer("adder", inputs, parameters=parameters).as_numpy("Y")

    np.testing.assert_array_equal(adder(None), [[2, 3]])
    np.testing.assert_array_equal(adder(10), [[12, 13]])  # a parameter the model reads
    np.testing.assert_array_equal(adder(10), [[12, 13]])
    _, hits, misses, _, executions = counts(server, "adder")
    assert (hits, misses, executions) == (1, 2, 2)


def test_a_model_without_response_cache_is_never_cached(server: ServerProcess) -> None:
    values = np.full((1, 3), 5, np.float32)
    for _ in range(2):
        infer_identity(http(server), httpclient, values, "plain")
    _, hits, misses, _, executions = counts(server, "plain")
    assert (hits, misses) == (0, 0) and executions >= 2
    assert 'nv_cache_num_hits_per_model{model="plain"' not in httpx.get(server.metrics_url).text


def test_concurrent_identical_requests_all_get_the_answer(server: ServerProcess) -> None:
    values = np.full((1, 16), 3.5, np.float32)
    base = counts(server, "ident")

    def one(_: int) -> np.ndarray:
        return infer_identity(http(server), httpclient, values)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(16)))
    for answer in answers:
        np.testing.assert_array_equal(answer, values)
    after = counts(server, "ident")
    assert (after[1] - base[1]) + (after[2] - base[2]) == 16
    assert after[1] - base[1] >= 1  # at least the later ones hit
    infer_identity(http(server), httpclient, values)
    assert counts(server, "ident")[1] == after[1] + 1


def test_an_answer_larger_than_the_cache_is_not_stored(server: ServerProcess) -> None:
    values = np.ones((1, CACHE_BYTES // 4 + 16), np.float32)  # its answer outgrows the cache
    base = counts(server, "ident")
    for _ in range(2):
        np.testing.assert_array_equal(infer_identity(http(server), httpclient, values), values)
    after = counts(server, "ident")
    assert (after[1] - base[1], after[2] - base[2], after[4] - base[4]) == (0, 2, 2)


def test_least_recently_used_answers_are_evicted(server: ServerProcess) -> None:
    # Each answer takes about a third of the cache: the fourth evicts the oldest.
    size = CACHE_BYTES // 4 // 3 - 128
    rows = [np.full((1, size), float(i), np.float32) for i in range(4)]
    client = http(server)
    for values in rows:
        infer_identity(client, httpclient, values)
    base = counts(server, "ident")
    infer_identity(client, httpclient, rows[3])  # the newest: still there
    infer_identity(client, httpclient, rows[0])  # the oldest: evicted
    after = counts(server, "ident")
    assert (after[1] - base[1], after[2] - base[2]) == (1, 1)


def test_a_reloaded_copy_never_answers_from_the_old_ones_entries(
    server: ServerProcess, repo: Path
) -> None:
    client = http(server)

    def adder() -> np.ndarray:
        inputs = [httpclient.InferInput("X", [1, 2], "FP32")]
        inputs[0].set_data_from_numpy(np.array([[5, 6]], np.float32))
        return client.infer("adder", inputs).as_numpy("Y")

    np.testing.assert_array_equal(adder(), [[6, 7]])
    np.testing.assert_array_equal(adder(), [[6, 7]])  # cached
    write(repo / "adder" / "1" / "model.py", ADDER_MODEL % 100)
    try:
        client.load_model("adder")  # the same version number, a new copy
        np.testing.assert_array_equal(adder(), [[105, 106]])
        _, hits, misses, _, _ = counts(server, "adder")
        assert (hits, misses) == (0, 1)  # the new copy's statistics: a miss, then
        np.testing.assert_array_equal(adder(), [[105, 106]])
        assert counts(server, "adder")[1] == 1
    finally:
        write(repo / "adder" / "1" / "model.py", ADDER_MODEL % 1)
        client.load_model("adder")


def test_unloading_empties_a_models_entries(server: ServerProcess) -> None:
    client = http(server)
    values = np.full((1, 2), 42, np.float32)
    infer_identity(client, httpclient, values)
    infer_identity(client, httpclient, values)
    client.unload_model("ens")  # it runs `plain`, not `ident`: unloads nothing else
    client.unload_model("ident")
    client.load_model("ident")
    client.load_model("ens")
    infer_identity(client, httpclient, values)
    _, hits, misses, _, executions = counts(server, "ident")
    assert (hits, misses, executions) == (0, 1, 1)


@pytest.mark.parametrize(
    ("model", "reason"),
    [("streamer", "'decoupled' transaction policy"), ("stateful", "sequence batching")],
)
def test_decoupled_and_sequence_models_refuse_the_cache_at_load(
    server: ServerProcess, model: str, reason: str
) -> None:
    with pytest.raises(InferenceServerException) as refused:
        http(server).load_model(model)
    assert "response cache does not currently support" in str(refused.value)
    assert reason in str(refused.value)
    with pytest.raises(InferenceServerException, match="does not currently support"):
        grpc(server).load_model(model)


def test_an_ensemble_over_a_decoupled_step_refuses_the_cache(server: ServerProcess) -> None:
    with pytest.raises(InferenceServerException) as refused:
        http(server).load_model("ens_stream")  # loads one_answer (decoupled, uncached) first
    assert "with decoupled step model 'one_answer'; disable response_cache" in str(refused.value)


def test_an_ensemble_caches_its_own_answer(server: ServerProcess) -> None:
    client = grpc(server)
    values = np.full((1, 5), 9, np.float32)

    def ens() -> np.ndarray:
        inputs = [grpcclient.InferInput("IN", [1, 5], "FP32")]
        inputs[0].set_data_from_numpy(values)
        return client.infer("ens", inputs).as_numpy("OUT")

    plain_before = counts(server, "plain")[4]
    np.testing.assert_array_equal(ens(), values)
    np.testing.assert_array_equal(ens(), values)
    _, hits, misses, _, _ = counts(server, "ens")
    assert (hits, misses) >= (1, 1)
    assert counts(server, "plain")[4] == plain_before + 1  # the hit ran no step


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_inputs_are_keyed_by_content_and_hits_fill_output_regions(
    server: ServerProcess, protocol: str
) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = http(server) if protocol == "http" else grpc(server)
    in_key, out_key = f"/cache_in_{protocol}", f"/cache_out_{protocol}"
    in_handle = shm.create_shared_memory_region(in_key[1:], in_key, 64)
    out_handle = shm.create_shared_memory_region(out_key[1:], out_key, 64)
    try:
        client.register_system_shared_memory(f"in_{protocol}", in_key, 64)
        client.register_system_shared_memory(f"out_{protocol}", out_key, 64)

        def run(values: np.ndarray) -> np.ndarray:
            shm.set_shared_memory_region(in_handle, [values])
            shm.set_shared_memory_region(out_handle, [np.zeros_like(values)])
            inputs = [module.InferInput("INPUT0", [1, 4], "FP32")]
            inputs[0].set_shared_memory(f"in_{protocol}", 16)
            outputs = [module.InferRequestedOutput("OUTPUT0")]
            outputs[0].set_shared_memory(f"out_{protocol}", 16)
            client.infer("ident", inputs, outputs=outputs)
            return shm.get_contents_as_numpy(out_handle, np.float32, [1, 4])

        first = np.array([[1, 2, 3, 4]], np.float32) + (10 if protocol == "grpc" else 0)
        base = counts(server, "ident")
        np.testing.assert_array_equal(run(first), first)
        np.testing.assert_array_equal(run(first), first)  # a hit, written into the region
        np.testing.assert_array_equal(run(first * 2), first * 2)  # new content: a miss
        after = counts(server, "ident")
        assert (after[1] - base[1], after[2] - base[2]) == (1, 2)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)


def test_without_cache_config_nothing_is_cached(repo: Path, tmp_path: Path) -> None:
    only = tmp_path / "repo"
    write(only / "ident" / "config.pbtxt", IDENTITY % ("ident", CACHED))
    (only / "ident" / "1").mkdir()
    with running_server([only]) as proc:
        values = np.ones((1, 2), np.float32)
        for _ in range(2):
            infer_identity(http(proc), httpclient, values)
        _, hits, misses, _, executions = counts(proc, "ident")
        assert (hits, misses, executions) == (0, 0, 2)
        assert "nv_cache_num_hits_per_model" not in httpx.get(proc.metrics_url).text
        assert "enables response_cache but the server has no cache" in proc.log()


def test_a_bad_cache_config_stops_the_server_with_a_reason(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "server", "--model-repository", str(tmp_path),
         "--cache-config", "redis,host=localhost"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "only 'local' is available" in done.stderr


def test_hits_through_frontend_processes(tmp_path: Path) -> None:
    """Requests another process decoded reach the model owner's infer path without a task
    per request (infer_nowait): they hit the same cache."""
    only = tmp_path / "repo"
    write(only / "ident" / "config.pbtxt", IDENTITY % ("ident", CACHED))
    (only / "ident" / "1").mkdir()
    args = ["--frontend-processes=3", f"--cache-config=local,size={CACHE_BYTES}"]
    with running_server([only], args) as proc:
        values = np.full((1, 3), 7, np.float32)
        for _ in range(12):  # a new connection each: spread over the processes
            for client, module in ((http(proc), httpclient), (grpc(proc), grpcclient)):
                np.testing.assert_array_equal(infer_identity(client, module, values), values)
        _, hits, misses, _, executions = counts(proc, "ident")
        assert (hits, misses, executions) == (23, 1, 1)


def test_a_json_request_hits_and_gets_the_same_json(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    url = f"{server.base}/v2/models/ident/infer"
    base = counts(server, "ident")
    first = httpx.post(url, json={**body, "id": "a"})
    second = httpx.post(url, json={**body, "id": "b"})
    assert first.status_code == second.status_code == 200
    assert first.json()["outputs"] == second.json()["outputs"]
    assert (first.json()["id"], second.json()["id"]) == ("a", "b")
    assert counts(server, "ident")[1] == base[1] + 1
    bad = httpx.post(url, json={"inputs": [{**body["inputs"][0], "datatype": "INT32"}]})
    assert bad.status_code == 400 and "data-type is 'INT32'" in bad.json()["error"]
