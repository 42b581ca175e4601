"""Ensemble back-pressure (`ensemble_scheduling.max_inflight_requests`) against a real server.

Two ensembles run the same two Python steps: `fan_out` makes a 4 MiB tensor from a number at
once, `gated_sum` sums it but only once the test opens its gate (a file). `limited` has
max_inflight_requests 3, `unlimited` has none. A flood of 24 concurrent requests to `limited`
must leave at most 3 requests inside it (fan_out's executions minus gated_sum's, in the
models' statistics, and the `ascend_ensemble_inflight` gauge), the other 21 waiting to enter
(nv_inference_pending_request_count), and the server's RSS barely moved; the same flood to
`unlimited` runs fan_out 24 times and holds ~96 MiB of its outputs. Every request of both
floods answers the right sum once the gate opens. A negative limit does not load, and says
why.
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

ELEMENTS = 1 << 20  # fan_out's output: 4 MiB of FP32
FLOOD = 24
LIMIT = 3
MIB = 1 << 20

FAN_OUT_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seed = pb_utils.get_input_tensor_by_name(request, "SEED").as_numpy()
            big = np.full(%d, seed[0], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("BIG", big)]))
        return responses
"""

GATED_SUM_MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

GATE = %r


class TritonPythonModel:
    def execute(self, requests):
        deadline = time.monotonic() + 150  # never hang a broken test for ever
        while not os.path.exists(GATE) and time.monotonic() < deadline:
            time.sleep(0.01)
        responses = []
        for request in requests:
            big = pb_utils.get_input_tensor_by_name(request, "BIG").as_numpy()
            total = np.array([big.sum(dtype=np.float64)])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", total)]))
        return responses
"""

FAN_OUT_CONFIG = """
name: "fan_out"
backend: "python"
max_batch_size: 0
input [ { name: "SEED" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "BIG" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

GATED_SUM_CONFIG = """
name: "gated_sum"
backend: "python"
max_batch_size: 0
input [ { name: "BIG" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_FP64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

ENSEMBLE = """
name: "%s"
platform: "ensemble"
max_batch_size: 0
input [ { name: "SEED" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_FP64 dims: [ 1 ] } ]
ensemble_scheduling {
  %s
  step [
    { model_name: "fan_out" input_map { key: "SEED" value: "SEED" }
      output_map { key: "BIG" value: "big" } },
    { model_name: "gated_sum" input_map { key: "BIG" value: "big" }
      output_map { key: "TOTAL" value: "TOTAL" } }
  ]
}
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate") / "open"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, gate: Path) -> Path:
    root = tmp_path_factory.mktemp("backpressure")
    write(root / "fan_out" / "1" / "model.py", FAN_OUT_MODEL % ELEMENTS)
    write(root / "fan_out" / "config.pbtxt", FAN_OUT_CONFIG)
    write(root / "gated_sum" / "1" / "model.py", GATED_SUM_MODEL % str(gate))
    write(root / "gated_sum" / "config.pbtxt", GATED_SUM_CONFIG)
    for name, field in (("limited", f"max_inflight_requests: {LIMIT}"), ("unlimited", "")):
        write(root / name / "config.pbtxt", ENSEMBLE % (name, field))
        (root / name / "1").mkdir()
    write(root / "negative" / "config.pbtxt", ENSEMBLE % ("negative", "max_inflight_requests: -1"))
    (root / "negative" / "1").mkdir()
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(
        [repo],
        ["--exit-timeout-secs", "10", "--model-control-mode", "explicit"]
        + ["--load-model", "limited", "--load-model", "unlimited"],
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as process:
        yield process


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        match = re.search(r"VmRSS:\s+(\d+) kB", status.read())
    assert match, "no VmRSS"
    return int(match.group(1)) * 1024


def successes(client: httpclient.InferenceServerClient, model: str) -> int:
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def gauges(server: ServerProcess, model: str) -> tuple[int, int]:
    """(ascend_ensemble_inflight, nv_inference_pending_request_count) of `model`."""
    text = httpx.get(server.metrics_url).text
    values = []
    for family in ("ascend_ensemble_inflight", "nv_inference_pending_request_count"):
        match = re.search(rf'^{family}{{model="{model}",version="1"}} (\S+)$', text, re.M)
        assert match, f"no {family} for '{model}'"
        values.append(int(float(match.group(1))))
    return values[0], values[1]


def until(predicate: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def infer(
    client: httpclient.InferenceServerClient, model: str, seed: float
) -> httpclient.InferAsyncRequest:
    tensor = httpclient.InferInput("SEED", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seed], dtype=np.float32))
    return client.async_infer(model, [tensor])


def flood(
    server: ServerProcess, gate: Path, model: str, inside: int
) -> tuple[int, list[tuple[int, int]]]:
    """Send FLOOD requests with the gate shut; once `inside` of them ran fan_out, read the
    RSS growth and open the gate. Returns the growth and (fan_out - gated_sum, gauge) seen
    while the requests drained."""
    sender = httpclient.InferenceServerClient(
        server.http_url, concurrency=FLOOD, network_timeout=180.0
    )
    client = httpclient.InferenceServerClient(server.http_url)  # its own connection
    gate.unlink(missing_ok=True)
    fan_out, gated = successes(client, "fan_out"), successes(client, "gated_sum")
    baseline = rss(server.pid)
    requests = [infer(sender, model, float(i + 1)) for i in range(FLOOD)]
    until(lambda: successes(client, "fan_out") - fan_out >= inside, f"{inside} fan_out runs")
    if inside < FLOOD:
        # Give the rest every chance to get in (they must not): they are all in the line.
        until(lambda: gauges(server, model)[1] == FLOOD - inside, "the others waiting")
        time.sleep(0.5)
    growth = rss(server.pid) - baseline
    seen = [(successes(client, "fan_out") - fan_out, gauges(server, model)[0])]
    gate.touch()
    results = []
    for request in requests:
        results.append(request.get_result().as_numpy("TOTAL").tolist())
        between = successes(client, "fan_out") - fan_out - (successes(client, "gated_sum") - gated)
        seen.append((between, gauges(server, model)[0]))
    assert results == [[float(i + 1) * ELEMENTS] for i in range(FLOOD)]
    assert successes(client, "gated_sum") - gated == FLOOD
    assert gauges(server, model) == (0, 0)
    sender.close()
    client.close()
    return growth, seen


def test_a_slow_last_step_holds_the_first_back_and_memory_stays_bounded(
    server: ServerProcess, gate: Path
) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    gate.touch()
    for model in ("limited", "unlimited"):  # start both workers, first allocations done
        assert infer(client, model, 1.0).get_result().as_numpy("TOTAL").tolist() == [ELEMENTS]

    growth, seen = flood(server, gate, "limited", LIMIT)
    assert seen[0] == (LIMIT, LIMIT)  # fan_out ran 3 times with 24 requests sent, no more
    assert all(between <= LIMIT and inflight <= LIMIT for between, inflight in seen), seen
    free_growth, free_seen = flood(server, gate, "unlimited", FLOOD)
    assert free_seen[0] == (FLOOD, FLOOD)  # without a limit all 24 went in at once
    # 24 x 4 MiB held between the steps without the limit; 3 x 4 MiB (and change) with it.
    assert free_growth > 60 * MIB, f"unlimited run grew the RSS by {free_growth / MIB:.0f} MiB"
    assert growth < 40 * MIB, f"limited run grew the RSS by {growth / MIB:.0f} MiB"


def test_a_negative_limit_does_not_load_and_says_why(server: ServerProcess) -> None:
    response = httpx.post(f"{server.base}/v2/repository/models/negative/load")
    assert response.status_code == 400
    error = response.json()["error"]
    assert "max_inflight_requests: -1" in error and "Value out of range: -1" in error, error
    index = httpx.post(f"{server.base}/v2/repository/index").json()
    entry = next(item for item in index if item["name"] == "negative")
    assert entry["state"] == "UNAVAILABLE" and "Value out of range" in entry["reason"]
