"""Python model workers end with the server, against a real server subprocess: after a
hard-deadline shutdown (`--exit-timeout-secs` reached while a model's execute still runs) and
after the server is SIGKILLed. Restarts are counted in `ascend_python_worker_restarts_total`.

Every test checks by pid that the worker is gone, and kills it if it is not, so nothing is left
behind even when an assertion fails."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.procutil import gone, kill_quietly, wait_for, wait_gone
from harness.serverproc import ServerProcess, running_server, start_server
from harness.testmodels import SLEEPER_MODEL, sleeper_config, write_python_model

pytestmark = pytest.mark.e2e


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """`napper`: the sleeper model, which writes its pid to napper/worker.pid as it starts."""
    root = tmp_path / "repo"
    write_python_model(root, "napper", SLEEPER_MODEL, sleeper_config("napper"))
    return root


@pytest.fixture
def pids(repo: Path) -> Iterator[list[int]]:
    """Worker pids a test saw; any still running at the end are killed."""
    seen: list[int] = []
    yield seen
    for pid in seen:
        if not gone(pid):
            kill_quietly(pid)


def worker_pid(repo: Path, not_this: int = 0) -> int:
    path = repo / "napper" / "worker.pid"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if path.exists():
            pid = int(path.read_text())
            if pid != not_this:
                return pid
        time.sleep(0.05)
    raise AssertionError("no worker pid written")


def nap(server: ServerProcess, seconds: float) -> httpx.Response:
    body = {"inputs": [{"name": "SECONDS", "shape": [1], "datatype": "FP32", "data": [seconds]}]}
    return httpx.post(server.base + "/v2/models/napper/infer", json=body, timeout=60)


def nap_in_background(server: ServerProcess, seconds: float) -> tuple[threading.Thread, list]:
    answers: list = []

    def run() -> None:
        try:
            answers.append(nap(server, seconds))
        except httpx.HTTPError as exc:
            answers.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, answers


def restarts(server: ServerProcess) -> str:
    text = httpx.get(server.metrics_url, timeout=10).text
    match = re.search(
        r'^ascend_python_worker_restarts_total\{model="napper",version="1"\} (\S+)$', text, re.M
    )
    return match.group(1) if match else ""


def test_a_worker_busy_past_the_exit_deadline_is_killed_at_shutdown(
    repo: Path, tmp_path: Path, pids: list[int]
) -> None:
    server = start_server([repo], ["--exit-timeout-secs", "2"], log_dir=tmp_path)
    try:
        pid = worker_pid(repo)
        pids.append(pid)
        thread, answers = nap_in_background(server, 120)
        time.sleep(0.5)  # inside execute now
        stopping = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        assert server.process.wait(20) == 0
        assert time.monotonic() - stopping < 10
        assert wait_gone(pid, 5), f"worker {pid} outlived the server:\n{server.log()}"
        thread.join(10)
        assert answers and isinstance(answers[0], httpx.Response), answers
        assert answers[0].status_code == 503, answers[0].text
        assert (
            "killed 1 model worker process(es) still running at the exit deadline" in server.log()
        )
    finally:
        server.stop()


def test_a_busy_worker_dies_when_the_server_is_sigkilled(
    repo: Path, tmp_path: Path, pids: list[int]
) -> None:
    server = start_server([repo], log_dir=tmp_path)
    try:
        pid = worker_pid(repo)
        pids.append(pid)
        nap_in_background(server, 120)
        time.sleep(0.5)  # inside execute now
        os.kill(server.pid, signal.SIGKILL)
        server.process.wait(10)
        assert wait_gone(pid, 5), f"worker {pid} outlived the SIGKILLed server"
    finally:
        server.stop()


def test_worker_restarts_are_counted_per_model_version(
    repo: Path, tmp_path: Path, pids: list[int]
) -> None:
    with running_server([repo], log_dir=tmp_path) as server:
        first = worker_pid(repo)
        pids.append(first)
        assert restarts(server) == "0"  # the series exists as soon as the version loads
        os.kill(first, signal.SIGKILL)
        second = worker_pid(repo, not_this=first)
        pids.append(second)
        wait_for(lambda: restarts(server) == "1", "the restart to be counted", timeout=10)
        assert nap(server, 0).status_code == 200
        assert (
            "# TYPE ascend_python_worker_restarts_total counter"
            in httpx.get(server.metrics_url).text
        )
        assert server.stop() == 0
    assert wait_gone(second, 5)
