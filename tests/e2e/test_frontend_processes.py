"""--frontend-processes: several processes accept on the same ports and hand requests to the one
that owns the models, against a real server subprocess with tritonclient and httpx.

What a user notices: answers are right whichever process took the connection (small tensors,
large ones through shared memory, ones too large for it), every control API answers the same,
statistics and metrics are one set, a killed frontend process comes back, and nothing is left
running after the server stops."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from testmodels import (
    SLEEPER_MODEL,
    sleeper_config,
    write_python_model,
    write_queued_model,
)

from harness import procutil
from harness.models import build_identity_fp32
from harness.procutil import (
    connection_owners,
    connection_peers,
    gone,
    kill_quietly,
    wait_for,
    wait_gone,
)
from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e
CONNECTIONS = 12  # enough that the kernel gives every process some


def frontend_children(server: ServerProcess) -> list[int]:
    return procutil.frontend_children(server.pid)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from examples.build_repository import build_repository

    root = tmp_path_factory.mktemp("frontends")
    build_repository(root)
    build_identity_fp32(root)
    write_python_model(root, "napper", SLEEPER_MODEL, sleeper_config("napper"))
    write_queued_model(root, queue_delay_us=1_500_000)  # `queued`: waits 1.5 s for a batch
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # A small shared-memory arena, so that one test's tensor does not fit in it.
    with running_server(
        [repo],
        ["--frontend-processes", "3", "--frontend-shm-bytes", str(1 << 20)],
        log_dir=tmp_path_factory.mktemp("frontends-log"),
    ) as process:
        wait_for(lambda: len(frontend_children(process)) == 2, "two frontend processes")
        yield process


def _simple_inputs(module, a: np.ndarray, b: np.ndarray) -> list:
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_every_process_takes_connections_and_every_answer_is_right(server) -> None:
    clients = [httpclient.InferenceServerClient(server.http_url) for _ in range(CONNECTIONS)]
    grpc_clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(CONNECTIONS)]
    try:
        for index, (client, grpc_client) in enumerate(zip(clients, grpc_clients, strict=False)):
            a = np.arange(16, dtype=np.int32).reshape(1, 16) + index
            b = np.full((1, 16), index, dtype=np.int32)
            result = client.infer("simple", _simple_inputs(httpclient, a, b))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            result = grpc_client.infer("simple", _simple_inputs(grpcclient, a, b))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        owners = connection_owners(server.http_port)
        children = frontend_children(server)
        assert len(children) == 2
        served_by_children = sum(owners.get(pid, 0) for pid in children)
        assert served_by_children > 0, owners  # the frontend processes took some of them
        assert served_by_children < CONNECTIONS or owners.get(server.pid, 0) == 0
    finally:
        for client in clients:
            client.close()
        for grpc_client in grpc_clients:
            grpc_client.close()


@pytest.mark.parametrize("rows", [4, 300, 1200])  # inline, shared memory, past the 1 MiB arena
def test_tensors_of_every_size_round_trip_exactly(server, rows: int) -> None:
    data = np.random.default_rng(rows).random((rows, 256)).astype(np.float32)
    for _ in range(CONNECTIONS // 2):
        with httpclient.InferenceServerClient(server.http_url) as client:
            tensor = httpclient.InferInput("INPUT", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            result = client.infer("identity_fp32", [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT"), data)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(
            client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT"), data
        )


def test_control_apis_and_errors_answer_the_same_through_every_process(server) -> None:
    answers = set()
    for _ in range(CONNECTIONS):
        with httpx.Client(base_url=server.base) as client:
            ready = client.get("/v2/health/ready").status_code
            metadata = client.get("/v2/models/simple").json()
            config = client.get("/v2/models/simple/config").json()
            missing = client.get("/v2/models/nope")
            index = client.post("/v2/repository/index", json={}).json()
            bad = client.post(
                "/v2/models/simple/infer",
                json={
                    "inputs": [
                        {"name": "INPUT0", "shape": [1, 15], "datatype": "INT32", "data": [0] * 15}
                    ]
                },
            )
            raw = client.post(
                "/v2/models/identity_fp32/infer",
                content=b"\0" * 8,
                headers={"Inference-Header-Content-Length": "0"},
            )
            answers.add(
                (
                    ready,
                    metadata["name"],
                    tuple(metadata["versions"]),
                    config["name"],
                    config["max_batch_size"],
                    missing.status_code,
                    missing.text,
                    len(index),
                    bad.status_code,
                    bad.json()["error"],
                    raw.status_code,
                )
            )
    assert len(answers) == 1, answers
    (answer,) = answers
    assert answer[0] == 200 and answer[1] == "simple" and answer[3] == "simple"
    assert answer[5] == 404 and "nope" in answer[6]
    assert answer[8] == 400 and "INPUT0" in answer[9]
    assert answer[10] == 400  # a raw body for a model with an input of two -1 dims
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_ready()
        assert client.get_model_config("simple").config.name == "simple"


def test_statistics_and_metrics_are_one_set(server) -> None:
    def count() -> int:
        stats = httpx.get(f"{server.base}/v2/models/simple/stats").json()
        return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])

    def metric() -> float:
        text = httpx.get(server.metrics_url).text
        for line in text.splitlines():
            if line.startswith("nv_inference_request_success{") and 'model="simple"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before, before_metric = count(), metric()
    for _ in range(CONNECTIONS):
        with httpclient.InferenceServerClient(server.http_url) as client:
            a = np.zeros((1, 16), dtype=np.int32)
            client.infer("simple", _simple_inputs(httpclient, a, a))
    assert count() == before + CONNECTIONS  # every process's requests, in one set
    wait_for(lambda: metric() >= before_metric + CONNECTIONS, "the success counter")
    assert metric() == before_metric + CONNECTIONS


def _connection_on_a_frontend_process(server: ServerProcess) -> socket.socket:
    children = set(frontend_children(server))
    for _ in range(50):
        sock = socket.create_connection(("127.0.0.1", server.http_port))
        time.sleep(0.05)
        if connection_peers(server.http_port).get(sock.getsockname()[1]) in children:
            return sock
        sock.close()
    raise AssertionError("no connection landed on a frontend process")


def test_a_client_that_disconnects_cancels_its_request_in_the_owner(server) -> None:
    body = json.dumps(
        {"inputs": [{"name": "INPUT", "shape": [1, 256], "datatype": "FP32", "data": [0.0] * 256}]}
    ).encode()
    sock = _connection_on_a_frontend_process(server)
    sock.sendall(
        b"POST /v2/models/queued/infer HTTP/1.1\r\nHost: x\r\nContent-Type: "
        b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    time.sleep(0.3)  # it waits in the owner's queue for a batch of 64
    sock.close()

    def stats() -> dict:
        return httpx.get(f"{server.base}/v2/models/queued/stats").json()["model_stats"][0]

    wait_for(lambda: stats()["inference_stats"]["fail"]["count"] == 1, "the cancellation")
    time.sleep(2.0)  # past the queue delay: a request still queued would have run by now
    assert stats()["execution_count"] == 0 and stats()["inference_count"] == 0
    text = httpx.get(server.metrics_url).text
    assert re.search(
        r'^nv_inference_request_failure\{[^}]*model="queued"[^}]*reason="CANCELED"'
        r"[^}]*\} 1(\.0)?$",
        text,
        re.M,
    ), text


def test_a_killed_frontend_process_is_started_again(server) -> None:
    victim = frontend_children(server)[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_gone(victim)
    wait_for(
        lambda: len(frontend_children(server)) == 2 and victim not in frontend_children(server),
        "a new frontend process",
        timeout=30,
    )
    for _ in range(CONNECTIONS):
        with httpclient.InferenceServerClient(server.http_url) as client:
            a = np.ones((1, 16), dtype=np.int32)
            result = client.infer("simple", _simple_inputs(httpclient, a, a))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    assert "frontend process" in server.log() and "starting it again" in server.log()


def test_shutdown_answers_what_was_accepted_and_leaves_no_process(
    repo: Path, tmp_path: Path
) -> None:
    with running_server([repo], ["--frontend-processes", "2"], log_dir=tmp_path) as process:
        wait_for(lambda: len(frontend_children(process)) == 1, "a frontend process")
        children = frontend_children(process)
        results: list = []

        def nap() -> None:
            with httpclient.InferenceServerClient(
                process.http_url, connection_timeout=30, network_timeout=30
            ) as client:
                tensor = httpclient.InferInput("SECONDS", [1], "FP32")
                tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
                try:
                    results.append(client.infer("napper", [tensor]).as_numpy("PID")[0] > 0)
                except Exception as exc:
                    results.append(exc)

        threads = [threading.Thread(target=nap) for _ in range(6)]
        for thread in threads:
            thread.start()
        wait_for(
            lambda: sum(connection_owners(process.http_port).values()) >= 6, "six open connections"
        )
        os.kill(process.pid, signal.SIGTERM)
        for thread in threads:
            thread.join(60)
        assert results == [True] * 6  # one instance: the last waited ~6 s, inside the drain
        assert process.process.wait(30) == 0
    try:
        for child in children:
            assert wait_gone(child), f"frontend process {child} outlived the server"
    finally:
        for child in children:
            if not gone(child):
                kill_quietly(child)


def test_grpc_streams_through_a_frontend_process(server) -> None:
    import queue

    children = set(frontend_children(server))
    for _ in range(30):  # until a channel's connection lands on a frontend process
        before = set(connection_peers(server.grpc_port))
        client = grpcclient.InferenceServerClient(server.grpc_url)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for index in range(5):
            client.async_stream_infer(
                "simple", _simple_inputs(grpcclient, a, a), request_id=str(index)
            )
        got = [answers.get(timeout=30) for _ in range(5)]
        landed = [
            pid for peer, pid in connection_peers(server.grpc_port).items() if peer not in before
        ]
        client.stop_stream()
        client.close()
        assert all(error is None for _, error in got)
        assert sorted(result.get_response().id for result, _ in got) == ["0", "1", "2", "3", "4"]
        for result, _ in got:
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
        if landed and landed[0] in children:
            return
    pytest.fail("no gRPC connection landed on a frontend process")


def test_decoupled_models_and_generate_through_every_process(server) -> None:
    """HTTP infer refuses a decoupled model the same everywhere; generate works everywhere for
    a model that is not decoupled; a decoupled model streams where the owner took the
    connection and is refused, saying why, where a frontend process did."""
    streamed = {"owner": 0, "frontend": 0}
    for _ in range(CONNECTIONS):
        with httpx.Client(base_url=server.base, timeout=30) as client:
            refused = client.post(
                "/v2/models/token_stream/infer",
                json={
                    "inputs": [
                        {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["a b"]}
                    ]
                },
            )
            assert refused.status_code == 501
            assert refused.json() == {
                "error": "HTTP end point doesn't support models with decoupled transaction policy"
            }
            plain = client.post(
                "/v2/models/simple/generate", json={"INPUT0": list(range(16)), "INPUT1": [1] * 16}
            )
            assert plain.status_code == 200 and plain.json()["OUTPUT0"] == list(range(1, 17))
            stream = client.post(
                "/v2/models/token_stream/generate_stream", json={"text_input": "a b"}
            )
            if stream.status_code == 200:
                assert stream.text.count("data: ") == 2
                streamed["owner"] += 1
            else:
                assert stream.status_code == 501
                assert stream.json()["error"] == (
                    "A frontend process (--frontend-processes) doesn't support models with "
                    "decoupled transaction policy"
                )
                streamed["frontend"] += 1
    assert sum(streamed.values()) == CONNECTIONS
