"""The rate limiter against a real server, with tritonclient.

Two Python models (each instance its own worker process) share one resource: a file counter
that every execute raises on entry and lowers on exit (under an flock, across the processes)
shows how many executions overlapped and in what order they ran. With `--rate-limit
execution_count` and one copy of the resource, never more than one runs at once (also with
`--frontend-processes 2`: the models and the one limiter stay in the owner), and the priority-1
model gets about twice the turns of the priority-2 one while both have work; requests waiting
for their turn show in nv_inference_pending_request_count and run as one dynamic batch when it
comes; a model asking for more than `--rate-limit-resource` gives is refused at load (HTTP 400
with Triton's reason) and is not ready. With `--rate-limit off` the same models overlap.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

METERED_MODEL = """
import fcntl
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

METER = %r
NAME = %r
GATE = METER + ".open"  # a request for -1 runs until the test creates this file


def step(delta):
    with open(METER, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        data = json.loads(f.read() or '{"now": 0, "peak": 0, "order": []}')
        data["now"] += delta
        data["peak"] = max(data["peak"], data["now"])
        if delta > 0:
            data["order"].append(NAME)
        f.seek(0)
        f.truncate()
        f.write(json.dumps(data))


class TritonPythonModel:
    def execute(self, requests):
        step(+1)
        try:
            x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
            if x[0] == -1:
                for _ in range(6000):
                    if os.path.exists(GATE):
                        break
                    time.sleep(0.01)
            time.sleep(0.04)
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor(
                    "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)])
                for r in requests
            ]
        finally:
            step(-1)
"""
CONFIG = """
name: "%s"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1
  rate_limiter { resources [ { name: "card_memory" count: %d } ] priority: %d } } ]
"""
REQUESTS = 24  # each model's, all sent at once
BATCHED = """
name: "batched"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1
  rate_limiter { resources [ { name: "card_memory" count: 1 } ] } } ]
dynamic_batching { }
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def model(root: Path, name: str, meter: Path, need: int = 1, priority: int = 1) -> None:
    write(root / name / "config.pbtxt", CONFIG % (name, need, priority))
    write(root / name / "1" / "model.py", METERED_MODEL % (str(meter), name))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rate_repo")
    meter = root.parent / "meter.json"
    model(root, "first", meter, priority=1)
    model(root, "second", meter, priority=2)
    model(root, "big", meter, need=2)
    write(root / "batched" / "config.pbtxt", BATCHED)
    (root / "batched" / "1").mkdir()
    return root


def meter_of(repo: Path) -> Path:
    return repo.parent / "meter.json"


@contextmanager
def started(repo: Path, *flags: str) -> Iterator[ServerProcess]:
    args = ["--model-control-mode=explicit", "--load-model=first", "--load-model=second", *flags]
    with running_server([repo], args) as proc:
        yield proc


def load_all(server: ServerProcess, repo: Path) -> dict:
    """Send REQUESTS to each model at once; return the meter's record of the executions."""
    meter_of(repo).unlink(missing_ok=True)
    client = httpclient.InferenceServerClient(server.http_url, concurrency=2 * REQUESTS)
    try:
        sent = []
        for value in range(REQUESTS):
            for name in ("first", "second"):
                x = httpclient.InferInput("X", [1], "FP32")
                x.set_data_from_numpy(np.array([value], np.float32))
                sent.append((value, client.async_infer(name, [x])))
        for value, pending in sent:
            assert float(pending.get_result(timeout=60).as_numpy("Y")[0]) == value + 1
    finally:
        client.close()
    return json.loads(meter_of(repo).read_text())


def test_one_copy_of_a_shared_resource_runs_one_execution_at_a_time_by_priority(repo: Path):
    with started(repo, "--rate-limit=execution_count") as server:
        record = load_all(server, repo)
        assert record["peak"] == 1  # counted in the models: never two at once
        order = record["order"]
        assert len(order) == 2 * REQUESTS and record["now"] == 0
        # While both have work (the first REQUESTS turns), priority 1 gets about 2 of 3.
        firsts = order[:REQUESTS].count("first")
        assert 2 * REQUESTS // 3 - 4 <= firsts <= 2 * REQUESTS // 3 + 4, order
        client = httpclient.InferenceServerClient(server.http_url)
        stats = {
            s["name"]: s for s in client.get_inference_statistics()["model_stats"] if s["version"]
        }
        for name in ("first", "second"):
            assert stats[name]["inference_stats"]["success"]["count"] == REQUESTS
            assert stats[name]["execution_count"] == order.count(name)
        metrics = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
        assert 'nv_inference_exec_count{model="first",version="1"} 24' in metrics


def test_a_model_asking_more_than_the_flag_gives_is_refused_at_load(repo: Path):
    flags = ("--rate-limit=execution_count", "--rate-limit-resource=card_memory:1")
    with started(repo, *flags) as server:
        answer = httpx.post(f"http://{server.http_url}/v2/repository/models/big/load")
        assert answer.status_code == 400
        reason = (
            'Resource count for "card_memory" is limited to 1 which will prevent scheduling '
            "of one or more model instances, the minimum required count is 2"
        )
        assert reason in answer.json()["error"]
        with pytest.raises(InferenceServerException, match="limited to 1"):
            httpclient.InferenceServerClient(server.http_url).load_model("big")
        with pytest.raises(InferenceServerException, match="limited to 1") as refused:
            grpcclient.InferenceServerClient(server.grpc_url).load_model("big")
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert httpx.get(f"http://{server.http_url}/v2/models/big/ready").status_code != 200
        index = httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
        big = next(entry for entry in index if entry["name"] == "big")
        assert big["state"] == "UNAVAILABLE" and reason in big["reason"]
        # The models within the limit loaded and serve.
        assert httpx.get(f"http://{server.http_url}/v2/models/first/ready").status_code == 200
        config = httpclient.InferenceServerClient(server.http_url).get_model_config("first")
        assert config["instance_group"][0]["rate_limiter"] == {
            "resources": [{"name": "card_memory", "global": False, "count": 1}],
            "priority": 1,
        }


def test_with_the_rate_limiter_off_the_same_models_overlap(repo: Path):
    with started(repo) as server:
        record = load_all(server, repo)
        assert record["peak"] == 2


def test_frontend_processes_share_the_owners_one_limiter(repo: Path):
    flags = ("--rate-limit=execution_count", "--frontend-processes=2")
    with started(repo, *flags) as server:
        record = load_all(server, repo)
        assert record["peak"] == 1 and len(record["order"]) == 2 * REQUESTS


def wait_for(predicate, what: str) -> None:
    for _ in range(3000):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"never saw {what}")


def test_requests_waiting_for_their_turn_are_pending_and_form_one_batch(repo: Path):
    meter = meter_of(repo)
    gate = Path(str(meter) + ".open")
    meter.unlink(missing_ok=True)
    gate.unlink(missing_ok=True)
    with started(repo, "--rate-limit=execution_count") as server:
        client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
        try:
            client.load_model("batched")
            x = httpclient.InferInput("X", [1], "FP32")
            x.set_data_from_numpy(np.array([-1], np.float32))
            holder = client.async_infer("first", [x])  # holds card_memory until the gate opens
            wait_for(lambda: meter.exists() and json.loads(meter.read_text())["now"] == 1, "it run")
            sent = []
            for value in range(6):
                y = httpclient.InferInput("INPUT0", [1, 1], "FP32")
                y.set_data_from_numpy(np.array([[value]], np.float32))
                sent.append(client.async_infer("batched", [y]))
            metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"
            pending = 'nv_inference_pending_request_count{model="batched",version="1"} 6'
            wait_for(lambda: pending in httpx.get(metrics).text, "6 pending")
            assert (
                client.get_inference_statistics("batched")["model_stats"][0]["execution_count"] == 0
            )
            gate.touch()
            assert float(holder.get_result(timeout=60).as_numpy("Y")[0]) == 0
            for value, answer in enumerate(sent):
                assert answer.get_result(timeout=60).as_numpy("OUTPUT0")[0, 0] == value
            stats = client.get_inference_statistics("batched")["model_stats"][0]
            assert stats["execution_count"] == 1 and stats["inference_count"] == 6
            assert [b["batch_size"] for b in stats["batch_stats"]] == [6]
        finally:
            client.close()
            gate.unlink(missing_ok=True)
