"""Many NPUs: instances spread over the devices that `instance_group { gpus }` or the
`device_ids` / `device_id` parameters of Ascend's Triton GE backend configs name, one executor
process per instance; a device the machine does not have refuses the model at load by name; and
the default two instances per NPU, in processes of their own, keep the device busy while
batches are copied."""

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
    assert sorted(set(devices_of(server, model))) == devices
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
# Each batch: 8 rows of 1024 FP32 (32 KB) copied in and out (holding the executor's GIL, as
# pyACL's memcpy does) around 20 ms of device time, under 6 clients sending back to back.
# "light": copies at 8 MB/s, 4 ms each way, the default two instances per NPU. "heavy": copies
# at 2.5 MB/s, 13 ms each way (more GIL time per batch than device time), three instances.
# One executor process per instance (the default) lets one instance's copies run while another
# returns from the device; the device starts each queued execution when the one before ends.
BUSY_FEATURES, BUSY_ROWS = 1024, 8
BUSY_LOADS = {"light": (8e6, None), "heavy": (2.5e6, 3)}  # copy bytes/s, instances per NPU


@pytest.fixture(scope="module", params=sorted(BUSY_LOADS))
def busy_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    copy_rate, count = BUSY_LOADS[request.param]
    root = tmp_path_factory.mktemp(f"npu_busy_{request.param}")
    repo = root / "models"
    omf.scale_model(
        repo / "npu_default" / "1" / "model.om",
        gears=(4, BUSY_ROWS),
        features=BUSY_FEATURES,
        latency_ms={"fixed": 20},
    )
    groups = f"instance_group [ {{ count: {count} }} ]\n" if count else ""  # else the defaults
    (repo / "npu_default" / "config.pbtxt").write_text(
        f'name: "npu_default"\nbackend: "ascend"\n{groups}'
    )
    config = {"device_count": 1, "copy_bytes_per_s": copy_rate}
    env = omf.emulator_env({"PYTHONPATH": str(ROOT)}, config=config)
    with running_server([repo], ["--exit-timeout-secs", "10"], env=env, log_dir=root) as running:
        running.load = request.param  # type: ignore[attr-defined]
        yield running


def aicore(server: ServerProcess) -> float:
    """NPU 0's busy fraction since the previous read (the emulator's utilisation window)."""
    text = httpx.get(server.metrics_url, timeout=10).text
    pattern = r'^ascend_npu_utilization\{device="0",engine="aicore"\} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    assert match, text
    return float(match.group(1))


def test_the_device_stays_busy_under_a_saturating_load(busy_server: ServerProcess) -> None:
    """The emulated device's own utilisation, not a timing of our code: >= 0.9 means it
    hardly ever waits for the host. Best of two 3 s windows (the machine is shared)."""
    config = httpx.get(f"{busy_server.base}/v2/models/npu_default/config", timeout=10).json()
    count = BUSY_LOADS[busy_server.load][1] or 2  # type: ignore[attr-defined]
    assert [(g["count"], g["gpus"]) for g in config["instance_group"]] == [(count, [0])]
    assert devices_of(busy_server, "npu_default") == [0] * count  # a process per instance
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
    readings = []
    try:
        time.sleep(1.0)  # warm up, then measure two windows
        aicore(busy_server)
        for _ in range(2):
            time.sleep(3.0)
            readings.append(aicore(busy_server))
    finally:
        stop.set()
        for thread in clients:
            thread.join(30)
    assert not failures, failures
    # Measured on the shared 2-core machine (bench/FINDINGS.md, "the device never waits for
    # the host"): light 0.97-1.00 (0.80 before), heavy 0.88-1.00 (0.6 with the instances in
    # one process, bounded there by 20 ms of device per 26 ms of GIL-held copies).
    floor = 0.9 if busy_server.load == "light" else 0.8  # type: ignore[attr-defined]
    assert max(readings) >= floor, readings
