"""Lifecycle behaviour NVIDIA's qa suites (L0_lifecycle, L0_model_queue) check, against server
subprocesses: readiness without models, a repository that does not exist, ensembles unloaded
and reloaded with the models they use, Triton's load texts and log line, and one repository
given twice."""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from examples.build_repository import build_simple
from harness.procutil import wait_for
from harness.serverproc import running_server, start_server

pytestmark = pytest.mark.e2e
EXPLICIT = ["--model-control-mode", "explicit"]


def write_ensemble(
    repo: Path,
    name: str,
    member: str,
    inputs: dict[str, str] | None = None,
    outputs: dict[str, str] | None = None,
    datatype: str = "TYPE_INT32",
    dims: int = 16,
    max_batch_size: int = 8,
) -> None:
    """An ensemble of one step that runs `member`: `inputs` maps the ensemble's input names to
    the member's, `outputs` the member's output names to the ensemble's (by default the
    `simple` add/sub's INPUT0 and INPUT1, and its OUTPUT0 as SUM)."""
    inputs = inputs or {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}
    outputs = outputs or {"OUTPUT0": "SUM"}

    def tensors(names: Collection[str]) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: {datatype} dims: [ {dims} ] }}' for n in names)

    maps = "".join(
        f' input_map {{ key: "{inner}" value: "{outer}" }}' for outer, inner in inputs.items()
    )
    maps += "".join(
        f' output_map {{ key: "{inner}" value: "{outer}" }}' for inner, outer in outputs.items()
    )
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {tensors(inputs)} ]\noutput [ {tensors(outputs.values())} ]\n"
        f'ensemble_scheduling {{ step [ {{ model_name: "{member}" model_version: -1{maps} }} ] }}\n'
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    build_simple(root)
    write_ensemble(root, "ens", "simple")
    return root


def _ready(url: str, name: str) -> tuple[bool, bool]:
    """(HTTP, gRPC) model readiness of version 1, as qa asks it."""
    with (
        httpclient.InferenceServerClient(url[0]) as http,
        grpcclient.InferenceServerClient(url[1]) as grpc,
    ):
        return http.is_model_ready(name, "1"), grpc.is_model_ready(name, "1")


def test_non_strict_readiness_is_ready_with_no_model_loaded(repo: Path, tmp_path: Path) -> None:
    with running_server(
        [repo], [*EXPLICIT, "--strict-readiness", "false"], log_dir=tmp_path
    ) as server:
        with httpclient.InferenceServerClient(server.http_url) as client:
            assert client.is_server_live() and client.is_server_ready()
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            assert client.is_server_live() and client.is_server_ready()
    with running_server([repo], EXPLICIT, log_dir=tmp_path, wait_ready=False) as server:
        # Strict (the default) stays stricter than Triton: never ready with zero models.
        assert httpx.get(server.base + "/v2/health/ready").status_code == 400
        assert httpx.get(server.base + "/v2/health/live").status_code == 200


def test_a_repository_that_does_not_exist(repo: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with running_server(
        [repo, missing], ["--exit-on-error", "false"], log_dir=tmp_path, wait_ready="/v2"
    ) as server:  # up, answering metadata
        assert httpx.get(server.base + "/v2/health/live").status_code == 400
        assert httpx.get(server.base + "/v2/health/ready").status_code == 400
        assert httpx.get(server.base + "/v2").json()["name"] == "ascend-serve"
        assert f"model repository '{missing}' does not exist" in server.log()
    server = None
    with pytest.raises(RuntimeError, match="server exited with 1"):
        server = start_server([repo, missing], log_dir=tmp_path, timeout=30)
    assert server is None


def test_unloading_a_model_takes_its_ensembles_along_and_loading_it_brings_them_back(
    repo: Path, tmp_path: Path
) -> None:
    with running_server(
        [repo], [*EXPLICIT, "--strict-readiness", "false"], log_dir=tmp_path
    ) as server:
        urls = (server.http_url, server.grpc_url)
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.load_model("ens")  # loads `simple` too
            assert _ready(urls, "ens") == (True, True) and _ready(urls, "simple") == (True, True)
            client.unload_model("simple")
            assert _ready(urls, "simple") == (False, False)
            assert _ready(urls, "ens") == (False, False)  # it cannot run without `simple`
            client.load_model("simple")
            assert _ready(urls, "ens") == (True, True)  # loaded again with it
            # An ensemble unloaded by request stays unloaded when its member comes back.
            client.unload_model("ens")
            client.unload_model("simple")
            client.load_model("simple")
            assert _ready(urls, "simple") == (True, True)
            assert _ready(urls, "ens") == (False, False)
        assert "unloading ensemble 'ens': it uses 'simple'" in server.log()


def test_load_texts_and_log_lines_are_tritons(repo: Path, tmp_path: Path) -> None:
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not a model")
    with running_server(
        [repo], [*EXPLICIT, "--strict-readiness", "false"], log_dir=tmp_path
    ) as server:
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.load_model("simple")
            client.load_model("simple")
            for _ in range(2):
                with pytest.raises(InferenceServerException) as info:
                    client.load_model("broken")
                assert "load failed for model 'broken'" in info.value.message()
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            with pytest.raises(InferenceServerException) as info:
                client.load_model("broken")
            assert "load failed for model 'broken'" in info.value.message()
        assert server.log().count("successfully loaded 'simple'") == 2


def test_one_repository_given_twice_counts_once(repo: Path, tmp_path: Path) -> None:
    twice = [repo, repo / ".." / repo.name]
    with running_server(twice, log_dir=tmp_path) as server:
        with httpclient.InferenceServerClient(server.http_url) as client:
            assert client.is_model_ready("simple") and client.is_model_ready("ens")
        assert "two or more repositories" not in server.log()


def test_an_ensemble_counts_a_member_refusal_as_triton_does(tmp_path: Path) -> None:
    """L0_model_queue test_policy_reject: a request refused in a composing model's queue counts
    twice on the ensemble's failure metric, reason OTHER; once in its statistics."""
    import json
    import threading

    from harness.testmodels import write_queued_model

    root = write_queued_model(tmp_path / "repo", queue_delay_us=1_500_000)
    write_ensemble(
        root,
        "ens_q",
        "queued",
        {"IN": "INPUT"},
        {"OUTPUT": "OUT"},
        "TYPE_FP32",
        256,
        max_batch_size=64,
    )
    body = json.dumps(
        {"inputs": [{"name": "IN", "shape": [1, 256], "datatype": "FP32", "data": [0.0] * 256}]}
    )
    with running_server([root], log_dir=tmp_path) as server:
        replies: list = []

        def send() -> None:
            replies.append(
                httpx.post(server.base + "/v2/models/ens_q/infer", content=body, timeout=30)
            )

        threads = [threading.Thread(target=send) for _ in range(2)]
        for thread in threads:  # the queue holds one, which waits 1.5 s: the other is refused
            thread.start()
        for thread in threads:
            thread.join()
        codes = sorted(reply.status_code for reply in replies)
        assert codes == [200, 503], [reply.text for reply in replies]
        assert "Exceeds maximum queue size" in [r for r in replies if r.status_code == 503][0].text
        text = httpx.get(server.metrics_url).text

        def failures(model: str, reason: str) -> float:
            for line in text.splitlines():
                if (
                    line.startswith("nv_inference_request_failure{")
                    and f'model="{model}"' in line
                    and f'reason="{reason}"' in line
                ):
                    return float(line.rsplit(" ", 1)[1])
            return -1.0

        assert failures("ens_q", "OTHER") == 2 and failures("ens_q", "BACKEND") == 0
        assert failures("queued", "REJECTED") == 1
        stats = httpx.get(server.base + "/v2/models/ens_q/stats").json()["model_stats"][0]
        assert int(stats["inference_stats"]["fail"]["count"]) == 1


def test_the_delay_scheduler_hook_holds_the_first_batch_until_n_are_queued(tmp_path: Path) -> None:
    """TRITONSERVER_DELAY_SCHEDULER=4 (read at startup): four requests sent one after another to
    a batching model with no queue delay run as one batch of four, as in Triton."""
    import concurrent.futures

    import numpy as np

    root = tmp_path / "repo"
    build_simple(root)
    config = (root / "simple" / "config.pbtxt").read_text()
    (root / "simple" / "config.pbtxt").write_text(config + "\ndynamic_batching { }\n")
    with running_server(
        [root], log_dir=tmp_path, env={"TRITONSERVER_DELAY_SCHEDULER": "4"}
    ) as server:

        def infer(index: int) -> np.ndarray:
            with httpclient.InferenceServerClient(server.http_url) as client:
                inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
                for tensor in inputs:
                    tensor.set_data_from_numpy(np.full((1, 16), index, dtype=np.int32))
                return client.infer("simple", inputs).as_numpy("OUTPUT0")

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(infer, range(4)))
        for index, result in enumerate(results):
            assert (result == 2 * index).all()
        stats = httpx.get(server.base + "/v2/models/simple/stats").json()["model_stats"][0]
        assert stats["execution_count"] == 1 and stats["inference_count"] == 4
        assert [b["batch_size"] for b in stats["batch_stats"]] == [4]
        assert "TRITONSERVER_DELAY_SCHEDULER=4" in server.log()


def test_id_names_the_server_and_ready_with_no_models_is_tritons_readiness(
    repo: Path, tmp_path: Path
) -> None:
    """--id is the metadata name (ours by default); --ready-with-no-models makes strict
    readiness ready while nothing is loaded, as Triton's is, and still not ready once a model
    has failed."""
    with running_server(
        [repo], [*EXPLICIT, "--id", "triton", "--ready-with-no-models"], log_dir=tmp_path
    ) as server:
        assert httpx.get(server.base + "/v2").json()["name"] == "triton"
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            assert client.get_server_metadata().name == "triton"
            assert client.is_server_ready()
    (repo / "simple" / "1" / "model.onnx").write_bytes(b"not a model")
    with running_server(
        [repo],
        ["--ready-with-no-models", "--exit-on-error", "false"],
        log_dir=tmp_path,
        wait_ready=False,
    ) as server:
        wait_for(lambda: "load failed for model 'simple'" in server.log(), "the load failure")
        assert httpx.get(server.base + "/v2/health/ready").status_code == 400


@pytest.mark.parametrize(
    "service, flag",
    [("HTTP", "--http-port"), ("GRPC", "--grpc-port"), ("Metrics", "--metrics-port")],
)
def test_a_port_in_use_stops_the_start_with_tritons_words(
    repo: Path, tmp_path: Path, service: str, flag: str
) -> None:
    import subprocess
    import sys

    from harness.serverproc import ROOT, free_port

    with running_server([repo], log_dir=tmp_path) as first:
        taken = {
            "--http-port": first.http_port,
            "--grpc-port": first.grpc_port,
            "--metrics-port": first.metrics_port,
        }[flag]
        ports = {
            name: str(free_port()) for name in ("--http-port", "--grpc-port", "--metrics-port")
        }
        ports[flag] = str(taken)
        command = [
            sys.executable,
            "-m",
            "server",
            "--model-repository",
            str(repo),
            "--http-address",
            "127.0.0.1",
            "--grpc-address",
            "127.0.0.1",
            "--metrics-address",
            "127.0.0.1",
            *[a for p in ports.items() for a in p],
        ]
        second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        assert (
            f"failed to start {service} service: Unavailable - "
            f"Socket '127.0.0.1:{taken}' already in use"
        ) in second.stderr
        assert httpx.get(first.base + "/v2/health/ready").status_code == 200  # untouched


def test_a_load_request_reloads_only_what_changed_on_disk(tmp_path: Path) -> None:
    """As Triton: unchanged versions keep serving, a touched version is rebuilt, a model-level
    file other than the config rebuilds all, a version-policy change only adds and removes,
    and a request that changes nothing keeps a config an earlier request supplied."""
    import os
    import shutil
    import time

    repo = tmp_path / "repo"
    model = build_simple(repo)
    shutil.copytree(model / "1", model / "2")
    config = model / "config.pbtxt"
    config.write_text(config.read_text() + "\nversion_policy: { specific: { versions: [1] } }\n")
    with running_server([repo], [*EXPLICIT, "--load-model", "simple"], log_dir=tmp_path) as server:

        def loads(version: int) -> int:
            return server.log().count(f"loaded 'simple' version {version} in")

        def settle() -> None:  # a later mtime than the last load saw, whatever the clock
            time.sleep(0.05)

        with httpclient.InferenceServerClient(server.http_url) as client:
            assert (loads(1), loads(2)) == (1, 0)
            config.write_text(config.read_text().replace("versions: [1]", "versions: [1, 2]"))
            client.load_model("simple")
            assert (loads(1), loads(2)) == (1, 1)  # 1 kept serving, 2 added
            settle()
            os.utime(model / "2" / "model.onnx")
            client.load_model("simple")
            assert (loads(1), loads(2)) == (1, 2)  # only the touched version
            (model / "helper.txt").write_text("a file every version may use")
            client.load_model("simple")
            assert (loads(1), loads(2)) == (2, 3)  # a model-level file: all of them
            client.load_model("simple")
            assert (loads(1), loads(2)) == (2, 3)  # nothing changed: nothing rebuilt
            client.load_model(
                "simple",
                config='{"backend": "onnxruntime", "version_policy": '
                '{"specific": {"versions": [2]}}}',
            )
            assert client.is_model_ready("simple", "2") and not client.is_model_ready("simple", "1")
            client.load_model("simple")  # no config, no change: the override stays
            assert client.is_model_ready("simple", "2") and not client.is_model_ready("simple", "1")
        assert server.log().count("successfully loaded 'simple'") == 7


RETRY_MODEL = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        marker = os.path.join(args["model_repository"], args["model_version"], "tried")
        if not os.path.exists(marker):
            open(marker, "x").close()
            raise Exception("failing the first load attempt")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
"""


@pytest.mark.parametrize("retries", [0, 1])
def test_model_load_retry_count_tries_a_failed_load_again(tmp_path: Path, retries: int) -> None:
    repo = tmp_path / "repo"
    (repo / "retry" / "1").mkdir(parents=True)
    (repo / "retry" / "1" / "model.py").write_text(RETRY_MODEL)
    (repo / "retry" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
    )
    if not retries:  # the first failure stops the start (--exit-on-error)
        with pytest.raises(RuntimeError, match="server exited with 1"):
            start_server([repo], log_dir=tmp_path, timeout=60)
        return
    with running_server(
        [repo], ["--model-load-retry-count", str(retries)], log_dir=tmp_path
    ) as server:
        with httpclient.InferenceServerClient(server.http_url) as client:
            assert client.is_model_ready("retry", "1")
        assert "failing the first load attempt" in server.log()
        assert "retrying (1 of 1)" in server.log()


def test_unloading_a_member_while_its_ensemble_loads_takes_the_ensemble_along(
    tmp_path: Path,
) -> None:
    """L0_lifecycle test_concurrent_model_load_unload: the unload waits for the ensemble's load
    to finish, then both are unloaded."""
    import threading

    repo = tmp_path / "repo"
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        'parameters [ { key: "creation_delay_sec" value: { string_value: "2" } } ]\n'
    )
    write_ensemble(repo, "ens", "slow", {"IN": "INPUT0"}, {"OUTPUT0": "OUT"})
    with running_server(
        [repo], [*EXPLICIT, "--strict-readiness", "false"], log_dir=tmp_path
    ) as server:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            loading = threading.Thread(target=client.load_model, args=("ens",))
            loading.start()
            time.sleep(1)  # the member is being created
            client.unload_model("slow")
            loading.join()
            assert not client.is_model_ready("slow") and not client.is_model_ready("ens")
