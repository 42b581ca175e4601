"""--model-control-mode=poll against a server subprocess, under continuous client load.

Four client threads send `simple` requests one after another for the whole test and check every
answer; the offset (OUTPUT0 - (INPUT0 + INPUT1)) tells which model copy answered. Waits are
bounded loops on what the server reports (index, answers), never assertions about time.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from examples.build_repository import build_simple, simple_config
from examples.variants import write_version
from harness.procutil import wait_for
from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

# Settle time 0: act once two polls in a row see the same files (the settle time has its own
# tests below).
POLL = [
    "--model-control-mode",
    "poll",
    "--repository-poll-secs",
    "0.2",
    "--repository-settle-secs",
    "0",
]


def body(start: int) -> dict:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "INT32",
                "data": list(range(start, start + 16)),
            },
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ]
    }


class Traffic:
    """Client threads sending requests until stopped; keeps (status, offset or error) per thread."""

    def __init__(self, base: str, model: str = "simple", threads: int = 4) -> None:
        self.url = f"{base}/v2/models/{model}/infer"
        self.answers: list[list[tuple[int, object]]] = [[] for _ in range(threads)]
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)
        ]

    def _run(self, index: int) -> None:
        with httpx.Client(timeout=30) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                try:
                    reply = client.post(self.url, json=body(n))
                except httpx.HTTPError as exc:
                    self.answers[index].append((0, repr(exc)))
                    continue
                if reply.status_code == 200:
                    out = reply.json()["outputs"][0]["data"][0]
                    self.answers[index].append((200, out - (n + 1)))
                else:
                    self.answers[index].append((reply.status_code, reply.text))

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        wait_for(lambda: all(len(a) >= 3 for a in self.answers), "traffic to flow")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def offsets(self) -> set:
        return {value for answers in self.answers for status, value in answers if status == 200}

    def wait_until_all_see(self, offset: int) -> None:
        marks = [len(a) for a in self.answers]
        wait_for(
            lambda: all(
                any(v == offset for _, v in a[m:])
                for a, m in zip(self.answers, marks, strict=False)
            ),
            f"every client to get answers with offset {offset}",
        )

    def check(self) -> None:
        """Every request answered 200, and no client went back to an older copy after a newer
        one had answered it."""
        failures = [
            (status, value)
            for answers in self.answers
            for status, value in answers
            if status != 200
        ]
        assert failures == [], f"{len(failures)} failed requests, e.g. {failures[:3]}"
        for answers in self.answers:
            order = [value for _, value in answers]
            switches = [order[i] for i in range(1, len(order)) if order[i] != order[i - 1]]
            assert len(switches) == len(set(switches)), f"a client flipped back: {switches}"


def index(server: ServerProcess) -> dict[tuple[str, str], dict]:
    entries = httpx.post(server.base + "/v2/repository/index", timeout=10).json()
    return {(e["name"], e.get("version", "")): e for e in entries}


def state(server: ServerProcess, name: str, version: str) -> str:
    return index(server).get((name, version), {}).get("state", "")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    build_simple(root)
    return root


def test_a_new_version_swaps_in_and_the_old_one_leaves_without_a_failed_request(
    repo: Path, tmp_path: Path
) -> None:
    with running_server([repo], POLL, log_dir=tmp_path) as server:
        with Traffic(server.base) as traffic:
            write_version(repo / "simple", 2, offset=100, config=False)
            wait_for(lambda: state(server, "simple", "2") == "READY", "version 2 to be READY")
            traffic.wait_until_all_see(100)
            assert index(server)[("simple", "1")] == {
                "name": "simple",
                "version": "1",
                "state": "UNAVAILABLE",
                "reason": "unloaded",
            }
            shutil.rmtree(repo / "simple" / "1")
            wait_for(lambda: ("simple", "1") not in index(server), "version 1 to leave the index")
            traffic.wait_until_all_see(100)
        traffic.check()
        assert traffic.offsets() == {0, 100}
        assert state(server, "simple", "2") == "READY"
        # metrics and statistics follow the versions they describe
        metrics = httpx.get(server.metrics_url).text
        assert re.search(
            r'^nv_inference_request_success\{model="simple",version="2"\} [1-9]', metrics, re.M
        )
        assert 'version="1"' not in metrics
        stats = httpx.get(server.base + "/v2/models/simple/stats").json()["model_stats"]
        assert [s["version"] for s in stats] == ["2"] and stats[0]["inference_count"] > 0
        missing = httpx.get(server.base + "/v2/models/simple/versions/1/stats")
        assert missing.status_code == 400
        assert server.stop() == 0  # the poller stops cleanly on SIGTERM


def test_a_corrupt_version_never_interrupts_the_serving_one(repo: Path, tmp_path: Path) -> None:
    with running_server([repo], POLL, log_dir=tmp_path) as server:
        with Traffic(server.base) as traffic:
            (repo / "simple" / "2").mkdir()
            (repo / "simple" / "2" / "model.onnx").write_bytes(b"this is not an onnx file")
            wait_for(
                lambda: "reload failed" in index(server)[("simple", "1")].get("reason", ""),
                "the failure to show in the index",
            )
            entry = index(server)[("simple", "1")]
            assert entry["state"] == "READY"
            assert "2/model.onnx" in entry["reason"]
            # the failed version shows where users look, and strict readiness counts it
            failed = index(server)[("simple", "2")]
            assert failed["state"] == "UNAVAILABLE" and "2/model.onnx" in failed["reason"]
            assert not failed["reason"].startswith("reload failed")
            assert httpx.get(server.base + "/v2/health/ready").status_code == 400
            traffic.wait_until_all_see(0)
            # later changes are still picked up: a fixed copy of version 2 swaps in
            write_version(repo / "simple", 2, offset=100, config=False)
            wait_for(lambda: state(server, "simple", "2") == "READY", "the fixed version 2")
            traffic.wait_until_all_see(100)
            assert httpx.get(server.base + "/v2/health/ready").status_code == 200
        traffic.check()
        assert traffic.offsets() == {0, 100}
        assert "reason" not in index(server)[("simple", "2")]


def test_a_config_change_reloads_the_same_version_in_place(repo: Path, tmp_path: Path) -> None:
    config_url = "/v2/models/simple/config"
    with running_server([repo], POLL, log_dir=tmp_path) as server:
        assert httpx.get(server.base + config_url).json()["max_batch_size"] == 8
        with Traffic(server.base) as traffic:
            (repo / "simple" / "config.pbtxt").write_text(simple_config("simple", 4))
            wait_for(
                lambda: httpx.get(server.base + config_url).json()["max_batch_size"] == 4,
                "the new config to serve",
            )
            traffic.wait_until_all_see(0)
            # a config that does not parse keeps the running copy and says why
            (repo / "simple" / "config.pbtxt").write_text("max_batch_size: [[[\n")
            wait_for(
                lambda: "config.pbtxt:1" in index(server)[("simple", "1")].get("reason", ""),
                "the parse error in the index",
            )
            traffic.wait_until_all_see(0)
        traffic.check()
        assert index(server)[("simple", "1")]["state"] == "READY"
        assert httpx.get(server.base + config_url).json()["max_batch_size"] == 4


def test_a_model_copied_in_slowly_is_loaded_only_once_complete(repo: Path, tmp_path: Path) -> None:
    seen: list[dict] = []
    answers: list[int] = []
    done = threading.Event()
    with running_server(
        [repo],
        [
            "--model-control-mode",
            "poll",
            "--repository-poll-secs",
            "0.5",
            "--repository-settle-secs",
            "0",
        ],
        log_dir=tmp_path,
    ) as server:

        def copy_slowly() -> None:
            (repo / "late").mkdir()
            (repo / "late" / "config.pbtxt").write_text(simple_config("late", 8))
            write_version(repo / "late", 1, offset=7, chunks=30, pause=0.05, config=False)
            done.set()

        writer = threading.Thread(target=copy_slowly)
        writer.start()
        while not done.is_set():
            seen.extend(e for (name, _), e in index(server).items() if name == "late")
            answers.append(
                httpx.post(server.base + "/v2/models/late/infer", json=body(0)).status_code
            )
            time.sleep(0.05)
        writer.join()
        assert seen and all(entry == {"name": "late"} for entry in seen), seen
        assert set(answers) == {404}
        wait_for(lambda: state(server, "late", "1") == "READY", "the complete model to load")
        reply = httpx.post(server.base + "/v2/models/late/infer", json=body(0))
        assert reply.status_code == 200 and reply.json()["outputs"][0]["data"][0] == 0 + 1 + 7
        assert "failed to load" not in server.log()


def test_models_appear_and_leave_and_duplicates_are_named(repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    build_simple(other, name="extra")
    args = [*POLL, "--model-repository", str(other)]
    with running_server([repo], args, log_dir=tmp_path) as server:
        assert state(server, "extra", "1") == "READY"
        build_simple(other, name="simple")  # now in both repositories
        wait_for(lambda: ("simple", "") in index(server), "the duplicate to be reported")
        assert index(server)[("simple", "")] == {
            "name": "simple",
            "state": "UNAVAILABLE",
            "reason": "model appears in two or more repositories",
        }
        assert httpx.post(server.base + "/v2/models/simple/infer", json=body(0)).status_code == 503
        shutil.rmtree(other / "simple")
        wait_for(lambda: state(server, "simple", "1") == "READY", "simple to come back")
        shutil.rmtree(other / "extra")
        wait_for(lambda: state(server, "extra", "1") == "UNAVAILABLE", "extra to be unloaded")
        assert index(server)[("extra", "1")]["reason"] == "unloaded"
        reply = httpx.post(server.base + "/v2/models/extra/infer", json=body(0))
        assert reply.status_code == 503
        assert httpx.get(server.base + "/v2/health/ready").status_code == 200
        # the control API is refused while polling, with Triton's message
        refused = httpx.post(server.base + "/v2/repository/models/simple/load")
        assert refused.status_code == 503 and refused.json() == {
            "error": "explicit model load / unload is not allowed if polling is enabled"
        }


# A Python model answering OUT = 1; the second half, appended later, redefines it to answer 2.
FIRST_HALF = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    answer = 1

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", np.full((1,), self.answer, np.int32))]) for _ in requests]
"""
SECOND_HALF = """

class TritonPythonModel(TritonPythonModel):
    answer = 2
"""
HALVES_CONFIG = """
name: "halves"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def halves_answer(server: ServerProcess) -> object:
    reply = httpx.post(
        server.base + "/v2/models/halves/infer",
        json={"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [0]}]},
        timeout=10,
    )
    return reply.json()["outputs"][0]["data"][0] if reply.status_code == 200 else reply.status_code


def test_a_model_py_copied_in_two_parts_loads_only_once_it_settled(
    repo: Path, tmp_path: Path
) -> None:
    """Issue #13 item 8: with two polls in a row as the only rule, the first half (valid
    Python) loaded and served until the second half arrived."""
    args = [
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "0.2",
        "--repository-settle-secs",
        "2.5",
    ]
    answers: list[object] = []
    with running_server([repo], args, log_dir=tmp_path) as server:
        (repo / "halves").mkdir()
        (repo / "halves" / "config.pbtxt").write_text(HALVES_CONFIG)
        target = repo / "halves" / "1" / "model.py"
        target.parent.mkdir()
        target.write_text(FIRST_HALF)
        pause_ends = time.monotonic() + 1.0  # polls see the first half, unchanged, meanwhile
        while time.monotonic() < pause_ends:
            answers.append(halves_answer(server))
            time.sleep(0.05)
        with open(target, "a") as handle:
            handle.write(SECOND_HALF)
        wait_for(lambda: state(server, "halves", "1") == "READY", "the complete model")
        answers.append(halves_answer(server))
        assert answers[-1] == 2
    assert 1 not in answers, answers  # the first half never served


def test_a_ready_marker_written_last_loads_without_waiting_for_the_settle_time(
    repo: Path, tmp_path: Path
) -> None:
    args = [
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "0.2",
        "--repository-settle-secs",
        "600",
    ]
    with running_server([repo], args, log_dir=tmp_path) as server:
        write_version(repo / "simple", 2, offset=100, config=False)
        time.sleep(1.0)  # five polls: the settle time holds it back
        assert ("simple", "2") not in index(server)
        (repo / "simple" / "2" / ".ready").touch()
        wait_for(
            lambda: state(server, "simple", "2") == "READY", "version 2 with its marker", timeout=10
        )
        reply = httpx.post(server.base + "/v2/models/simple/infer", json=body(0))
        assert reply.json()["outputs"][0]["data"][0] == 0 + 1 + 100
