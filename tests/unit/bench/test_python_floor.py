"""bench/studies/python_floor.py: the floor server answers py_add as the real one does, so the
figures it gives are for the same work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from harness.serverproc import free_port, wait_until_ready

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def floor_server() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.studies.python_floor", "serve", "--port", str(port)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        start_new_session=True,
    )
    url = f"127.0.0.1:{port}"
    try:
        assert wait_until_ready(f"http://{url}", process, 30), "did not start"
        yield url
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the server and its worker
        process.wait()


def test_the_floor_server_answers_py_add_with_binary_tensors(floor_server: str) -> None:
    client = httpclient.InferenceServerClient(floor_server)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2.5, dtype=np.float32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "FP32"),
        httpclient.InferInput("INPUT1", [1, 16], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=True)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    for _ in range(3):
        result = client.infer("py_add", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    stats = client.get_inference_statistics("py_add")["model_stats"][0]
    assert stats["inference_count"] == 3 and stats["execution_count"] == 3  # one at a time
    assert client.get_model_config("py_add")["max_batch_size"] == 8
