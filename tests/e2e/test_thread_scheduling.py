"""Every thread and process of a running server runs under the policy --thread-scheduling names
(SCHED_BATCH by default, server/cpu_scheduling.py): the loop and grpc's handler threads, made
after start, and a Python model's worker process."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from harness.procutil import descendants
from harness.serverproc import running_server
from harness.testmodels import SLEEPER_MODEL, sleeper_config, write_python_model

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's"),
]


def policies(pid: int) -> set[int]:
    """The policies of every thread of `pid`."""
    found = set()
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            found.add(os.sched_getscheduler(int(name)))
        except ProcessLookupError:
            pass  # a thread that ended meanwhile
    return found


@pytest.mark.parametrize(
    ("flags", "policy", "logged"),
    [((), "SCHED_BATCH", "batch"), (("--thread-scheduling", "normal"), "SCHED_OTHER", "normal")],
)
def test_the_servers_threads_and_workers_run_under_the_chosen_policy(
    tmp_path: Path, flags: tuple[str, ...], policy: str, logged: str
) -> None:
    write_python_model(tmp_path, "sleeper", SLEEPER_MODEL, sleeper_config("sleeper"))
    expected = getattr(os, policy)
    with running_server([tmp_path], list(flags)) as server:
        body = {"inputs": [{"name": "SECONDS", "shape": [1], "datatype": "FP32", "data": [0]}]}
        answer = httpx.post(f"{server.base}/v2/models/sleeper/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        worker = answer.json()["outputs"][0]["data"][0]
        with grpcclient.InferenceServerClient(server.grpc_url) as client:  # handler threads
            seconds = grpcclient.InferInput("SECONDS", [1], "FP32")
            seconds.set_data_from_numpy(np.zeros(1, np.float32))
            result = client.infer("sleeper", [seconds])
            assert result.as_numpy("PID").tolist() == [worker]
        assert worker in descendants(server.pid)
        assert policies(server.pid) == {expected}
        assert policies(worker) == {expected}
        log = server.log_path.read_text()
        assert f"thread scheduling: {logged}" in log
