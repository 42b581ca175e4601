"""Ensembles against a real server subprocess, with tritonclient over HTTP and gRPC.

The example `pipeline` (Python preprocess -> ONNX classifier -> Python postprocess) must give
the same answer as running its pieces by hand, with one request; every step goes through its
own model's scheduler, so each member's statistics count it. Two slow (0.6 s) Python steps that do
not depend on each other must overlap, and a failing step must fail the request and be named.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_repository import CLASSIFIER_LABELS, build_classifier
from examples.pipeline import build_pipeline, preprocess_reference
from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

SLOW_STEP_MODEL = """
import time

import triton_python_backend_utils as pb_utils

FACTOR = %s


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.6)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * FACTOR)])
            for r in requests]
"""

PICKY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "negative values are not allowed", pb_utils.TritonError.INVALID_ARG)))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
"""

STEP_CONFIG = """
name: "%s"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

PARALLEL_ENSEMBLE = """
name: "parallel"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "DOUBLE" data_type: TYPE_FP32 dims: [ 2 ] },
         { name: "TRIPLE" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling {
  step [
    { model_name: "slow_double" model_version: -1
      input_map { key: "X" value: "IN" } output_map { key: "Y" value: "DOUBLE" } },
    { model_name: "slow_triple" model_version: -1
      input_map { key: "X" value: "IN" } output_map { key: "Y" value: "TRIPLE" } }
  ]
}
"""

CHECKED_ENSEMBLE = """
name: "checked"
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling {
  step [
    { model_name: "slow_double" input_map { key: "X" value: "IN" }
      output_map { key: "Y" value: "doubled" } },
    { model_name: "picky" input_map { key: "X" value: "doubled" }
      output_map { key: "Y" value: "OUT" } }
  ]
}
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ensembles")
    build_classifier(root)
    build_pipeline(root)
    for name, factor in (("slow_double", 2), ("slow_triple", 3)):
        write(root / name / "1" / "model.py", SLOW_STEP_MODEL % factor)
        write(root / name / "config.pbtxt", STEP_CONFIG % name)
    write(root / "picky" / "1" / "model.py", PICKY_MODEL)
    write(root / "picky" / "config.pbtxt", STEP_CONFIG % "picky")
    for name, config in (("parallel", PARALLEL_ENSEMBLE), ("checked", CHECKED_ENSEMBLE)):
        write(root / name / "config.pbtxt", config)
        (root / name / "1").mkdir()
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(
        [repo], ["--exit-timeout-secs", "10"], log_dir=tmp_path_factory.mktemp("logs")
    ) as process:
        yield process


def images(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, 32, 32, 3), dtype=np.uint8)


def expected(repo: Path, batch: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    session = ort.InferenceSession(
        str(repo / "classifier" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    probabilities = session.run(None, {"INPUT": preprocess_reference(batch)})[0]
    top = probabilities.argmax(axis=1)
    labels = [CLASSIFIER_LABELS[i].encode() for i in top]
    return labels, probabilities[np.arange(len(top)), top]


def success_counts(server: ServerProcess, models: list[str]) -> dict[str, int]:
    client = httpclient.InferenceServerClient(server.http_url)
    counts = {}
    for model in models:
        stats = client.get_inference_statistics(model)["model_stats"][0]
        counts[model] = int(stats["inference_stats"]["success"]["count"])
    return counts


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_pipeline_composes_preprocess_classifier_postprocess(
    server: ServerProcess, repo: Path, protocol: str
) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = (
        httpclient.InferenceServerClient(server.http_url)
        if protocol == "http"
        else grpcclient.InferenceServerClient(server.grpc_url)
    )
    members = ["pipeline", "preprocess", "classifier", "postprocess"]
    before = success_counts(server, members)
    batch = images(3, seed=1 if protocol == "http" else 2)
    image = module.InferInput("IMAGE", list(batch.shape), "UINT8")
    image.set_data_from_numpy(batch)
    result = client.infer("pipeline", [image])
    labels, scores = expected(repo, batch)
    assert result.as_numpy("LABEL").shape == (3, 1)
    assert [row[0] for row in result.as_numpy("LABEL")] == labels
    assert np.allclose(result.as_numpy("SCORE")[:, 0], scores, atol=1e-5)
    after = success_counts(server, members)
    assert {m: after[m] - before[m] for m in members} == {m: 1 for m in members}


def test_statistics_and_metrics_count_every_step(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    for seed in range(4):
        image = httpclient.InferInput("IMAGE", [1, 32, 32, 3], "UINT8")
        image.set_data_from_numpy(images(1, seed))
        client.infer("pipeline", [image])
    metrics = httpx.get(server.metrics_url).text
    counts = {}
    for model in ("pipeline", "preprocess", "classifier", "postprocess"):
        match = re.search(
            rf'nv_inference_request_success{{model="{model}",version="1"}} (\d+)', metrics
        )
        assert match, f"no success counter for '{model}'"
        counts[model] = int(match.group(1))
    assert len(set(counts.values())) == 1 and counts["pipeline"] >= 4
    stats = client.get_inference_statistics("pipeline")["model_stats"][0]
    assert int(stats["inference_count"]) >= 4
    assert int(stats["inference_stats"]["fail"]["count"]) == 0


def test_independent_steps_run_concurrently(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    data = np.array([[1.0, 2.0]], dtype=np.float32)
    tensor = httpclient.InferInput("IN", [1, 2], "FP32")
    tensor.set_data_from_numpy(data)
    client.infer("parallel", [tensor])  # warm both workers
    started = time.monotonic()
    result = client.infer("parallel", [tensor])
    elapsed = time.monotonic() - started
    assert np.array_equal(result.as_numpy("DOUBLE"), data * 2)
    assert np.array_equal(result.as_numpy("TRIPLE"), data * 3)
    assert elapsed < 1.1, f"two 0.6 s steps took {elapsed:.2f} s: they did not overlap"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_failing_step_fails_the_request_and_is_named(
    server: ServerProcess, protocol: str
) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = (
        httpclient.InferenceServerClient(server.http_url)
        if protocol == "http"
        else grpcclient.InferenceServerClient(server.grpc_url)
    )
    tensor = module.InferInput("IN", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0, -1.0]], dtype=np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("checked", [tensor])
    assert caught.value.message() == (
        "in ensemble 'checked', step 1 (model 'picky'): negative values are not allowed"
    )
    assert caught.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    tensor.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
    assert np.array_equal(client.infer("checked", [tensor]).as_numpy("OUT"), [[2.0, 4.0]])


def test_ensemble_metadata_and_config(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    metadata = client.get_model_metadata("pipeline")
    assert metadata["platform"] == "ensemble"
    assert [t["name"] for t in metadata["inputs"]] == ["IMAGE"]
    assert [t["name"] for t in metadata["outputs"]] == ["LABEL", "SCORE"]
    config = client.get_model_config("pipeline")
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["preprocess", "classifier", "postprocess"]
    assert client.is_model_ready("pipeline")


def test_sigterm_lets_an_in_flight_ensemble_finish_its_later_steps(
    repo: Path, tmp_path: Path
) -> None:
    import signal
    import threading

    with running_server([repo], ["--exit-timeout-secs", "10"], log_dir=tmp_path) as process:
        client = httpclient.InferenceServerClient(process.http_url, network_timeout=30.0)
        tensor = httpclient.InferInput("IN", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.array([[1.0, 2.0]], dtype=np.float32))
        outcome: dict[str, object] = {}

        def call() -> None:
            try:
                outcome["out"] = client.infer("checked", [tensor]).as_numpy("OUT")
            except InferenceServerException as exc:
                outcome["out"] = exc

        thread = threading.Thread(target=call)
        thread.start()
        time.sleep(0.2)  # step 0 runs; step 1 starts only after shutdown has begun
        process.process.send_signal(signal.SIGTERM)
        thread.join(20)
        assert process.process.wait(20) == 0
    out = outcome["out"]
    assert isinstance(out, np.ndarray), out
    assert out.tolist() == [[2.0, 4.0]]
