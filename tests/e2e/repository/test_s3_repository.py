"""Model repositories in S3, against moto's S3 server on 127.0.0.1 and the real tritonclient.

The server mirrors `s3://127.0.0.1:PORT/bucket/prefix` into its cache folder and serves it as
from disk; these tests change the bucket and wait (bounded loops on what the server reports)
for the index and the answers to follow. The `simple` model's answers carry its version's
offset (OUTPUT0 = INPUT0 + INPUT1 + offset), so an answer says which version served it.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from examples.build_repository import simple_config
from examples.variants import model_bytes
from harness.procutil import wait_for
from harness.serverproc import free_port, running_server, start_server
from tests.support.s3 import S3Endpoint, moto_subprocess

pytestmark = pytest.mark.e2e

BUCKET = "models"
PREFIX = "team/repo"
# Poll mode with a settle time no test waits out: a version loads once its `.ready` marker
# (uploaded last) says it is complete, or never.
POLL = ["--model-control-mode", "poll", "--repository-poll-secs", "0.2"]
PATIENT = ["--repository-settle-secs", "3600"]


@pytest.fixture
def s3(tmp_path: Path):
    with moto_subprocess(tmp_path) as endpoint:
        endpoint.client().create_bucket(Bucket=BUCKET)
        yield endpoint


def put(s3: S3Endpoint, key: str, body: bytes | str) -> None:
    data = body.encode() if isinstance(body, str) else body
    s3.client().put_object(Bucket=BUCKET, Key=f"{PREFIX}/{key}", Body=data)


def delete(s3: S3Endpoint, *keys: str) -> None:
    """In one request, so that no poll sees some of them gone and not the others."""
    objects = [{"Key": f"{PREFIX}/{key}"} for key in keys]
    s3.client().delete_objects(Bucket=BUCKET, Delete={"Objects": objects})


def upload_model(s3: S3Endpoint, name: str, version: int, offset: int, *, ready: bool) -> None:
    put(s3, f"{name}/config.pbtxt", simple_config(name, 8))
    if ready:
        put(s3, f"{name}/.ready", "")
    put(s3, f"{name}/{version}/model.onnx", model_bytes(offset))
    if ready:
        put(s3, f"{name}/{version}/.ready", "")


def offset_of(url: str, model: str = "simple") -> int:
    """One request through tritonclient's HTTP client: the offset of the version that answered."""
    client = httpclient.InferenceServerClient(url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    out = client.infer(model, inputs).as_numpy("OUTPUT0")
    return int(out[0, 0] - 1)


def index(base: str) -> list[dict]:
    return httpx.post(base + "/v2/repository/index", timeout=10).json()


def states(base: str, name: str) -> dict[str, str]:
    return {e.get("version", ""): e.get("state", "") for e in index(base) if e["name"] == name}


def test_a_model_in_s3_serves_beside_a_local_one_and_no_secret_is_shown(
    s3: S3Endpoint, tmp_path: Path
) -> None:
    upload_model(s3, "simple", 1, offset=7, ready=False)
    local = tmp_path / "local"
    (local / "nearby" / "1").mkdir(parents=True)
    (local / "nearby" / "config.pbtxt").write_text(simple_config("nearby", 8))
    (local / "nearby" / "1" / "model.onnx").write_bytes(model_bytes(3))
    cache = tmp_path / "cache"
    args = ["--object-store-cache-dir", str(cache), "--log-verbose", "2"]
    with running_server(
        [s3.repository(BUCKET, PREFIX), local], args, env=s3.env(), log_dir=tmp_path
    ) as server:
        assert offset_of(server.http_url) == 7
        assert offset_of(server.http_url, "nearby") == 3
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.is_model_ready("simple", "1")
        entries = index(server.base)
        assert sorted(e["name"] for e in entries) == ["nearby", "simple"]
        assert s3.secret not in str(entries) and s3.token not in str(entries)
        assert any(cache.iterdir())  # the mirror, while serving
        log = server.log()
    assert s3.secret not in log and s3.token not in log
    assert s3.secret not in server.log() and s3.token not in server.log()
    assert list(cache.iterdir()) == []  # the mirror is gone with the server


def test_poll_mode_follows_new_and_removed_versions_and_models(
    s3: S3Endpoint, tmp_path: Path
) -> None:
    upload_model(s3, "simple", 1, offset=0, ready=True)
    with running_server(
        [s3.repository(BUCKET, PREFIX)], POLL + PATIENT, env=s3.env(), log_dir=tmp_path
    ) as server:
        assert offset_of(server.http_url) == 0
        put(s3, "simple/2/model.onnx", model_bytes(100))
        put(s3, "simple/2/.ready", "")
        wait_for(lambda: states(server.base, "simple").get("2") == "READY", "version 2 to load")
        assert offset_of(server.http_url) == 100
        delete(s3, "simple/2/model.onnx", "simple/2/.ready")
        wait_for(lambda: states(server.base, "simple").get("2") != "READY", "version 2 to go")
        assert offset_of(server.http_url) == 0  # version 1 is the latest again
        delete(s3, "simple/1/model.onnx", "simple/1/.ready", "simple/config.pbtxt", "simple/.ready")
        wait_for(lambda: states(server.base, "simple").get("1") != "READY", "the model to unload")
        reply = httpx.post(server.base + "/v2/models/simple/infer", json={"inputs": []})
        assert reply.status_code >= 400 and "error" in reply.json()
        upload_model(s3, "other", 1, offset=5, ready=True)  # a model new to the bucket
        wait_for(lambda: states(server.base, "other").get("1") == "READY", "the new model")
        assert offset_of(server.http_url, "other") == 5


def test_a_version_still_uploading_is_not_loaded_until_it_is_marked_complete(
    s3: S3Endpoint, tmp_path: Path
) -> None:
    upload_model(s3, "simple", 1, offset=0, ready=True)
    cache = tmp_path / "cache"
    args = POLL + PATIENT + ["--object-store-cache-dir", str(cache)]
    with running_server(
        [s3.repository(BUCKET, PREFIX)], args, env=s3.env(), log_dir=tmp_path
    ) as server:
        # Version 2 has begun: a file is there, its model file is not.
        put(s3, "simple/2/notes.txt", "upload in progress")
        wait_for(
            lambda: any(cache.glob("*/simple/2/notes.txt")), "the partial version in the mirror"
        )
        # A model uploaded after it loads (two polls at least): version 2 was seen meanwhile.
        upload_model(s3, "later", 1, offset=9, ready=True)
        wait_for(lambda: states(server.base, "later").get("1") == "READY", "the later model")
        assert states(server.base, "simple") == {"1": "READY"}
        assert offset_of(server.http_url) == 0
        put(s3, "simple/2/model.onnx", model_bytes(200))
        put(s3, "simple/2/.ready", "")
        wait_for(lambda: states(server.base, "simple").get("2") == "READY", "version 2 to load")
        assert offset_of(server.http_url) == 200
        assert s3.secret not in server.log()


def test_explicit_mode_loads_what_was_uploaded_since_startup(
    s3: S3Endpoint, tmp_path: Path
) -> None:
    upload_model(s3, "simple", 1, offset=0, ready=False)
    args = ["--model-control-mode", "explicit", "--load-model", "simple"]
    with running_server(
        [s3.repository(BUCKET, PREFIX)], args, env=s3.env(), log_dir=tmp_path
    ) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert offset_of(server.http_url) == 0
        put(s3, "simple/2/model.onnx", model_bytes(50))
        upload_model(s3, "fresh", 1, offset=4, ready=False)
        assert states(server.base, "simple") == {"1": "READY"}  # nothing happens by itself
        client.load_model("simple")
        assert offset_of(server.http_url) == 50
        client.load_model("fresh")  # not in the bucket at startup
        assert offset_of(server.http_url, "fresh") == 4
        delete(s3, "simple/2/model.onnx")
        client.load_model("simple")
        assert offset_of(server.http_url) == 0
        assert s3.secret not in server.log()


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("gs://bucket/models", "Google Cloud Storage repositories (gs://) are not supported"),
        ("as://account/container", "Azure Storage repositories (as://) are not supported"),
        ("s3://key:hunter22@127.0.0.1:9/b/p", "credentials, queries and fragments"),
        ("s3://127.0.0.1:99999/bucket", "port 99999 is out of range"),
    ],
)
def test_a_bad_repository_url_stops_the_server_with_a_message(
    url: str, words: str, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeError) as failed:
        start_server([url], log_dir=tmp_path, timeout=30)
    text = str(failed.value)
    assert words in text
    assert "hunter22" not in text and "Traceback" not in text


def test_a_missing_bucket_or_unreachable_endpoint_stops_the_server_with_a_message(
    s3: S3Endpoint, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeError) as failed:
        start_server([s3.repository("no-such-bucket")], env=s3.env(), log_dir=tmp_path)
    assert "bucket 'no-such-bucket' does not exist" in str(failed.value)
    assert "Traceback" not in str(failed.value) and s3.secret not in str(failed.value)
    # --exit-on-error=false: up, answering metadata, but not live, as for a missing directory.
    with running_server(
        [s3.repository("no-such-bucket")],
        ["--exit-on-error=false"],
        env=s3.env(),
        wait_ready="/v2",
        log_dir=tmp_path,
    ) as server:
        assert httpx.get(server.base + "/v2/health/live", timeout=5).status_code != 200
    closed = f"s3://127.0.0.1:{free_port()}/models"
    args = ["--object-store-timeout-secs", "2"]
    with pytest.raises(RuntimeError) as failed:
        start_server([closed], args, env=s3.env(), log_dir=tmp_path)
    assert "cannot reach http://127.0.0.1:" in str(failed.value)
    assert "Traceback" not in str(failed.value)
