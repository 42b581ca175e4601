"""Python model workers die with the server: a worker busy in a long `execute` is killed when the
server process goes (PR_SET_PDEATHSIG), whichever thread started it, end_workers() kills the ones
still running at the server's exit deadline and starts no more, and the processes a model starts
end with its worker.

Every test checks by pid that the worker is gone, and kills what it started if it is not."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends import registry
from backends.base import InstanceSpec
from backends.python import process as python_process
from backends.python.backend import PythonBackend
from backends.python.process import WorkerDied, WorkerProcess
from harness.procutil import gone, kill_quietly, wait_gone
from harness.testmodels import FORKER_MODEL, SLEEPER_MODEL, sleeper_config, write_python_model
from protocol.errors import Unavailable
from repository.config import normalize, parse_config_text

ROOT = Path(__file__).resolve().parents[4]
SLEEPER_CONFIG = sleeper_config("sleeper")

# A stand-in for the server: starts a worker from a thread that then ends, puts it to sleep
# inside execute, prints the worker's pid and waits to be killed.
FAKE_SERVER = """
import sys, threading, time
from pathlib import Path
import numpy as np
from backends.python.process import WorkerProcess

version_dir = Path(sys.argv[1])
box = []
starter = threading.Thread(target=lambda: box.append(WorkerProcess.spawn()))
starter.start()
starter.join()
worker = box[0]
worker.initialize(version_dir / "model.py", version_dir, {"model_name": "sleeper"}, 30)
threading.Thread(target=worker.execute, args=([{"SECONDS": np.array([120], np.float32)}],
                                              ["PID"]), daemon=True).start()
time.sleep(0.5)  # now inside execute
print(worker.pid, flush=True)
time.sleep(120)
"""


def write_sleeper(root: Path) -> Path:
    return write_python_model(root, "sleeper", SLEEPER_MODEL, SLEEPER_CONFIG)


def seconds(value: float) -> dict[str, np.ndarray]:
    return {"SECONDS": np.array([value], np.float32)}


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[PythonBackend]:
    version_dir = write_sleeper(tmp_path)
    model_dir = version_dir.parent
    config = parse_config_text(SLEEPER_CONFIG, model_dir / "config.pbtxt")
    normalize(config, "sleeper", model_dir, [version_dir])
    backend = PythonBackend(
        config, model_dir, version_dir, InstanceSpec("sleeper_0", "KIND_CPU", 0, 0)
    )
    backend.load()
    yield backend
    backend.unload()


@pytest.fixture
def restore_spawning(monkeypatch: pytest.MonkeyPatch) -> None:
    """end_workers() refuses new workers for good (the server is exiting); undo it after."""
    monkeypatch.setattr(python_process, "_ended", False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_a_busy_worker_dies_when_the_server_process_is_killed(tmp_path: Path) -> None:
    version_dir = write_sleeper(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, "-c", FAKE_SERVER, str(version_dir)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=str(ROOT),
    )
    pid = 0
    try:
        line = server.stdout.readline()  # type: ignore[union-attr]
        assert line.strip(), "the stand-in server did not start its worker"
        pid = int(line)
        assert not gone(pid), "the worker died with the thread that started it"
        server.kill()
        server.wait(10)
        assert wait_gone(pid), "the worker outlived the server (still inside execute)"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
        if pid:
            kill_quietly(pid)


def test_a_worker_outlives_the_thread_that_asked_for_it(tmp_path: Path) -> None:
    version_dir = write_sleeper(tmp_path)
    box: list[WorkerProcess] = []
    starter = threading.Thread(target=lambda: box.append(WorkerProcess.spawn()))
    starter.start()
    starter.join()
    worker = box[0]
    try:
        time.sleep(0.3)
        assert worker.process.poll() is None
        worker.initialize(version_dir / "model.py", version_dir, {"model_name": "sleeper"}, 30)
        assert worker.execute([seconds(0)], ["PID"])[0]["PID"].shape == (1,)  # type: ignore[index]
    finally:
        worker.close()


def test_end_workers_kills_a_busy_worker_and_starts_no_more(
    sleeper: PythonBackend, restore_spawning: None
) -> None:
    worker = sleeper._worker
    assert worker is not None
    results: list = []
    runner = threading.Thread(
        target=lambda: results.extend(sleeper.execute_requests([seconds(120)]))
    )
    runner.start()
    time.sleep(0.3)  # inside execute now
    try:
        assert registry.end_child_processes() == 1
        runner.join(5)
        assert not runner.is_alive(), "the call did not return when its worker was killed"
        assert wait_gone(worker.pid)
        assert len(results) == 1 and isinstance(results[0], Unavailable)
        time.sleep(0.3)
        assert sleeper._worker is None and sleeper.restarts == 0  # not restarted
        with pytest.raises(WorkerDied, match="server is shutting down"):
            WorkerProcess.spawn()
        assert registry.end_child_processes() == 0
    finally:
        kill_quietly(worker.pid)
        runner.join(5)


def test_workers_are_forgotten_once_closed(sleeper: PythonBackend) -> None:
    worker = sleeper._worker
    assert worker in python_process.live_workers
    sleeper.unload()
    assert worker not in python_process.live_workers


def load_forker(root: Path) -> PythonBackend:
    version_dir = write_python_model(root, "forker", FORKER_MODEL, sleeper_config("forker"))
    model_dir = version_dir.parent
    config = parse_config_text(sleeper_config("forker"), model_dir / "config.pbtxt")
    normalize(config, "forker", model_dir, [version_dir])
    backend = PythonBackend(
        config, model_dir, version_dir, InstanceSpec("forker_0", "KIND_CPU", 0, 0)
    )
    backend.load()
    return backend


def forker_children(root: Path) -> list[int]:
    return [int(pid) for pid in (root / "forker" / "children.pid").read_text().split()]


@pytest.mark.parametrize("how", ["unload", "kill"])
def test_processes_a_model_started_end_with_its_worker(
    tmp_path: Path, how: str, restore_spawning: None
) -> None:
    """`unload`: the model's finalize, then its worker exits; `kill`: killed at the server's exit
    deadline. Either way the `sleep`, the `sleep` in its own session and the fork of the worker
    that the model started end too (issue 28 item 11)."""
    backend = load_forker(tmp_path)
    children = forker_children(tmp_path)
    try:
        assert not any(gone(pid) for pid in children)
        if how == "unload":
            backend.unload()
        else:
            assert registry.end_child_processes() == 1
        left = [pid for pid in children if not wait_gone(pid, 10)]
        assert not left, f"the model's processes outlived its worker: {left}"
    finally:
        backend.unload()
        for pid in children:
            kill_quietly(pid)
