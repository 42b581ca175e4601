"""Client shared memory cannot end the server or hold its event loop (issue 28, items 1 and 6).

A region's file belongs to the client: it can shrink (ftruncate), vanish (shm_unlink) or be
rewritten while the server holds the region. Each request that touches a shrunk region gets
400 / INVALID_ARGUMENT naming the region, for inputs and for outputs, and the server serves the
next request; the code before this died of SIGBUS (exit -7) on the first touch.

A BYTES input in a region is parsed as an HTTP body of the same data is: off the event loop past
the offload threshold, and held to the request size limit first. The code before parsed a
64 MiB region on the loop (health held for 6.4 s, the server grown by 700 MB).
"""

from __future__ import annotations

import multiprocessing
import os
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from examples.build_repository import build_simple
from harness.serverproc import ServerProcess, running_server

pytestmark = pytest.mark.e2e

A = np.arange(16, dtype=np.int32).reshape(1, 16)
LIVE_BOUND_S = 1.0  # the bug held live for seconds; a healthy loop answers in milliseconds


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("shm_hostile_models")
    build_simple(repo)
    _build_identity_bytes(repo)
    _build_identity_bytes(repo, "two_strings", "2")
    with running_server(
        [repo], ["--exit-timeout-secs", "5"], log_dir=tmp_path_factory.mktemp("shm_hostile_logs")
    ) as running:
        yield running


@pytest.fixture
def regions() -> Iterator[Callable[[int], tuple[str, Any]]]:
    made: list[Any] = []

    def create(size: int) -> tuple[str, Any]:
        key = f"/ascend_hostile_{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key[1:], key, size)
        made.append(handle)
        return key, handle

    yield create
    for handle in made:
        try:
            shm.destroy_shared_memory_region(handle)
        except Exception:
            pass  # a test unlinked it itself


def _build_identity_bytes(repo: Path, name: str = "identity_bytes", dims: str = "-1") -> None:
    """TYPE_STRING in and out on the identity backend (no ONNX Runtime cost in the timings)."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "identity"\nmax_batch_size: 0\n'
        f'input [ {{ name: "INPUT" data_type: TYPE_STRING dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "OUTPUT" data_type: TYPE_STRING dims: [ {dims} ] }} ]\n'
    )


def _register(server: ServerProcess, name: str, key: str, byte_size: int) -> None:
    reply = httpx.post(
        f"{server.base}/v2/systemsharedmemory/region/{name}/register",
        json={"key": key, "byte_size": byte_size},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text


def _unregister(server: ServerProcess, name: str) -> None:
    httpx.post(f"{server.base}/v2/systemsharedmemory/region/{name}/unregister", timeout=10)


def _in_region(name: str, offset: int = 0, byte_size: int = 64) -> dict:
    return {
        "parameters": {
            "shared_memory_region": name,
            "shared_memory_offset": offset,
            "shared_memory_byte_size": byte_size,
        }
    }


def _simple_body(input0: dict, input1: dict, output0: dict | None = None) -> dict:
    body: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", **input0},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", **input1},
        ]
    }
    if output0 is not None:
        body["outputs"] = [{"name": "OUTPUT0", **output0}]
    return body


def _assert_serving(server: ServerProcess) -> None:
    """Alive, live, and the next ordinary request is answered."""
    assert server.alive(), f"server died: {server.log()[-2000:]}"
    assert httpx.get(f"{server.base}/v2/health/live", timeout=10).status_code == 200
    data = {"data": list(range(16))}
    reply = httpx.post(
        f"{server.base}/v2/models/simple/infer", json=_simple_body(data, data), timeout=10
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [2 * v for v in range(16)]


def _truncate(key: str, size: int = 0) -> None:
    os.truncate(f"/dev/shm/{key[1:]}", size)


# ----- item 1: a file that shrinks under the region ------------------------------------------
def test_truncated_input_region_is_a_400_naming_it_over_http(server, regions) -> None:
    key, handle = regions(128)
    shm.set_shared_memory_region(handle, [A, A])
    name = f"in_{uuid.uuid4().hex[:6]}"
    _register(server, name, key, 128)
    try:
        _truncate(key)
        reply = httpx.post(
            f"{server.base}/v2/models/simple/infer",
            json=_simple_body(_in_region(name), _in_region(name, 64)),
            timeout=10,
        )
        assert reply.status_code == 400, reply.text
        assert f"'{name}'" in reply.json()["error"]
        _assert_serving(server)
    finally:
        _unregister(server, name)


def test_truncated_input_region_is_invalid_argument_over_grpc(server, regions) -> None:
    key, handle = regions(128)
    shm.set_shared_memory_region(handle, [A, A])
    name = f"in_{uuid.uuid4().hex[:6]}"
    _register(server, name, key, 128)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        _truncate(key, 64)  # INPUT0 still there, INPUT1 past the file's end
        inputs = [
            grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        inputs[0].set_shared_memory(name, 64)
        inputs[1].set_shared_memory(name, 64, offset=64)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("simple", inputs)
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert f"'{name}'" in caught.value.message()
        _assert_serving(server)
    finally:
        client.close()
        _unregister(server, name)


def test_truncated_output_region_is_a_400_naming_it(server, regions) -> None:
    key, _ = regions(64)
    name = f"out_{uuid.uuid4().hex[:6]}"
    _register(server, name, key, 64)
    try:
        _truncate(key)
        data = {"data": list(range(16))}
        reply = httpx.post(
            f"{server.base}/v2/models/simple/infer",
            json=_simple_body(data, data, _in_region(name)),
            timeout=10,
        )
        assert reply.status_code == 400, reply.text
        assert f"'{name}'" in reply.json()["error"]
        _assert_serving(server)
    finally:
        _unregister(server, name)


def test_a_region_whose_file_vanishes_or_regrows_serves_or_refuses_never_signals(
    server, regions
) -> None:
    """Unlinked: the server still holds the file it registered (as a mapping would). Shrunk
    and grown back: the bytes are the file's again (zeros where it was cut)."""
    key, handle = regions(128)
    shm.set_shared_memory_region(handle, [A, A])
    name = f"gone_{uuid.uuid4().hex[:6]}"
    _register(server, name, key, 128)
    try:
        _truncate(key)
        _truncate(key, 128)
        reply = httpx.post(
            f"{server.base}/v2/models/simple/infer",
            json=_simple_body(_in_region(name), _in_region(name, 64)),
            timeout=10,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == [0] * 16
        os.unlink(f"/dev/shm/{key[1:]}")
        reply = httpx.post(
            f"{server.base}/v2/models/simple/infer",
            json=_simple_body(_in_region(name), _in_region(name, 64)),
            timeout=10,
        )
        assert reply.status_code in (200, 400), reply.text
        _assert_serving(server)
    finally:
        _unregister(server, name)


# ----- item 6: BYTES in a region --------------------------------------------------------------
def _poll_live(base: str, started: Any, done: Any, results: Any) -> None:
    """In a process of its own, so the test's own work never counts in the timings."""
    waits: list[float] = []
    try:
        with httpx.Client(base_url=base, timeout=60) as client:
            client.get("/v2/health/live")
            started.set()
            while not done.is_set():
                began = time.perf_counter()
                client.get("/v2/health/live")
                waits.append(time.perf_counter() - began)
                time.sleep(0.01)
        results.put((waits, None))
    except BaseException as exc:
        started.set()
        results.put((waits, repr(exc)))


def _worst_live_wait(server: ServerProcess, action: Callable[[], Any]) -> tuple[Any, float]:
    context = multiprocessing.get_context("spawn")
    started, done, results = context.Event(), context.Event(), context.Queue()
    poller = context.Process(target=_poll_live, args=(server.base, started, done, results))
    poller.start()
    started.wait(30)
    try:
        reply = action()
    finally:
        done.set()
        waits, failure = results.get(timeout=60)
        poller.join(30)
    assert failure is None, failure
    return reply, max(waits, default=0.0)


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _strings(count: int, length: int) -> bytes:
    item = struct.pack("<I", length) + b"x" * length
    return item * count


def _bytes_infer(
    server: ServerProcess,
    name: str,
    count: int,
    byte_size: int,
    out: dict | None,
    model: str = "identity_bytes",
) -> httpx.Response:
    body: dict[str, Any] = {
        "inputs": [
            {
                "name": "INPUT",
                "shape": [count],
                "datatype": "BYTES",
                **_in_region(name, 0, byte_size),
            }
        ]
    }
    if out is not None:
        body["outputs"] = [{"name": "OUTPUT", **out}]
    return httpx.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=120)


@pytest.mark.slow
def test_a_bytes_region_past_the_size_limit_is_refused_at_once(server, regions) -> None:
    """64 MiB of one-byte strings and a little more: as a body it is past --http-max-input-size
    (413 before it is read); named by a 300-byte request it is refused the same way."""
    count = (64 * 1024 * 1024 + 5 * 1024) // 5
    size = count * 5
    key, handle = regions(size)
    with open(f"/dev/shm/{key[1:]}", "r+b") as file:
        file.write(_strings(count, 1))
    name = f"big_{uuid.uuid4().hex[:6]}"
    _register(server, name, key, size)
    before = _peak_rss_mb(server.pid)
    try:
        reply, worst = _worst_live_wait(
            server, lambda: _bytes_infer(server, name, count, size, None)
        )
        assert reply.status_code == 413, reply.text[:300]
        assert f"'{name}'" in reply.json()["error"]
        assert "--http-max-input-size" in reply.json()["error"]
        assert worst < LIVE_BOUND_S, f"live waited {worst:.2f} s"
        assert _peak_rss_mb(server.pid) - before < 150
        _assert_serving(server)
    finally:
        _unregister(server, name)


@pytest.mark.slow
def test_a_large_bytes_region_is_parsed_off_the_loop(server, regions) -> None:
    """5 million 4-byte strings (38 MiB) named by a small request: parsed in a thread (on the
    loop: 4 s of health held on a 2-core machine), then refused by the model's shape."""
    count, length = 5_000_000, 4
    size = count * (4 + length)
    key, _ = regions(size)
    with open(f"/dev/shm/{key[1:]}", "r+b") as file:
        file.write(_strings(count, length))
    name = f"parse_{uuid.uuid4().hex[:6]}"
    _register(server, name, key, size)
    try:
        reply, worst = _worst_live_wait(
            server, lambda: _bytes_infer(server, name, count, size, None, "two_strings")
        )
        assert reply.status_code == 400, reply.text[:300]
        assert "INPUT" in reply.json()["error"]
        assert worst < LIVE_BOUND_S, f"live waited {worst:.2f} s"
        _assert_serving(server)
    finally:
        _unregister(server, name)


@pytest.mark.slow
def test_bytes_in_and_out_through_regions_past_the_offload_threshold(server, regions) -> None:
    """A million 12-byte strings read from one region and written to another (both in threads):
    the bytes arrive intact and live keeps answering."""
    count, length = 1_000_000, 12
    size = count * (4 + length)
    key_in, _ = regions(size)
    key_out, _ = regions(size)
    with open(f"/dev/shm/{key_in[1:]}", "r+b") as file:
        file.write(_strings(count, length))
    name_in, name_out = f"bin_{uuid.uuid4().hex[:6]}", f"bout_{uuid.uuid4().hex[:6]}"
    _register(server, name_in, key_in, size)
    _register(server, name_out, key_out, size)
    try:
        reply, worst = _worst_live_wait(
            server,
            lambda: _bytes_infer(server, name_in, count, size, _in_region(name_out, 0, size)),
        )
        assert reply.status_code == 200, reply.text[:300]
        assert reply.json()["outputs"][0]["shape"] == [count]
        with open(f"/dev/shm/{key_out[1:]}", "rb") as file:
            assert file.read(size) == _strings(count, length)
        assert worst < LIVE_BOUND_S, f"live waited {worst:.2f} s"
        _assert_serving(server)
    finally:
        _unregister(server, name_in)
        _unregister(server, name_out)


# ----- the other ways in: frontend processes, gRPC streams ------------------------------------
def _bytes_round_trip(server: ServerProcess, regions: Any, count: int = 100_000) -> None:
    """BYTES in and out through regions, past the offload threshold (thread on both ways)."""
    size = count * 16
    key_in, _ = regions(size)
    key_out, _ = regions(size)
    with open(f"/dev/shm/{key_in[1:]}", "r+b") as file:
        file.write(_strings(count, 12))
    name_in, name_out = f"rin_{uuid.uuid4().hex[:6]}", f"rout_{uuid.uuid4().hex[:6]}"
    _register(server, name_in, key_in, size)
    _register(server, name_out, key_out, size)
    try:
        reply = _bytes_infer(server, name_in, count, size, _in_region(name_out, 0, size))
        assert reply.status_code == 200, reply.text[:300]
        with open(f"/dev/shm/{key_out[1:]}", "rb") as file:
            assert file.read(size) == _strings(count, 12)
    finally:
        _unregister(server, name_in)
        _unregister(server, name_out)


def test_through_a_frontend_process(tmp_path: Path, regions) -> None:
    """The owner reads and writes regions for requests a frontend process hands it."""
    repo = tmp_path / "models"
    build_simple(repo)
    _build_identity_bytes(repo)
    with running_server(
        [repo], ["--frontend-processes", "1", "--exit-timeout-secs", "5"], log_dir=tmp_path
    ) as server:
        _bytes_round_trip(server, regions)
        key, handle = regions(128)
        shm.set_shared_memory_region(handle, [A, A])
        _register(server, "trunc", key, 128)
        _truncate(key)
        reply = httpx.post(
            f"{server.base}/v2/models/simple/infer",
            json=_simple_body(_in_region("trunc"), _in_region("trunc", 64)),
            timeout=10,
        )
        assert reply.status_code == 400 and "'trunc'" in reply.json()["error"], reply.text
        data = {"data": list(range(16))}
        reply = httpx.post(
            f"{server.base}/v2/models/simple/infer",
            json=_simple_body(data, data, _in_region("trunc")),
            timeout=10,
        )
        assert reply.status_code == 400 and "'trunc'" in reply.json()["error"], reply.text
        _assert_serving(server)


def test_a_large_region_input_over_a_grpc_stream(server, regions) -> None:
    """A stream's request with a BYTES input past the threshold is read in a thread first;
    a truncated region on the same stream is an error for that request only."""
    import queue

    count = 100_000
    size = count * 16
    key, _ = regions(size)
    with open(f"/dev/shm/{key[1:]}", "r+b") as file:
        file.write(_strings(count, 12))
    name = f"stream_{uuid.uuid4().hex[:6]}"
    _register(server, name, key, size)
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        tensor = grpcclient.InferInput("INPUT", [count], "BYTES")
        tensor.set_shared_memory(name, size)
        client.async_stream_infer("identity_bytes", [tensor])
        result, error = answers.get(timeout=60)
        assert error is None, error
        out = result.as_numpy("OUTPUT")
        assert out.shape == (count,) and out[0] == b"x" * 12 and out[-1] == b"x" * 12
        _truncate(key)
        client.async_stream_infer("identity_bytes", [tensor])
        result, error = answers.get(timeout=60)
        assert error is not None and f"'{name}'" in str(error)
    finally:
        client.stop_stream()
        client.close()
        _unregister(server, name)
    _assert_serving(server)
