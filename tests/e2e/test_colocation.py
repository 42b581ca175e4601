"""The event loop stays on one CPU and a cheap model's instance threads join it; the flag turns
that off (scheduler/affinity.py). Observed from outside, in /proc, as an operator would."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from examples.build_repository import build_simple
from harness.serverproc import running_server

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
        reason="needs Linux CPU affinity and two CPUs",
    ),
]

BODY = {
    "inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [2] * 16},
    ]
}


def allowed_cpus(pid: int) -> dict[int, str]:
    """thread id -> its Cpus_allowed_list, for every thread of the process."""
    result = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        line = next(s for s in status.splitlines() if s.startswith("Cpus_allowed_list:"))
        result[int(tid)] = line.split(":", 1)[1].strip()
    return result


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    model = build_simple(root)
    # One ORT thread: ONNX Runtime pins the threads of its own pool, which would blur what
    # these tests look for (the instance threads themselves).
    with open(model / "config.pbtxt", "a") as config:
        config.write('parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n')
    return root


def test_cheap_instances_join_the_pinned_event_loop(repository: Path, tmp_path: Path) -> None:
    with running_server([repository], log_dir=tmp_path) as server:
        with httpx.Client(base_url=server.base, timeout=10) as http:
            for _ in range(40):  # enough batches for both instances to settle
                reply = http.post("/v2/models/simple/infer", json=BODY)
                assert reply.json()["outputs"][0]["data"] == [3] * 16
        time.sleep(0.2)
        cpus = allowed_cpus(server.pid)
        loop_cpu = cpus[server.pid]
        assert "," not in loop_cpu and "-" not in loop_cpu  # the loop's thread: one CPU
        joined = [tid for tid, allowed in cpus.items() if tid != server.pid and allowed == loop_cpu]
        assert joined, cpus  # simple's instance threads moved onto it
        assert any(allowed != loop_cpu for allowed in cpus.values()), cpus  # others did not
        assert "event loop pinned to CPU" in server.log()


def test_the_flag_turns_colocation_off(repository: Path, tmp_path: Path) -> None:
    with running_server(
        [repository], ["--colocate-cheap-instances=false"], log_dir=tmp_path
    ) as server:
        with httpx.Client(base_url=server.base, timeout=10) as http:
            for _ in range(40):
                assert http.post("/v2/models/simple/infer", json=BODY).status_code == 200
        cpus = allowed_cpus(server.pid)
        single = [tid for tid, allowed in cpus.items() if "," not in allowed and "-" not in allowed]
        assert not single, cpus
        assert "event loop pinned" not in server.log()
