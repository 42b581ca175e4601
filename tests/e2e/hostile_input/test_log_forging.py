"""Issue 28 item 9: a client-chosen text never reaches the log or an error unescaped or
unbounded. A model name with a newline used to write a forged `successfully loaded 'simple'`
line into the server's log (which qa scripts count), and a 100 KiB name made errors too large
for gRPC's 8 KiB of metadata (a transport error instead of the server's status)."""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from urllib.parse import quote

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from examples.build_repository import build_simple
from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

FORGED_AT = "2031-02-03 04:05:06,789"
# A name that closes its quotes and starts a line of its own, word for word the server's.
FORGING = f"x'\n{FORGED_AT} INFO repository.manager: successfully loaded 'simple"
HUGE = "m" * (100 * 1024)
HUGE_WIDE = "\u00e9" * (100 * 1024)  # 2 bytes each in UTF-8, 6 once percent-encoded
# The longest names a URL carries: httptools refuses request lines past about 64 KiB (400).
LONG_PATH_NAMES = ["m" * 60_000, "\u00e9" * 10_000]
LOADED = "successfully loaded 'simple'"
ERROR_BYTES = 2048  # protocol/text.py MAX_ERROR_BYTES


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    build_simple(repo)
    with running_server(
        [repo], ["--model-control-mode", "explicit", "--load-model", "simple", "--log-verbose", "2"]
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _http(server: ServerProcess, method: str, path: str) -> tuple[int, dict]:
    """http.client, as httpx refuses URLs over 64 KiB."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request(method, path, body=b"{}" if method == "POST" else None)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def _http_load(server: ServerProcess, name: str) -> tuple[int, dict]:
    return _http(server, "POST", f"/v2/repository/models/{quote(name, safe='')}/load")


def _assert_no_forged_line(server: ServerProcess) -> None:
    log = server.log()
    assert log.count(LOADED) == 1, [line for line in log.splitlines() if LOADED in line]
    assert not any(line.startswith(FORGED_AT) for line in log.splitlines())


def test_a_newline_in_a_loaded_name_is_escaped_in_the_answer_and_the_log(
    server: ServerProcess,
) -> None:
    status, reply = _http_load(server, "sim\nple")
    assert status == 400, reply
    error = reply["error"]
    assert error == "failed to load 'sim\\nple', failed to poll from model repository"
    log = server.log()
    assert "failed to poll model 'sim\\nple': model not found" in log
    assert not re.search(r"^ple", log, re.M)


def test_a_name_that_forges_the_loaded_line_writes_no_such_line(server: ServerProcess) -> None:
    status, reply = _http_load(server, FORGING)
    assert status == 400, reply
    assert "\n" not in reply["error"]
    status, reply = _http(server, "POST", f"/v2/repository/models/{quote(FORGING, safe='')}/unload")
    assert status == 200, reply
    _assert_no_forged_line(server)


def test_a_100_kib_name_in_a_url_is_refused_before_it_is_parsed(server: ServerProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", f"/v2/repository/models/{HUGE}/load", body=b"{}")
        response = conn.getresponse()
        assert response.status == 414  # --http-max-header-size: the name is never echoed
        assert len(response.read()) < 200
    finally:
        conn.close()
    assert server.alive()


@pytest.mark.parametrize("name", LONG_PATH_NAMES, ids=["ascii", "two-byte"])
def test_a_long_name_gets_a_bounded_answer_over_http(server: ServerProcess, name: str) -> None:
    for status, reply in (
        _http_load(server, name),
        _http(server, "GET", f"/v2/models/{quote(name, safe='')}"),
    ):
        assert 400 <= status < 500, str(reply)[:200]
        error = reply["error"]
        assert len(error.encode()) <= ERROR_BYTES, len(error)
        assert "more characters)" in error  # says it was cut
    assert server.alive()


@pytest.mark.parametrize("name", ["sim\nple", FORGING, HUGE, HUGE_WIDE])
def test_grpc_answers_fit_the_metadata_limit(
    server: ServerProcess, stub: service_pb2_grpc.GRPCInferenceServiceStub, name: str
) -> None:
    calls = [
        (
            lambda: stub.RepositoryModelLoad(
                service_pb2.RepositoryModelLoadRequest(model_name=name), timeout=30
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            lambda: stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=name), timeout=30),
            grpc.StatusCode.NOT_FOUND,
        ),
        (
            lambda: stub.ModelInfer(service_pb2.ModelInferRequest(model_name=name), timeout=30),
            grpc.StatusCode.NOT_FOUND,
        ),
    ]
    for call, code in calls:
        with pytest.raises(grpc.RpcError) as caught:
            call()
        details = caught.value.details() or ""
        assert caught.value.code() == code, (caught.value.code(), details[:200])
        assert "\n" not in details
        assert len(details.encode()) <= ERROR_BYTES
    stub.RepositoryModelUnload(
        service_pb2.RepositoryModelUnloadRequest(model_name=name), timeout=30
    )
    _assert_no_forged_line(server)


def test_an_error_quoting_a_huge_input_name_is_cut_too(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    """An input name (and the request id) quoted by the scheduler's validation is cut too."""
    request = service_pb2.ModelInferRequest(model_name="simple", id="r\n" * 50_000)
    for _ in range(2):
        tensor = request.inputs.add(name=HUGE + "\n", datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(range(16))
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=30)
    details = caught.value.details() or ""
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details[:200]
    assert "\n" not in details and len(details.encode()) <= ERROR_BYTES
    assert details.startswith("[request id: r\\nr\\n") and "more characters)" in details
