"""--model-control-mode=explicit: load, reload and unload over HTTP and gRPC, file overrides and
their path checks, warm-up, and readiness, against server subprocesses."""

from __future__ import annotations

import base64
import json
import re
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from examples.build_repository import build_simple, simple_config
from examples.variants import model_bytes
from harness.procutil import wait_for
from harness.serverproc import ServerProcess, running_server
from repository.overrides import PREFIX

pytestmark = pytest.mark.e2e

EXPLICIT = ["--model-control-mode", "explicit"]
# File overrides are refused unless the server is started with this (issue 13, item 2).
OVERRIDES = ["--allow-model-load-file-override"]
SIMPLE_JSON = json.dumps(
    {
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [
            {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
            {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]},
        ],
        "output": [
            {"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]},
            {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]},
        ],
    }
)


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


def offset(server: ServerProcess, model: str = "simple") -> int:
    reply = httpx.post(f"{server.base}/v2/models/{model}/infer", json=body(0), timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.json()["outputs"][0]["data"][0] - 1


class Traffic:
    """Client threads sending `simple` requests until stopped; every answer kept."""

    def __init__(self, base: str, threads: int = 4) -> None:
        self.url = f"{base}/v2/models/simple/infer"
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
                reply = client.post(self.url, json=body(n))
                value = (
                    reply.json()["outputs"][0]["data"][0] - (n + 1)
                    if reply.status_code == 200
                    else reply.text
                )
                self.answers[index].append((reply.status_code, value))

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        wait_for(lambda: all(len(a) >= 3 for a in self.answers), "traffic to flow")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def wait_until_all_see(self, value: int) -> None:
        marks = [len(a) for a in self.answers]
        wait_for(
            lambda: all(
                any(v == value for _, v in a[m:]) for a, m in zip(self.answers, marks, strict=False)
            ),
            f"every client to get answers with offset {value}",
        )

    def failures(self) -> list:
        return [a for answers in self.answers for a in answers if a[0] != 200]


def index(server: ServerProcess) -> dict[tuple[str, str], dict]:
    entries = httpx.post(server.base + "/v2/repository/index", timeout=10).json()
    return {(e["name"], e.get("version", "")): e for e in entries}


def load(
    server: ServerProcess,
    name: str,
    config: str | None = None,
    files: dict[str, bytes] | None = None,
) -> httpx.Response:
    parameters: dict[str, str] = {}
    if config is not None:
        parameters["config"] = config
    for path, data in (files or {}).items():
        parameters[f"file:{path}"] = base64.b64encode(data).decode()
    payload = {"parameters": parameters} if parameters else None
    return httpx.post(f"{server.base}/v2/repository/models/{name}/load", json=payload, timeout=60)


def unload(server: ServerProcess, name: str, dependents: bool = False) -> httpx.Response:
    return httpx.post(
        f"{server.base}/v2/repository/models/{name}/unload",
        json={"parameters": {"unload_dependents": dependents}},
        timeout=60,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    build_simple(root)
    build_simple(root, name="other")
    return root


def test_load_reload_and_unload_over_http_under_load(repo: Path, tmp_path: Path) -> None:
    with running_server(
        [repo], [*EXPLICIT, *OVERRIDES, "--load-model", "simple"], log_dir=tmp_path
    ) as server:
        assert index(server) == {
            ("simple", "1"): {"name": "simple", "version": "1", "state": "READY"},
            ("other", ""): {"name": "other"},
        }
        assert httpx.post(server.base + "/v2/models/other/infer", json=body(0)).status_code == 404
        assert load(server, "other").status_code == 200
        assert index(server)[("other", "1")]["state"] == "READY" and offset(server, "other") == 0

        with Traffic(server.base) as traffic:
            # reload from a config and file overrides: the new copy answers, none fails
            reply = load(server, "simple", SIMPLE_JSON, {"1/model.onnx": model_bytes(100)})
            assert reply.status_code == 200, reply.text
            traffic.wait_until_all_see(100)
            # a corrupt override: refused with the reason, the running copy keeps serving
            reply = load(server, "simple", SIMPLE_JSON, {"1/model.onnx": b"garbage"})
            assert reply.status_code == 400
            assert reply.json()["error"].startswith("load failed for model 'simple'")
            entry = index(server)[("simple", "1")]
            assert entry["state"] == "READY" and "reload failed" in entry["reason"]
            traffic.wait_until_all_see(100)
            # a plain load goes back to the repository's files
            assert load(server, "simple").status_code == 200
            traffic.wait_until_all_see(0)
        assert traffic.failures() == []
        assert index(server)[("simple", "1")] == {
            "name": "simple",
            "version": "1",
            "state": "READY",
        }

        # a config override alone still auto-completes (Triton's qa test_file_override relies on it)
        assert load(server, "other", json.dumps({"backend": "onnxruntime"})).status_code == 200
        config = httpx.get(server.base + "/v2/models/other/config").json()
        assert config["max_batch_size"] == 4 and [i["name"] for i in config["input"]] == [
            "INPUT0",
            "INPUT1",
        ]

        assert unload(server, "other").status_code == 200
        assert index(server)[("other", "1")] == {
            "name": "other",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        }
        assert httpx.post(server.base + "/v2/models/other/infer", json=body(0)).status_code == 503
        assert httpx.get(server.base + "/v2/models/other/stats").status_code == 400
        assert 'model="other"' not in httpx.get(server.metrics_url).text
        assert httpx.get(server.base + "/v2/health/ready").status_code == 200  # unloaded != broken

        reply = load(server, "nope")
        assert reply.status_code == 400
        assert reply.json() == {
            "error": "failed to load 'nope', failed to poll from model repository"
        }
        assert all(name != "nope" for name, _ in index(server))
        assert unload(server, "nope").status_code == 200  # nothing to do

        assert unload(server, "simple").status_code == 200
        assert httpx.get(server.base + "/v2/health/ready").status_code == 400  # no model loaded
        assert httpx.post(server.base + "/v2/repository/index", json={"ready": True}).json() == []


def test_load_reload_and_unload_over_grpc(repo: Path, tmp_path: Path) -> None:
    with running_server(
        [repo], [*EXPLICIT, *OVERRIDES, "--load-model", "*"], log_dir=tmp_path
    ) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with Traffic(server.base) as traffic:
            client.load_model(
                "simple", config=SIMPLE_JSON, files={"file:1/model.onnx": model_bytes(100)}
            )
            traffic.wait_until_all_see(100)
        assert traffic.failures() == []
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(np.zeros((1, 16), np.int32))
        inputs[1].set_data_from_numpy(np.ones((1, 16), np.int32))
        result = client.infer("simple", inputs)
        assert result.as_numpy("OUTPUT0")[0, 0] == 101

        with pytest.raises(
            InferenceServerException, match="failed to load 'simple': file override"
        ):
            client.load_model("simple", config=SIMPLE_JSON, files={"file:../escape.onnx": b"x"})
        client.unload_model("other", unload_dependents=True)
        models = {
            (m.name, m.version): (m.state, m.reason)
            for m in client.get_model_repository_index().models
        }
        assert models[("other", "1")] == ("UNAVAILABLE", "unloaded")
        assert models[("simple", "1")] == ("READY", "")
        assert not client.is_model_ready("other") and client.is_model_ready("simple")
        ready = httpx.post(server.base + "/v2/repository/index", json={"ready": True}).json()
        assert ready == [{"name": "simple", "version": "1", "state": "READY"}]
        client.load_model("other")
        assert client.is_model_ready("other")
        client.close()


def overrides(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.startswith(PREFIX)]


def test_file_overrides_never_write_outside_their_directory(repo: Path, tmp_path: Path) -> None:
    private = tmp_path / "tmp"
    private.mkdir()
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(model_bytes(0))
    attempts = [
        "../x",
        "1/../../x",
        "1/../../../x",
        str(tmp_path / "absolute"),
        "1//model.onnx",
        "./1/model.onnx",
        "1/model.onnx\x00",
    ]
    with running_server(
        [repo],
        EXPLICIT + OVERRIDES + ["--load-model", "simple"],
        env={"TMPDIR": str(private)},
        log_dir=tmp_path,
    ) as server:
        for key in attempts:
            reply = load(
                server, "sneaky", SIMPLE_JSON, {"1/model.onnx": model_bytes(0), key: b"pwned"}
            )
            assert reply.status_code == 400, key
            # Triton's words for a refused override (qa's test_file_override_security)
            assert reply.json()["error"].startswith("failed to load 'sneaky': "), reply.text
        # config fields that would make the server read outside the model directory
        for field, value in (
            ("default_model_filename", str(outside)),
            ("default_model_filename", "../../../outside.onnx"),
        ):
            config = json.loads(SIMPLE_JSON) | {field: value}
            reply = load(server, "sneaky", json.dumps(config), {"1/model.onnx": b"x"})
            assert reply.status_code == 400 and "must be a relative path" in reply.json()["error"]
        labels = json.loads(SIMPLE_JSON)
        labels["output"][0]["label_filename"] = "../../../../etc/passwd"
        reply = load(server, "sneaky", json.dumps(labels), {"1/model.onnx": model_bytes(0)})
        assert reply.status_code == 400 and "label_filename" in reply.json()["error"]
        # names that are not directory names look like any unknown model
        for name in ("%2E%2E", ".hidden", "a%00b"):
            reply = load(server, name, SIMPLE_JSON, {"1/model.onnx": model_bytes(0)})
            assert reply.status_code == 400 and "failed to poll from model repository" in reply.text
        # files without a config are refused, as in Triton
        reply = load(server, "sneaky", None, {"1/model.onnx": model_bytes(0)})
        assert reply.json() == {
            "error": "failed to load 'sneaky', failed to poll from model repository"
        }

        assert not (tmp_path / "x").exists() and not (tmp_path / "absolute").exists()
        assert overrides(private) == []  # every refused load left nothing behind
        assert [p for p in tmp_path.rglob("*") if p.is_file() and p.read_bytes() == b"pwned"] == []
        assert all(
            name != "sneaky" or entry.get("state") != "READY"
            for (name, _), entry in index(server).items()
        )
        reply = load(server, "sneaky", SIMPLE_JSON, {"1/model.onnx": model_bytes(5)})
        assert reply.status_code == 200 and offset(server, "sneaky") == 5
        assert len(overrides(private)) == 1
        assert unload(server, "sneaky").status_code == 200
        assert overrides(private) == []
        assert httpx.get(server.base + "/v2/health/live").status_code == 200


PYTHON_MODEL = """
import pathlib
pathlib.Path({marker!r}).write_text("code sent over the network ran")


class TritonPythonModel:
    def execute(self, requests):
        return []
"""
PYTHON_JSON = json.dumps(
    {
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
    }
)


def test_file_overrides_are_refused_without_the_flag(repo: Path, tmp_path: Path) -> None:
    """A network client must not be able to make the server run code: by default `file:`
    parameters are refused with 403 / PERMISSION_DENIED naming the flag, before anything is
    written; config overrides stay allowed."""
    private = tmp_path / "tmp"
    private.mkdir()
    marker = tmp_path / "ran"
    model_py = PYTHON_MODEL.format(marker=str(marker)).encode()
    with running_server(
        [repo],
        EXPLICIT + ["--load-model", "simple"],
        env={"TMPDIR": str(private)},
        log_dir=tmp_path,
    ) as server:
        reply = load(server, "evil", PYTHON_JSON, {"1/model.py": model_py})
        assert reply.status_code == 403
        assert reply.json() == {
            "error": "load failed for model 'evil': file overrides ('file:' "
            "parameters) are not allowed; start the server with "
            "--allow-model-load-file-override to allow them"
        }
        reply = load(server, "simple", SIMPLE_JSON, {"1/model.onnx": model_bytes(100)})
        assert reply.status_code == 403 and offset(server) == 0  # the old copy still serves

        client = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("evil", config=PYTHON_JSON, files={"file:1/model.py": model_py})
        assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
        assert "--allow-model-load-file-override" in refused.value.message()
        client.close()

        assert overrides(private) == [] and not marker.exists()  # nothing written, nothing ran
        assert all(name != "evil" for name, _ in index(server))
        # a config override alone is still allowed
        assert load(server, "other", json.dumps({"backend": "onnxruntime"})).status_code == 200
        assert offset(server, "other") == 0


WARMUP = """
model_warmup [ {
  name: "zeros" batch_size: 2 count: 3
  inputs [ { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } },
           { key: "INPUT1"
             value: { data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "ones.bin" } } ]
} ]
"""


def test_warmup_runs_before_ready_and_a_failing_one_fails_the_load(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    warm = build_simple(repo, name="warm")
    (warm / "config.pbtxt").write_text(simple_config("warm", 8) + WARMUP)
    (warm / "warmup").mkdir()
    (warm / "warmup" / "ones.bin").write_bytes(np.ones(16, np.int32).tobytes())
    cold = build_simple(repo, name="cold")
    (cold / "config.pbtxt").write_text(simple_config("cold", 8) + WARMUP)  # no ones.bin
    with running_server([repo], EXPLICIT, wait_ready=False, log_dir=tmp_path) as server:
        assert httpx.get(server.base + "/v2/health/ready").status_code == 400  # nothing loaded
        assert load(server, "warm").status_code == 200
        stats = httpx.get(server.base + "/v2/models/warm/stats").json()["model_stats"][0]
        assert stats["inference_count"] == 0 and stats["execution_count"] == 0
        assert re.search(
            r'^nv_inference_count\{model="warm",version="1"\} 0',
            httpx.get(server.metrics_url).text,
            re.M,
        )
        reply = load(server, "cold")
        assert reply.status_code == 400
        assert "failed to run warmup sample 'zeros'" in reply.json()["error"]
        entry = index(server)[("cold", "1")]
        assert entry["state"] == "UNAVAILABLE"
        assert entry["reason"].startswith(
            "failed to run warmup sample 'zeros': cannot read input_data_file 'ones.bin'"
        )
        # strict readiness: a model that failed to load makes the server not ready
        assert httpx.get(server.base + "/v2/health/ready").status_code == 400
        assert unload(server, "cold").status_code == 200
        assert httpx.get(server.base + "/v2/health/ready").status_code == 200


def test_duplicates_across_repositories_and_non_strict_readiness(
    repo: Path, tmp_path: Path
) -> None:
    second = tmp_path / "second"
    build_simple(second, name="other")  # also in the first repository
    build_simple(second, name="only_here")
    args = [
        *EXPLICIT,
        "--model-repository",
        str(second),
        "--load-model",
        "only_here",
        "--strict-readiness",
        "false",
    ]
    with running_server([repo], args, log_dir=tmp_path) as server:
        reply = load(server, "other")
        assert reply.status_code == 400
        assert reply.json()["error"] == (
            "load failed for model 'other': model appears in two or more repositories"
        )
        assert index(server)[("other", "")] == {
            "name": "other",
            "state": "UNAVAILABLE",
            "reason": "model appears in two or more repositories",
        }
        assert offset(server, "only_here") == 0
        assert httpx.get(server.base + "/v2/health/ready").status_code == 200  # not strict
