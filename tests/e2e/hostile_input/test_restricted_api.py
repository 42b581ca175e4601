"""--http-restricted-api and --grpc-restricted-protocol: Triton's syntax, codes and texts, every
path alias of a category, and startup refusals of a bad specification."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness.serverproc import ROOT, ServerProcess, running_server

pytestmark = pytest.mark.e2e

REPO_TEXT = "This API is restricted, expecting header 'admin-key'"
GRPC_TEXT = "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"


@pytest.fixture(scope="module", params=["aio", "threads"])
def restricted_server(
    request: pytest.FixtureRequest,
    example_repository: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """Both gRPC servers (--grpc-server): each has its own interceptor."""
    args = [
        "--grpc-server",
        request.param,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--http-restricted-api",
        "model-repository,shared-memory,trace,logging:admin-key=s3cret",
        "--http-restricted-api",
        "inference:infer-key=go",
        "--grpc-restricted-protocol",
        "model-repository,shared-memory:admin-key=s3cret",
        "--grpc-restricted-protocol",
        "inference:infer-key=go",
    ]
    with running_server(
        [example_repository], args, log_dir=tmp_path_factory.mktemp("logs")
    ) as server:
        yield server


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/v2/repository/index"),
        ("GET", "/v2/repository/index"),  # a GET on a restricted POST route: 403, not 405
        ("POST", "/v2/repository/models/simple/load"),
        ("POST", "/v2/repository/models/simple/unload"),
        ("POST", "/v2/repository/other/index"),
        ("GET", "/v2/systemsharedmemory/status"),
        ("POST", "/v2/systemsharedmemory/region/r/register"),
        ("GET", "/v2/cudasharedmemory/region/r/status"),
        ("GET", "/v2/trace/setting"),
        ("POST", "/v2/models/simple/trace/setting"),
        ("GET", "/v2/logging"),
        ("PUT", "/v2/models/simple/traffic"),  # gray release goes with model-repository
    ],
)
def test_http_restricted_paths_answer_403(restricted_server, method: str, path: str) -> None:
    answer = httpx.request(method, restricted_server.base + path, timeout=10)
    assert (answer.status_code, answer.json()) == (403, {"error": REPO_TEXT})
    wrong = httpx.request(
        method, restricted_server.base + path, timeout=10, headers={"admin-key": "guess"}
    )
    assert wrong.status_code == 403


def test_http_header_name_is_case_insensitive_and_open_apis_stay_open(restricted_server) -> None:
    base = restricted_server.base
    ok = httpx.post(base + "/v2/repository/index", headers={"Admin-Key": "s3cret"}, timeout=10)
    assert ok.status_code == 200 and any(m["name"] == "simple" for m in ok.json())
    assert httpx.get(base + "/v2/logging", headers={"ADMIN-KEY": "s3cret"}).status_code == 200
    for path in (
        "/v2/health/ready",
        "/v2",
        "/v2/models/simple",
        "/v2/models/simple/config",
        "/v2/models/stats",
        "/v2/models/simple/versions/1/ready",
    ):
        assert httpx.get(base + path, timeout=10).status_code == 200, path


def test_http_inference_needs_its_own_key(restricted_server) -> None:
    client = httpclient.InferenceServerClient(restricted_server.http_url)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    for path in ("simple", "simple/versions/1"):
        answer = httpx.post(f"{restricted_server.base}/v2/models/{path}/infer", json={}, timeout=10)
        assert (answer.status_code, answer.json()) == (
            403,
            {"error": "This API is restricted, expecting header 'infer-key'"},
        )
    with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
        client.infer("simple", inputs)
    result = client.infer("simple", inputs, headers={"infer-key": "go"})
    assert result.as_numpy("OUTPUT0").tolist() == [[2] * 16]
    # the admin key does not open inference
    with pytest.raises(InferenceServerException):
        client.infer("simple", inputs, headers={"admin-key": "s3cret"})


def test_grpc_restricted_protocols(restricted_server) -> None:
    client = grpcclient.InferenceServerClient(restricted_server.grpc_url)
    for call in (
        lambda h: client.get_model_repository_index(headers=h),
        lambda h: client.get_system_shared_memory_status(headers=h),
        lambda h: client.unregister_cuda_shared_memory(headers=h),
    ):
        with pytest.raises(InferenceServerException) as error:
            call(None)
        assert error.value.status() == "StatusCode.UNAVAILABLE"
        assert error.value.message() == GRPC_TEXT
        call({"triton-grpc-protocol-admin-key": "s3cret"})
    assert client.is_server_ready() and client.get_model_metadata("simple").name == "simple"
    assert client.get_trace_settings() is not None  # trace is restricted over HTTP only here
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
    with pytest.raises(InferenceServerException, match="triton-grpc-protocol-infer-key"):
        client.infer("simple", inputs)
    result = client.infer("simple", inputs, headers={"triton-grpc-protocol-infer-key": "go"})
    assert result.as_numpy("OUTPUT1").tolist() == [[0] * 16]
    # a stream is refused as a whole
    errors: list = []
    client.start_stream(callback=lambda result, error: errors.append(error))
    try:
        client.async_stream_infer("simple", inputs)
    except InferenceServerException:
        pass  # the stream may already be closed by the refusal
    client.stop_stream()
    assert errors and "triton-grpc-protocol-infer-key" in str(errors[0])


@pytest.mark.parametrize(
    "args, text",
    [
        (["--http-restricted-api", "bogus:k=v"], "unknown API 'bogus'"),
        (
            ["--http-restricted-api", "health:k=v", "--http-restricted-api", "health,logging:j=w"],
            "'health' is named in more than one group",
        ),
        (["--grpc-restricted-protocol", "inference"], "expected '<api>[,<api>...]:<key>=<value>'"),
    ],
)
def test_bad_specifications_refuse_to_start(
    example_repository: Path, args: list, text: str
) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "server", "--model-repository", str(example_repository), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(ROOT),
    )
    assert run.returncode == 2 and text in run.stderr, run.stderr
