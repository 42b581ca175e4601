"""Many NPUs: instances spread over the devices that `instance_group { gpus }` or the
`device_ids` / `device_id` parameters of Ascend's Triton GE backend configs name, one executor
process per device; a device the machine does not have refuses the model at load by name; and
the default two instances per NPU keep the device busy while batches are copied."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from harness.procutil import children_running
from harness.serverproc import ServerProcess, running_server
from tests.support import om_fixtures as omf

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
EXECUTOR = b"npu.executor.main"


def ge_style_model(repo: Path, name: str, parameters: str, groups: str = "") -> None:
    """A config as Ascend's GE backend samples write it: devices in `parameters`."""
    omf.scale_model(repo / name / "1" / "model.om", gears=(1, 2, 4, 8))
    text = f'name: "{name}"\nbackend: "ascend"\n{groups}\n{parameters}\n'
    (repo / name / "config.pbtxt").write_text(text)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("npu_devices")
    repo = root / "models"
    ge_style_model(
        repo,
        "npu_ids",
        'parameters [{ key: "device_ids", value: { string_value: "0,1" } }]',
        "instance_group [{ count: 1 }]",
    )
    ge_style_model(repo, "npu_id", 'parameters { key: "device_id" value { string_value: "1" } }')
    ge_style_model(
        repo, "npu_bad_ids", 'parameters { key: "device_ids" value { string_value: "0;1" } }'
    )
    omf.write_model_repository(repo, "npu_gpus", gears=(1, 2, 4), gpus=(0, 1))
    omf.write_model_repository(repo, "npu_absent", gears=(1, 2), gpus=(0, 3))
    env = omf.emulator_env({"PYTHONPATH": str(ROOT)}, config={"device_count": 2})
    args = ["--exit-timeout-secs", "10", "--exit-on-error", "false"]
    with running_server([repo], args, env=env, wait_ready=False, log_dir=root) as running:
        yield running


def entries(server: ServerProcess) -> dict[str, dict]:
    response = httpx.post(f"{server.base}/v2/repository/index", json={}, timeout=10)
    assert response.status_code == 200, response.text
    return {entry["name"]: entry for entry in response.json()}


def devices_of(server: ServerProcess, model: str) -> list[int]:
    """The --device of each executor process the server runs for `model`."""
    found = []
    for pid in children_running(server.pid, EXECUTOR):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if model.encode() in args:
            found.append(int(args[args.index(b"--device") + 1]))
    return sorted(found)


def infer(server: ServerProcess, model: str, n: int) -> httpx.Response:
    tensor = {"name": "INPUT0", "shape": [n, 4], "datatype": "FP32", "data": [1] * 4 * n}
    body = {"inputs": [tensor]}
    return httpx.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=30)


@pytest.mark.parametrize(
    "model, devices", [("npu_ids", [0, 1]), ("npu_id", [1]), ("npu_gpus", [0, 1])]
)
def test_instances_run_on_every_named_device(server: ServerProcess, model: str, devices) -> None:
    assert entries(server)[model]["state"] == "READY"
    config = httpx.get(f"{server.base}/v2/models/{model}/config", timeout=10).json()
    assert [g["gpus"] for g in config["instance_group"]] == [devices]
    assert devices_of(server, model) == devices
    for _ in range(4):
        response = infer(server, model, 3)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"][0]["data"] == [3.0] * 12


def test_a_device_that_does_not_exist_refuses_the_model(server: ServerProcess) -> None:
    entry = entries(server)["npu_absent"]
    assert entry["state"] == "UNAVAILABLE"
    assert "NPU 3 does not exist: this process sees NPUs 0-1" in entry["reason"], entry
    assert devices_of(server, "npu_absent") == []  # the device-0 instance was unloaded too
    assert infer(server, "npu_absent", 1).status_code in (400, 404, 503)


def test_an_unreadable_device_ids_refuses_the_model(server: ServerProcess) -> None:
    entry = entries(server)["npu_bad_ids"]
    assert entry["state"] == "UNAVAILABLE"
    assert "parameter device_ids '0;1' is not a comma-separated list of NPU ids" in entry["reason"]


# -- the device never waits for the host ---------------------------------------------------------
# Each batch: 8 rows of 1024 FP32 copied in and out at 8 MB/s (4 ms each way, holding the GIL as
# pyACL's memcpy does) around 20 ms of device time. One instance per NPU leaves the device idle
# while its batch is copied (about 20 of every 28+ ms); the default two overlap one's copies with
# the other's execution.
BUSY_FEATURES, BUSY_ROWS = 1024, 8


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("npu_busy")
    repo = root / "models"
    omf.scale_model(
        repo / "npu_default" / "1" / "model.om",
        gears=(4, BUSY_ROWS),
        features=BUSY_FEATURES,
        latency_ms={"fixed": 20},
    )
    (repo / "npu_default" / "config.pbtxt").write_text(
        'name: "npu_default"\nbackend: "ascend"\n'  # instance_group, count: the defaults
    )
    config = {"device_count": 1, "copy_bytes_per_s": 8e6}
    env = omf.emulator_env({"PYTHONPATH": str(ROOT)}, config=config)
    with running_server([repo], ["--exit-timeout-secs", "10"], env=env, log_dir=root) as running:
        yield running


def aicore(server: ServerProcess) -> float:
    """NPU 0's busy fraction since the previous read (the emulator's utilisation window)."""
    text = httpx.get(server.metrics_url, timeout=10).text
    pattern = r'^ascend_npu_utilization\{device="0",engine="aicore"\} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    assert match, text
    return float(match.group(1))


def test_the_device_stays_busy_under_a_saturating_load(busy_server: ServerProcess) -> None:
    config = httpx.get(f"{busy_server.base}/v2/models/npu_default/config", timeout=10).json()
    assert [(g["count"], g["gpus"]) for g in config["instance_group"]] == [(2, [0])]
    x = np.ones((BUSY_ROWS, BUSY_FEATURES), dtype=np.float32)
    stop, failures = threading.Event(), []

    def client() -> None:
        with httpclient.InferenceServerClient(busy_server.http_url) as triton:
            tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            while not stop.is_set():
                try:
                    triton.infer("npu_default", [tensor])
                except Exception as exc:
                    failures.append(exc)
                    return

    clients = [threading.Thread(target=client) for _ in range(6)]
    for thread in clients:
        thread.start()
    try:
        time.sleep(1.0)  # warm up, then measure a window
        aicore(busy_server)
        time.sleep(4.0)
        busy = aicore(busy_server)
    finally:
        stop.set()
        for thread in clients:
            thread.join(30)
    assert not failures, failures
    # Measured on a 2-core machine: 0.66 with `count: 1` (the old default), 0.81 with two.
    assert busy >= 0.75, busy
