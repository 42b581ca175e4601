"""NPU models run in executor processes, never in the server's (npu/executor/): pyACL keeps the
GIL through a load, every copy and every gear change, and the emulator does too (it waits in a
C sleep that keeps the GIL), so a call in the server's process would freeze every frontend.

One server, explicit model control: `npu_fast` (loaded at start) and `npu_busy` (each execution
takes 1.5 s of device time) serve while `npu_slow` (a 3 s load) is loaded through the API.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.procutil import children_running, wait_for, wait_gone
from harness.serverproc import ServerProcess, running_server
from tests.support import om_fixtures as omf

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[3]
EXECUTOR = b"npu.executor.main"
LOAD_MS = 3000


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("npu_executor")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ServerProcess]:
    repo = root / "models"
    omf.write_model_repository(repo, "npu_fast", gears=(1, 2), dynamic_batching=False)
    omf.write_model_repository(
        repo,
        "npu_busy",
        gears=(1, 2),
        dynamic_batching=False,
        om_writer=omf.with_fields(omf.scale_model, latency_ms={"fixed": 1500}),
    )
    omf.write_model_repository(
        repo,
        "npu_slow",
        gears=(1, 2),
        dynamic_batching=False,
        om_writer=omf.with_fields(omf.scale_model, load_ms=LOAD_MS),
    )
    env = omf.emulator_env({"PYTHONPATH": str(ROOT)}, config={"device_count": 1})
    env["ACL_EMU_IMPORTS"] = str(root / "acl_imports")
    args = ["--model-control-mode", "explicit", "--load-model", "npu_fast"]
    args += ["--load-model", "npu_busy", "--exit-timeout-secs", "10"]
    with running_server([repo], args, env=env, log_dir=root) as running:
        yield running


def infer(server: ServerProcess, model: str, timeout: float = 30.0) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1] * 4}]}
    return httpx.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=timeout)


def executors(server: ServerProcess, model: str) -> list[int]:
    return [
        pid
        for pid in children_running(server.pid, EXECUTOR)
        if f"\0{model}\0".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def test_live_and_other_models_answer_throughout_a_slow_load(server: ServerProcess) -> None:
    """Prometheus scrapes the metrics port meanwhile: the NPU gauges are read from the
    executors, one of which answers only once its load lets go of its GIL (before the reads
    moved off the loop, such a scrape froze /v2/health/live for 3.4 s)."""
    assert infer(server, "npu_fast").status_code == 200
    outcome: dict = {}
    scrapes: list[int] = []

    def load() -> None:
        started = time.monotonic()
        response = httpx.post(f"{server.base}/v2/repository/models/npu_slow/load", timeout=60)
        outcome.update(status=response.status_code, text=response.text)
        outcome["took"] = time.monotonic() - started

    def scrape() -> None:
        with httpx.Client(timeout=30) as client:
            while loader.is_alive():
                scrapes.append(client.get(server.metrics_url).status_code)
                time.sleep(0.1)

    loader = threading.Thread(target=load)
    scraper = threading.Thread(target=scrape)
    live_gaps: list[float] = []
    infer_times: list[float] = []
    loader.start()
    scraper.start()
    with httpx.Client(timeout=30) as client:
        last = time.monotonic()
        while loader.is_alive():
            assert client.get(f"{server.base}/v2/health/live").status_code == 200
            now = time.monotonic()
            live_gaps.append(now - last)
            last = now
            started = time.monotonic()
            assert infer(server, "npu_fast").status_code == 200
            infer_times.append(time.monotonic() - started)
            last = time.monotonic()
            time.sleep(0.01)
    loader.join()
    scraper.join()
    assert outcome["status"] == 200, outcome["text"]
    assert scrapes and set(scrapes) == {200}
    assert outcome["took"] > LOAD_MS / 1000 * 0.8  # the load really took its seconds
    assert max(live_gaps) < 1.0, f"liveness stalled {max(live_gaps):.2f} s during the load"
    assert max(infer_times) < 1.0, f"npu_fast took {max(infer_times):.2f} s during the load"
    assert infer(server, "npu_slow").json()["outputs"][0]["data"] == [3.0] * 4


def test_acl_is_never_imported_in_the_server_process(server: ServerProcess, root: Path) -> None:
    """The emulator records the pid of every process that imports it (ACL_EMU_IMPORTS)."""
    assert infer(server, "npu_fast").status_code == 200
    assert infer(server, "npu_busy").status_code == 200
    imported = {int(line) for line in (root / "acl_imports").read_text().split()}
    # The record works: the executor (each supervisor's child) of either model is in it.
    for supervisor in executors(server, "npu_fast") + executors(server, "npu_busy"):
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
        assert {int(child) for child in children} & imported
    assert server.pid not in imported


def test_each_model_runs_in_an_executor_of_its_own(server: ServerProcess) -> None:
    fast, busy = executors(server, "npu_fast"), executors(server, "npu_busy")
    assert len(fast) == 1 and len(busy) == 1 and fast != busy


def test_an_executor_crash_fails_its_batch_and_the_model_serves_again(
    server: ServerProcess,
) -> None:
    [pid] = executors(server, "npu_busy")
    result: dict = {}
    request = threading.Thread(target=lambda: result.update(r=infer(server, "npu_busy")))
    request.start()
    time.sleep(0.5)  # the batch is on the device (1.5 s)
    os.kill(pid, signal.SIGKILL)
    request.join(30)
    response = result["r"]
    assert response.status_code == 503, response.text
    assert "killed by SIGKILL" in response.json()["error"]
    wait_for(lambda: len(executors(server, "npu_busy")) == 1, "a new executor", timeout=30)
    assert executors(server, "npu_busy") != [pid]
    again = infer(server, "npu_busy")
    assert again.status_code == 200, again.text
    assert again.json()["outputs"][0]["data"] == [3.0] * 4
    assert infer(server, "npu_fast").status_code == 200  # the other executor never noticed


def test_unloading_a_model_ends_its_executor(server: ServerProcess) -> None:
    """Loads npu_slow itself (a no-op when the slow-load test before it has), so it runs alone."""
    loaded = httpx.post(f"{server.base}/v2/repository/models/npu_slow/load", timeout=60)
    assert loaded.status_code == 200, loaded.text
    [pid] = executors(server, "npu_slow")
    response = httpx.post(f"{server.base}/v2/repository/models/npu_slow/unload", timeout=30)
    assert response.status_code == 200, response.text
    assert wait_gone(pid, timeout=15)


def test_executors_die_with_the_server(server: ServerProcess) -> None:
    pids = children_running(server.pid, EXECUTOR)
    assert pids
    os.kill(server.pid, signal.SIGKILL)
    assert all(wait_gone(pid, timeout=10) for pid in pids)
