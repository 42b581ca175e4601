"""A hung NPU (issue 29 item 5) through the whole server: the emulator's hang poison makes an
execution on NPU 1 never finish. Its request answers 503 within about the model's
`execution_timeout_ms`, the device's other instance times out behind it, requests queued
meanwhile fail UNAVAILABLE, the model turns not ready, ascend_npu_execution_timeouts_total
counts it and the log says why; the model on NPU 0 serves throughout, and unloading the hung
model ends its executor (whose exit gives the device memory back).

One server, explicit model control: `npu_hang` (two instances on NPU 1, a 2 s timeout) and
`npu_ok` (NPU 0).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from harness.procutil import children_running, wait_gone
from harness.serverproc import ServerProcess, running_server
from tests.support import om_fixtures as omf

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
EXECUTOR = b"npu.executor.main"
HANG = -3.0  # an input holding this never finishes on the device
TIMEOUT_MS = 2000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("npu_hang")
    repo = root / "models"
    omf.write_model_repository(
        repo,
        "npu_hang",
        gears=(1, 2),
        gpus=(1,),
        count=2,
        dynamic_batching=False,
        poison={"value": HANG, "hang": True},
        extra_config=(
            f'parameters {{ key: "execution_timeout_ms" value {{ string_value: "{TIMEOUT_MS}" }} }}'
        ),
    )
    omf.write_model_repository(repo, "npu_ok", gears=(1, 2), gpus=(0,), dynamic_batching=False)
    env = omf.emulator_env({"PYTHONPATH": str(ROOT)}, config={"device_count": 2})
    args = ["--model-control-mode", "explicit", "--load-model", "npu_hang"]
    args += ["--load-model", "npu_ok", "--exit-timeout-secs", "10"]
    with running_server([repo], args, env=env, log_dir=root) as running:
        yield running


def body(value: float = 1.0) -> dict:
    data = [value, 1.0, 2.0, 3.0]
    return {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": data}]}


def infer(server: ServerProcess, model: str, value: float = 1.0) -> httpx.Response:
    return httpx.post(f"{server.base}/v2/models/{model}/infer", json=body(value), timeout=60)


def status(server: ServerProcess, path: str) -> int:
    return httpx.get(f"{server.base}{path}", timeout=10).status_code


def timeouts(server: ServerProcess, model: str) -> float:
    text = httpx.get(server.metrics_url, timeout=10).text
    pattern = r'^ascend_npu_execution_timeouts_total\{device="1",model="' + model + r'"\} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def executors(server: ServerProcess, model: str) -> list[int]:
    return [
        pid
        for pid in children_running(server.pid, EXECUTOR)
        if f"\0{model}\0".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


@pytest.fixture(scope="module")
def hung(server: ServerProcess) -> dict:
    """The hung request, then four more while the device stays hung: what each answered."""
    assert status(server, "/v2/models/npu_hang/ready") == 200
    assert infer(server, "npu_hang").status_code == 200
    started = time.monotonic()
    first = infer(server, "npu_hang", HANG)
    took = time.monotonic() - started
    # Instance 0 is out; instance 1 takes the next request, which waits behind the hung
    # execution on the device and times out too; the three queued behind it then fail.
    answers: list[httpx.Response] = []
    threads = [
        threading.Thread(target=lambda: answers.append(infer(server, "npu_hang"))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return {"first": first, "took": took, "others": answers}


def test_the_hung_request_answers_503_within_about_the_timeout(hung: dict) -> None:
    first = hung["first"]
    assert first.status_code == 503, first.text
    error = first.json()["error"]
    assert f"did not finish within {TIMEOUT_MS} ms (parameter execution_timeout_ms)" in error
    assert "507046" in error and "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT" in error
    assert hung["took"] < 30  # about the 2 s timeout, never forever


def test_requests_behind_it_fail_unavailable_and_the_model_turns_not_ready(
    server: ServerProcess, hung: dict
) -> None:
    others = hung["others"]
    assert len(others) == 4
    assert [r.status_code for r in others] == [503] * 4, [r.text for r in others]
    errors = [r.json()["error"] for r in others]
    assert sum("did not finish within" in e for e in errors) == 1  # instance 1's own batch
    assert sum("not at ready state" in e for e in errors) == 3  # the queued ones
    assert status(server, "/v2/models/npu_hang/ready") == 400
    assert status(server, "/v2/health/ready") == 400  # strict readiness
    assert status(server, "/v2/health/live") == 200
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert not client.is_model_ready("npu_hang")
        with pytest.raises(InferenceServerException) as failure:
            x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            x.set_data_from_numpy(np.ones((1, 4), np.float32))
            client.infer("npu_hang", [x])
        assert failure.value.status() == "StatusCode.UNAVAILABLE"
        assert client.is_model_ready("npu_ok")
    response = httpx.post(f"{server.base}/v2/repository/index", json={}, timeout=10)
    entries = {entry["name"]: entry for entry in response.json()}
    assert "did not finish within" in entries["npu_hang"].get("reason", ""), entries["npu_hang"]
    assert entries["npu_ok"]["state"] == "READY"


def test_the_other_npu_serves_and_metrics_and_log_say_why(
    server: ServerProcess, hung: dict
) -> None:
    response = infer(server, "npu_ok")
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [3.0, 3.0, 5.0, 7.0]
    assert timeouts(server, "npu_hang") == 2  # both instances on the hung NPU
    log = server.log()
    assert "model 'npu_hang' instance npu_hang_0 on NPU 1 taken out of service" in log
    assert f"did not finish within {TIMEOUT_MS} ms" in log
    assert "has no healthy instance left" in log


def test_unloading_the_hung_model_ends_its_executor(server: ServerProcess, hung: dict) -> None:
    pids = executors(server, "npu_hang")
    assert len(pids) == 2  # one process per instance (executor_instances_per_process: 1)
    response = httpx.post(f"{server.base}/v2/repository/models/npu_hang/unload", timeout=60)
    assert response.status_code == 200, response.text
    # Their exit hands the device memory back to the driver.
    assert all(wait_gone(pid, timeout=30) for pid in pids)
    assert "left to the driver" in server.log()
    assert infer(server, "npu_ok").status_code == 200
