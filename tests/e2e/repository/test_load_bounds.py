"""Issue 28 item 2 through the load API: a `config` override whose numbers would freeze the
loop, exhaust memory or run a load for ever is refused at once with 400 naming the field and
the bound, the index shows the reason, and `/v2/health/live` keeps answering throughout."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from examples.build_repository import build_simple
from examples.streaming import build_streaming
from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

TENSORS = {
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
        {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]},
        {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]},
    ],
}


def _sequence(max_batch_size: int, strategy: dict | None = None) -> dict:
    return {
        "backend": "onnxruntime",
        "max_batch_size": max_batch_size,
        "sequence_batching": strategy or {"direct": {}},
        **TENSORS,
    }


def _warmup(batch_size: int, count: int) -> dict:
    zero = {"data_type": "TYPE_INT32", "dims": [16], "zero_data": True}
    return {
        "backend": "onnxruntime",
        "max_batch_size": 8,
        **TENSORS,
        "model_warmup": [
            {
                "name": "w",
                "batch_size": batch_size,
                "count": count,
                "inputs": {"INPUT0": zero, "INPUT1": zero},
            }
        ],
    }


CASES = [
    ("simple", _sequence(4_000_000), "max_batch_size 4000000"),
    ("simple", _sequence(2**31 - 1), "max_batch_size 2147483647"),
    (
        "simple",
        _sequence(8, {"oldest": {"max_candidate_sequences": 2**31 - 1}}),
        "max_candidate_sequences 2147483647",
    ),
    ("simple", _warmup(2**31 - 1, 1), "batch_size 2147483647"),
    ("simple", _warmup(1, 2**31 - 1), "count 2147483647"),
    (
        "simple",
        {
            "backend": "onnxruntime",
            "max_batch_size": 8,
            **TENSORS,
            "instance_group": [{"kind": "KIND_CPU", "count": 2**31 - 1}],
        },
        "count 2147483647",
    ),
]


class LivePoller(threading.Thread):
    """Polls /v2/health/live on its own connection; keeps the longest wait."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base, self.worst, self.running = base, 0.0, True

    def run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while self.running:
                begun = time.monotonic()
                assert client.get(self.base + "/v2/health/live").status_code == 200
                self.worst = max(self.worst, time.monotonic() - begun)
                time.sleep(0.02)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    repo = tmp_path_factory.mktemp("repo")
    build_simple(repo)
    build_streaming(repo)
    with running_server(
        [repo], ["--model-control-mode", "explicit", "--load-model", "simple"]
    ) as proc:
        yield proc


def _load(server: ServerProcess, name: str, config: dict) -> httpx.Response:
    return httpx.post(
        f"{server.base}/v2/repository/models/{name}/load",
        json={"parameters": {"config": json.dumps(config)}},
        timeout=60,
    )


IDS = [
    "sequence max_batch_size 4e6",
    "sequence max_batch_size 2^31-1",
    "max_candidate_sequences 2^31-1",
    "warm-up batch_size 2^31-1",
    "warm-up count 2^31-1",
    "instance count 2^31-1",
]


@pytest.mark.parametrize("name, config, words", CASES, ids=IDS)
def test_an_over_bound_override_is_refused_at_once_and_live_stays_responsive(
    server: ServerProcess, name: str, config: dict, words: str
) -> None:
    poller = LivePoller(server.base)
    poller.start()
    try:
        begun = time.monotonic()
        reply = _load(server, name, config)
        took = time.monotonic() - begun
    finally:
        poller.running = False
        poller.join(10)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert words in error and "exceeds" in error, error
    assert took < 3.0, f"the refusal took {took:.1f} s"
    assert poller.worst < 2.0, f"live waited {poller.worst:.1f} s"
    index = httpx.post(f"{server.base}/v2/repository/index", timeout=10).json()
    entry = next(e for e in index if e["name"] == name)
    assert words in json.dumps(entry)
    # The copy that served before still serves.
    ready = httpx.get(f"{server.base}/v2/models/{name}/ready", timeout=10)
    assert ready.status_code == 200


def test_a_petabyte_response_ring_is_refused(server: ServerProcess) -> None:
    base = {
        "backend": "python",
        "model_transaction_policy": {"decoupled": True},
        "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
        "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}],
    }
    base["parameters"] = {"response_ring_bytes": {"string_value": "1e15"}}
    begun = time.monotonic()
    reply = _load(server, "token_stream", base)
    assert time.monotonic() - begun < 3.0
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert "response_ring_bytes" in error and "--python-max-response-ring-bytes" in error, error
    live = httpx.get(f"{server.base}/v2/health/live", timeout=5)
    assert live.status_code == 200
