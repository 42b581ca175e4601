"""Issue #13 item 1's target: no request freezes the server.

Loopback only, about 45 s. A server over `simple` (INT32 [16] add/sub) and `identity_fp32`
(FP32 [-1, -1] Identity) is measured in three phases, each with `/v2/health/live` polled on one
connection and a small `simple` inference sent on another (10 ms apart each):

1. quiet (--quiet-secs): the reference latencies;
2. hostile (--hostile-secs): 64 MiB bodies of `{"a":` repeated (just under the default
   --http-max-input-size), sent back to back on a third connection, alternately to
   `/v2/repository/index` and to `/v2/models/simple/infer`; each must get its 400;
3. valid: one JSON infer request with 5 million FP32 elements to `identity_fp32` (its answer
   is checked).

Then issue #28's client shared-memory cases (their own functions below): a region whose file is
truncated to 0 under it, named by an input and by an output (400 naming the region, the server
alive and serving: it used to die of SIGBUS), and BYTES regions named by small requests: 64 MiB
and a little more (413 at once: a body of that data is over --http-max-input-size) and 5 million
strings under the limit (parsed in a thread, not on the loop), with live polled throughout.

Verdicts (issue #13): in phase 2 live p99 < 50 ms and small-inference p99 < 3x its phase-1
value; in phase 3 no live poll waits more than 0.5 s. Extra arguments after `--` go to the
server (`-- --http-parser-processes 0` measures the event-loop-only parse).

Then the cases of issue #28, each against its own server:

- unfinished bodies (item 5): 8 connections each send 56 MiB of a declared 60 MiB body and
  stall, against --http-max-inflight-body-size 128 MiB and --http-body-timeout-secs 3; the
  server must grow less than the budget plus 96 MiB (it used to grow by all 448 MiB), refuse
  the bodies past the budget (503, or reset while they still send), answer the others 408
  after the timeout, and keep answering live.

Issue 28's items 9 and 10, each against its own server (about 15 s): loads of model names
that forge a `successfully loaded 'simple'` log line or are 60 KB (HTTP) and 100 KiB (gRPC)
long (400 / INVALID_ARGUMENT, escaped and bounded, no forged line in the log), and a Python
model that tries each bad custom metric (each raises in model.py; /metrics still parses).

No process outlives the server (issue 28 items 8 and 11, `process_lifetime`, about 40 s): a
server with parser processes in use, --frontend-processes 2 and a Python model that starts
processes of its own, stopped by SIGTERM and (another) by SIGKILL, leaves none of the processes
recorded before running 10 s later; a model unload ends the model's processes.

Issue 28's gRPC cases (`GRPC_CASES`, about 30 s): a ModelStreamInfer client that sends 3,000 x
60 KB and reads nothing (server growth < 200 MB, its requests left unread, all answered once it
reads), a stream that sends no request (UNAVAILABLE), and 5,000 calls 300 at a time past
`--grpc-max-concurrent-streams 10` on a warm channel (all succeed).

    .venv/bin/python -m bench.studies.hostile [--hostile-secs 20] [-- server flags]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from examples.build_repository import build_simple
from examples.streaming import build_streaming
from harness.procutil import descendants, kill_quietly, marked, wait_gone
from harness.serverproc import ServerProcess, start_server
from harness.testmodels import (
    FORKER_MODEL,
    build_identity_fp32,
    build_metrics_probe,
    sleeper_config,
    write_python_model,
)

HOSTILE = b'{"a":' * ((64 * 1024 * 1024) // 5)  # 67,108,860 bytes: under the 64 MiB limit
DEPTH_ERROR = "JSON nesting depth exceeds maximum allowed limit (100)"
VALID_ELEMENTS = 5_000_000
SMALL = json.dumps(
    {
        "inputs": [
            {"name": name, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
            for name in ("INPUT0", "INPUT1")
        ]
    }
).encode()


class Poller(threading.Thread):
    """One request over and over on its own keep-alive connection; records each wait."""

    def __init__(self, port: int, method: str, path: str, body: bytes | None = None) -> None:
        super().__init__(daemon=True)
        self.port, self.method, self.path, self.body = port, method, path, body
        self.waits: list[float] = []
        self.errors = 0
        self.running = True

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while self.running:
            began = time.perf_counter()
            try:
                conn.request(self.method, self.path, body=self.body)
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    self.errors += 1
            except (OSError, http.client.HTTPException):
                self.errors += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            self.waits.append(time.perf_counter() - began)
            time.sleep(0.01)
        conn.close()

    def take(self) -> list[float]:
        waits, self.waits = self.waits, []
        return waits


def p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def ms(value: float) -> str:
    return f"{value * 1000:.1f} ms"


def phase(
    live: Poller, small: Poller, seconds: float, work: Callable[[], None] | None = None
) -> tuple[list[float], list[float]]:
    live.take(), small.take()
    if work is None:
        time.sleep(seconds)
    else:
        work()
    return live.take(), small.take()


def post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# Issue 28 item 2: load-API config overrides whose numbers used to freeze the loop, exhaust
# memory or run a load for ever; each must be refused with 400 at once, live answering.
_TENSORS = {
    "backend": "onnxruntime",
    "input": [{"name": f"INPUT{i}", "data_type": "TYPE_INT32", "dims": [16]} for i in (0, 1)],
    "output": [{"name": f"OUTPUT{i}", "data_type": "TYPE_INT32", "dims": [16]} for i in (0, 1)],
}
_ZERO = {"data_type": "TYPE_INT32", "dims": [16], "zero_data": True}
OVERRIDE_CASES: list[tuple[str, str, dict]] = [
    (
        "sequence max_batch_size 4,000,000",
        "simple",
        {**_TENSORS, "max_batch_size": 4_000_000, "sequence_batching": {"direct": {}}},
    ),
    (
        "sequence max_batch_size 2^31-1",
        "simple",
        {**_TENSORS, "max_batch_size": 2**31 - 1, "sequence_batching": {"direct": {}}},
    ),
    (
        "max_candidate_sequences 2^31-1",
        "simple",
        {
            **_TENSORS,
            "max_batch_size": 8,
            "sequence_batching": {"oldest": {"max_candidate_sequences": 2**31 - 1}},
        },
    ),
    *(
        (
            f"warm-up {field} 2^31-1",
            "simple",
            {
                **_TENSORS,
                "max_batch_size": 8,
                "model_warmup": [
                    {
                        "name": "w",
                        "batch_size": 2**31 - 1 if field == "batch_size" else 1,
                        "count": 2**31 - 1 if field == "count" else 1,
                        "inputs": {"INPUT0": _ZERO, "INPUT1": _ZERO},
                    }
                ],
            },
        )
        for field in ("batch_size", "count")
    ),
    (
        "instance count 2^31-1",
        "simple",
        {
            **_TENSORS,
            "max_batch_size": 8,
            "instance_group": [{"kind": "KIND_CPU", "count": 2**31 - 1}],
        },
    ),
    (
        'response_ring_bytes "1e15"',
        "token_stream",
        {
            "backend": "python",
            "model_transaction_policy": {"decoupled": True},
            "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
            "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [1]}],
            "parameters": {"response_ring_bytes": {"string_value": "1e15"}},
        },
    ),
]


def config_override_bounds() -> list[tuple[str, bool]]:
    """Each OVERRIDE_CASES load on an explicit-mode server: 400 within 3 s, live < 1 s."""
    repo = Path(tempfile.mkdtemp(prefix="hostile-bounds-"))
    build_simple(repo)
    build_streaming(repo)
    server = start_server([repo], ["--model-control-mode", "explicit", "--load-model", "simple"])
    verdicts: list[tuple[str, bool]] = []
    try:
        live = Poller(server.http_port, "GET", "/v2/health/live")
        live.start()
        for name, model, config in OVERRIDE_CASES:
            body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
            before = len(live.waits)
            began = time.monotonic()
            status, reply = post(server.http_port, f"/v2/repository/models/{model}/load", body)
            took = time.monotonic() - began
            time.sleep(0.1)
            worst = max(live.waits[before:], default=0.0)
            error = json.loads(reply).get("error", "")
            print(f"load override {name}: {status} in {took:.2f} s, live max {ms(worst)}: {error}")
            verdicts.append((f"override {name}: 400 within 3 s", status == 400 and took < 3.0))
            verdicts.append((f"override {name}: live under 1 s", worst < 1.0))
        live.running = False
    finally:
        server.stop()
    return verdicts


BODY_BUDGET = 128 * 1024 * 1024
BODY_DECLARED = 60 * 1024 * 1024
BODY_SENT = 56 * 1024 * 1024
BODY_CONNECTIONS = 8


def _rss_bytes(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+)", status)
    return int(match.group(1)) * 1024 if match else 0


def _stall_body(port: int, outcomes: list[bytes]) -> None:
    """Send most of a body, then wait for whatever the server answers before it closes."""
    head = f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY_DECLARED}"
    out = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
            try:
                sock.sendall(head.encode() + b"\r\n\r\n" + bytes(BODY_SENT))
            except OSError:  # refused and closed while sending
                pass
            while chunk := sock.recv(65536):
                out += chunk
    except OSError:
        pass
    outcomes.append(out)


def unfinished_bodies(repo: Path) -> list[tuple[str, bool]]:
    """Issue #28 item 5: stalled bodies are bounded by the in-flight budget and the timeout."""
    server = start_server(
        [repo],
        ["--http-max-inflight-body-size", str(BODY_BUDGET), "--http-body-timeout-secs", "3"],
        log_dir=Path(tempfile.mkdtemp(prefix="hostile-logs-")),
    )
    try:
        port = server.http_port
        post(port, "/v2/models/simple/infer", SMALL)
        before = peak = _rss_bytes(server.pid)
        outcomes: list[bytes] = []
        threads = [
            threading.Thread(target=_stall_body, args=(port, outcomes), daemon=True)
            for _ in range(BODY_CONNECTIONS)
        ]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        live_max = 0.0
        while any(thread.is_alive() for thread in threads) and time.monotonic() - began < 120:
            peak = max(peak, _rss_bytes(server.pid))
            t0 = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/v2/health/live")
            conn.getresponse().read()
            conn.close()
            live_max = max(live_max, time.perf_counter() - t0)
            time.sleep(0.05)
        took = time.monotonic() - began
        timed_out = sum(out.startswith(b"HTTP/1.1 408 ") for out in outcomes)
        refused = sum(out == b"" or out.startswith(b"HTTP/1.1 503 ") for out in outcomes)
        status, _ = post(port, "/v2/models/simple/infer", SMALL)
        grown = peak - before
        print(
            f"unfinished bodies ({BODY_CONNECTIONS} x {BODY_SENT >> 20} MiB of "
            f"{BODY_DECLARED >> 20} MiB, budget {BODY_BUDGET >> 20} MiB, timeout 3 s): grew "
            f"{grown / 2**20:.0f} MiB, {refused} refused, {timed_out} answered 408, all done "
            f"in {took:.1f} s; live max {ms(live_max)}; infer after: {status}"
        )
        return [
            (
                "stalled bodies grow the server less than the budget + 96 MiB",
                grown < BODY_BUDGET + 96 * 2**20,
            ),
            (
                "every stalled body refused or answered 408",
                refused + timed_out == BODY_CONNECTIONS and timed_out > 0,
            ),
            ("live answered within 1 s meanwhile", live_max < 1.0),
            ("a normal inference succeeds after", status == 200),
        ]
    finally:
        server.stop()


# ----- issue 28 items 8 and 11: no process outlives the server ---------------------------------
TREE_MARK = "ASCEND_SERVE_HOSTILE_TREE"  # in the server's environment, so in every descendant's
TREE_ARGS = ["--frontend-processes", "2", "--http-offload-threshold", "1024"]
LARGE_INDEX_BODY = b'{"ready": true}' + b" " * (64 * 1024)


def _forker_server(extra: list[str]) -> tuple[ServerProcess, Path, str]:
    repo = Path(tempfile.mkdtemp(prefix="hostile-forker-"))
    write_python_model(repo, "forker", FORKER_MODEL, sleeper_config("forker"))
    mark = uuid.uuid4().hex
    server = start_server(
        [repo],
        TREE_ARGS + extra,
        env={TREE_MARK: mark},
        log_dir=Path(tempfile.mkdtemp(prefix="hostile-logs-")),
    )
    deadline = time.monotonic() + 30
    while not (repo / "forker" / "children.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return server, repo, mark


def _outliving(pids: set[int], mark: str) -> set[int]:
    """What of `pids` still runs 10 s on, and whatever else carries the mark."""
    return {pid for pid in pids if not wait_gone(pid, 10)} | marked(TREE_MARK, mark)


def process_lifetime() -> Verdicts:
    """Items 8 and 11: a server with parser processes in use (bodies over the offload
    threshold, on fresh connections so both frontend processes parse some), a second frontend
    process and a Python model that starts three processes (FORKER_MODEL) is stopped by SIGTERM,
    then another by SIGKILL; the tree recorded before (descendants and processes carrying the
    mark) must be gone within 10 s. Then a model unload must end the model's processes."""
    verdicts: Verdicts = []
    for how in (signal.SIGTERM, signal.SIGKILL):
        server, _, mark = _forker_server([])
        try:
            for _ in range(12):
                post(server.http_port, "/v2/repository/index", LARGE_INDEX_BODY)
            before = {server.pid} | descendants(server.pid) | marked(TREE_MARK, mark)
            os.kill(server.pid, how)
            server.process.wait(60)
            left = _outliving(before, mark)
            print(f"{how.name}: {len(before)} processes before, {len(left)} left after 10 s")
            verdicts.append((f"no process outlives the server after {how.name}", not left))
        finally:
            server.stop()
            for pid in marked(TREE_MARK, mark):
                kill_quietly(pid)
    server, repo, mark = _forker_server(
        ["--model-control-mode", "explicit", "--load-model", "forker"]
    )
    try:
        model = {int(pid) for pid in (repo / "forker" / "children.pid").read_text().split()}
        status, _ = post(server.http_port, "/v2/repository/models/forker/unload", b"")
        left = {pid for pid in model if not wait_gone(pid, 10)}
        print(f"unload: {status}, {len(model)} processes the model started, {len(left)} left")
        verdicts.append(("a model's processes end when it is unloaded", status == 200 and not left))
    finally:
        server.stop()
        for pid in marked(TREE_MARK, mark):
            kill_quietly(pid)
    return verdicts


# ----- gRPC cases of issue 28 (items 4 and 7) -----------------------------------------------
Verdicts = list[tuple[str, bool]]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def grpc_unread_stream(server: ServerProcess, repo: Path) -> Verdicts:
    """Item 4: 3,000 requests of 60 KB on one stream whose answers are not read for 10 s."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    total, elements = 3000, 15_000
    payload = np.ones(elements, np.float32).tobytes()
    sent = [0]

    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        for index in range(total):
            request = service_pb2.ModelInferRequest(model_name="identity_fp32", id=str(index))
            tensor = request.inputs.add(name="INPUT", datatype="FP32")
            tensor.shape.extend([1, elements])
            request.raw_input_contents.append(payload)
            yield request
            sent[0] += 1

    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        before = rss_mb(server.pid)
        answers = stub.ModelStreamInfer(requests(), timeout=120)
        peak, deadline = before, time.monotonic() + 10
        while time.monotonic() < deadline:
            peak = max(peak, rss_mb(server.pid))
            time.sleep(0.25)
        taken = sent[0]
        read = 0
        for answer in answers:
            read += not answer.error_message
            if read == total:
                break
        answers.cancel()
    print(
        f"unread gRPC stream: {taken} of {total} requests taken while unread, server "
        f"+{peak - before:.0f} MB; {read} answered once read"
    )
    return [
        ("unread stream: server grew < 200 MB", peak - before < 200),
        ("unread stream: requests past the bound not read", taken < total),
        ("unread stream: every request answered once read", read == total),
    ]


def grpc_stream_without_request(server: ServerProcess, repo: Path) -> Verdicts:
    """A stream opened without a request, on a server with a 1 s first-request timeout."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    hold = threading.Event()

    def nothing() -> Iterator[Any]:
        hold.wait(30)
        yield from ()

    idle = start_server(
        [repo],
        ["--grpc-stream-first-request-timeout", "1000"],
        log_dir=Path(tempfile.mkdtemp(prefix="hostile-logs-")),
    )
    code, began = None, time.monotonic()
    try:
        with grpc.insecure_channel(idle.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            try:
                for _ in stub.ModelStreamInfer(nothing(), timeout=30):
                    pass
            except grpc.RpcError as error:
                code = error.code()
    finally:
        hold.set()
        idle.stop()
    took = time.monotonic() - began
    print(f"stream without a request: ended with {code} after {took:.1f} s")
    return [
        (
            "stream without a request: UNAVAILABLE within 5 s",
            (code == grpc.StatusCode.UNAVAILABLE and took < 5),
        )
    ]


def grpc_calls_past_stream_limit(server: ServerProcess, repo: Path) -> Verdicts:
    """Item 7: 5,000 calls, 300 at a time, past --grpc-max-concurrent-streams 10."""
    import tritonclient.grpc as grpcclient

    total, concurrency = 5000, 300
    limited = start_server(
        [repo],
        ["--grpc-max-concurrent-streams", "10"],
        log_dir=Path(tempfile.mkdtemp(prefix="hostile-logs-")),
    )
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    slots, lock, done = threading.Semaphore(concurrency), threading.Lock(), threading.Event()
    counts = {"ok": 0, "failed": 0}

    def callback(result: Any, error: Any) -> None:
        with lock:
            counts["failed" if error is not None else "ok"] += 1
            if counts["ok"] + counts["failed"] == total:
                done.set()
        slots.release()

    try:
        with grpcclient.InferenceServerClient(limited.grpc_url) as client:
            client.infer("simple", inputs)  # a warm channel
            for _ in range(total):
                slots.acquire()
                client.async_infer("simple", inputs, callback)
            done.wait(120)
    finally:
        limited.stop()
    print(f"calls past the stream limit: {counts['ok']} of {total} succeeded")
    return [("calls past the stream limit all succeed", counts["ok"] == total)]


GRPC_CASES: list[Callable[[ServerProcess, Path], Verdicts]] = [
    grpc_unread_stream,
    grpc_stream_without_request,
    grpc_calls_past_stream_limit,
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quiet-secs", type=float, default=8.0)
    parser.add_argument("--hostile-secs", type=float, default=20.0)
    parser.add_argument("server_args", nargs="*", help="after --: extra server flags")
    args = parser.parse_args(argv)

    repo = Path(tempfile.mkdtemp(prefix="hostile-models-"))
    build_simple(repo)
    build_identity_fp32(repo)
    build_shm_models(repo)
    server = start_server(
        [repo],
        ["--exit-timeout-secs", "5", *args.server_args],
        log_dir=Path(tempfile.mkdtemp(prefix="hostile-logs-")),
    )
    port = server.http_port
    verdicts: list[tuple[str, bool]] = []
    try:
        status, _ = post(port, "/v2/models/simple/infer", SMALL)
        assert status == 200, status
        # Start the parser processes (they start on first use) before measuring anything.
        post(port, "/v2/repository/index", b'{"ready": true}' + b" " * (1 << 20))
        live = Poller(port, "GET", "/v2/health/live")
        small = Poller(port, "POST", "/v2/models/simple/infer", SMALL)
        live.start()
        small.start()

        quiet_live, quiet_small = phase(live, small, args.quiet_secs)
        print(
            f"quiet ({args.quiet_secs:.0f} s): live p50 {ms(p(quiet_live, 50))} p99 "
            f"{ms(p(quiet_live, 99))} max {ms(max(quiet_live))} ({len(quiet_live)} polls); "
            f"small infer p50 {ms(p(quiet_small, 50))} p99 {ms(p(quiet_small, 99))}"
        )

        answers: list[tuple[int, str]] = []

        def hostile() -> None:
            paths = ("/v2/repository/index", "/v2/models/simple/infer")
            deadline = time.monotonic() + args.hostile_secs
            while time.monotonic() < deadline:
                status, body = post(port, paths[len(answers) % 2], HOSTILE)
                answers.append((status, json.loads(body).get("error", "")))

        began = time.monotonic()
        hostile_live, hostile_small = phase(live, small, args.hostile_secs, hostile)
        took = time.monotonic() - began
        right = sum(1 for status, error in answers if status == 400 and error == DEPTH_ERROR)
        print(
            f"hostile ({took:.1f} s, {len(answers)} bodies of 64 MiB, {right} answered 400 "
            f"with the depth message): live p50 {ms(p(hostile_live, 50))} p99 "
            f"{ms(p(hostile_live, 99))} max {ms(max(hostile_live))} ({len(hostile_live)} "
            f"polls); small infer p50 {ms(p(hostile_small, 50))} p99 "
            f"{ms(p(hostile_small, 99))} max {ms(max(hostile_small))} "
            f"({len(hostile_small)} requests)"
        )
        verdicts.append(
            ("every hostile body answered 400 with the depth message", right == len(answers) > 0)
        )
        verdicts.append(("live p99 < 50 ms under hostile bodies", p(hostile_live, 99) < 0.050))
        verdicts.append(
            (
                "small inference p99 < 3x quiet under hostile bodies",
                p(hostile_small, 99) < 3 * p(quiet_small, 99),
            )
        )

        values = ((np.arange(VALID_ELEMENTS, dtype=np.float32) % 4096) - 2048) / 16
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT",
                        "shape": [1, VALID_ELEMENTS],
                        "datatype": "FP32",
                        "data": [values.tolist()],
                    }
                ]
            }
        ).encode()
        reply: dict = {}

        def valid() -> None:
            t0 = time.perf_counter()
            reply["status"], reply["body"] = post(port, "/v2/models/identity_fp32/infer", body)
            reply["secs"] = time.perf_counter() - t0

        valid_live, _ = phase(live, small, 0, valid)
        correct = False
        if reply["status"] == 200:
            (output,) = json.loads(reply["body"])["outputs"]
            correct = np.array_equal(np.asarray(output["data"], dtype=np.float32), values)
        print(
            f"valid ({VALID_ELEMENTS:,} elements, {len(body) / 2**20:.0f} MiB of JSON, "
            f"answered {reply['status']} in {reply['secs']:.2f} s, correct: {correct}): "
            f"live max {ms(max(valid_live, default=0.0))} ({len(valid_live)} polls)"
        )
        verdicts.append(("the 5-million-element request answered correctly", correct))
        verdicts.append(("no live poll > 0.5 s during it", max(valid_live, default=0.0) < 0.5))
        verdicts += shm_truncation_verdicts(port, server.alive)
        verdicts += shm_bytes_verdicts(port, live, small)
        live.running = small.running = False
        errors = live.errors + small.errors
        verdicts.append(("no poll failed", errors == 0))
        for case in GRPC_CASES:
            verdicts.extend(case(server, repo))
    finally:
        server.stop()
    verdicts += config_override_bounds()
    verdicts += unfinished_bodies(repo)
    verdicts += log_forging()
    verdicts += custom_metrics_page()
    verdicts += process_lifetime()
    for name, ok in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(ok for _, ok in verdicts) else 1


# ----- issue #28 item 9: client text in the log and in errors -----------------------------------
FORGED_AT = "2031-02-03 04:05:06,789"
FORGING = f"x'\n{FORGED_AT} INFO repository.manager: successfully loaded 'simple"
ERROR_BYTES = 2048  # protocol/text.py MAX_ERROR_BYTES


def log_forging() -> list[tuple[str, bool]]:
    """Loads of names that forge a log line, or are 60 KB (HTTP) and 100 KiB (gRPC) long: 400
    with an escaped, bounded error, no forged `successfully loaded 'simple'` line, and gRPC
    statuses (not transport errors) whose details fit the 8 KiB metadata limit."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    repo = Path(tempfile.mkdtemp(prefix="hostile-names-"))
    build_simple(repo)
    server = start_server([repo], ["--model-control-mode", "explicit", "--load-model", "simple"])
    verdicts: list[tuple[str, bool]] = []
    try:
        for label, name in (
            ("newline", "sim\nple"),
            ("forged line", FORGING),
            ("60 KB", "m" * 60_000),
        ):
            path = "/v2/repository/models/" + urllib.parse.quote(name, safe="") + "/load"
            status, reply = post(server.http_port, path, b"{}")
            error = _error(reply)
            print(f"HTTP load of a {label} name: {status} {error[:100]!r} ({len(error)} chars)")
            verdicts.append(
                (
                    f"HTTP load of a {label} name: 400, one line, bounded",
                    status == 400 and "\n" not in error and 0 < len(error.encode()) <= ERROR_BYTES,
                )
            )
        with grpc.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for label, name in (("forged line", FORGING), ("100 KiB", "m" * 100 * 1024)):
                try:
                    stub.RepositoryModelLoad(
                        service_pb2.RepositoryModelLoadRequest(model_name=name), timeout=30
                    )
                    code, details = grpc.StatusCode.OK, ""
                except grpc.RpcError as exc:
                    code, details = exc.code(), exc.details() or ""
                print(f"gRPC load of a {label} name: {code.name} ({len(details)} chars)")
                verdicts.append(
                    (
                        f"gRPC load of a {label} name: INVALID_ARGUMENT that fits the metadata",
                        code == grpc.StatusCode.INVALID_ARGUMENT
                        and "\n" not in details
                        and len(details.encode()) <= ERROR_BYTES,
                    )
                )
        lines = server.log().splitlines()
        loaded = sum("successfully loaded 'simple'" in line for line in lines)
        forged = sum(line.startswith(FORGED_AT) for line in lines)
        print(f"log: {loaded} 'successfully loaded' lines, {forged} forged")
        verdicts.append(("no forged line in the log", loaded == 1 and forged == 0))
    finally:
        server.stop()
    return verdicts


# ----- issue #28 item 10: Python models' custom metrics ----------------------------------------
def custom_metrics_page() -> list[tuple[str, bool]]:
    """The `probe` model (harness/testmodels.py) tries each bad custom metric: each must raise
    in model.py, and /metrics must still parse, with its good family and none of the bad."""
    from prometheus_client.parser import text_string_to_metric_families

    repo = build_metrics_probe(Path(tempfile.mkdtemp(prefix="hostile-metrics-")))
    # --custom-metric-max-series 3: the probe's "too many series" case makes a fourth.
    flags = ["--model-control-mode", "explicit", "--load-model", "first"]
    server = start_server([repo], [*flags, "--custom-metric-max-series", "3"])
    verdicts: list[tuple[str, bool]] = []
    try:
        status, _ = post(server.http_port, "/v2/repository/models/probe/load", b"{}")
        assert status == 200, status
        body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]}
        status, reply = post(server.http_port, "/v2/models/probe/infer", json.dumps(body).encode())
        results = json.loads(json.loads(reply)["outputs"][0]["data"][0])
        raised = [case for case, seen in results.items() if seen.startswith("TritonModel")]
        print(f"custom metrics: {len(raised)} of {len(results)} bad cases raised in model.py")
        verdicts.append(("every bad custom metric raised in model.py", len(raised) == len(results)))
        with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
            page = response.read().decode()
        try:
            names = {f.name for f in text_string_to_metric_families(page)}
        except ValueError as exc:
            print(f"custom metrics: the page does not parse: {exc}")
            names = set()
        verdicts.append(
            (
                "/metrics parses, with the good family and none of the bad",
                "probe_good" in names
                and "nv_inference_count" in names
                and "injected_sample" not in page
                and "desc_injected" not in names,
            )
        )
    finally:
        server.stop()
    return verdicts


# ----- issue #28: client shared memory (items 1 and 6) ----------------------------------------
def build_shm_models(repo: Path) -> None:
    """BYTES in and out on the identity backend: `identity_bytes` ([-1]) and `two_strings` ([2])."""
    for name, dims in (("identity_bytes", "-1"), ("two_strings", "2")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "identity"\nmax_batch_size: 0\n'
            f'input [ {{ name: "INPUT" data_type: TYPE_STRING dims: [ {dims} ] }} ]\n'
            f'output [ {{ name: "OUTPUT" data_type: TYPE_STRING dims: [ {dims} ] }} ]\n'
        )


def _shm_file(data: bytes) -> str:
    """A fresh /dev/shm file holding `data`; its key."""
    name = f"ascend_hostile_{os.getpid()}_{time.monotonic_ns()}"
    with open(f"/dev/shm/{name}", "wb") as handle:
        handle.write(data)
    return "/" + name


def _register(port: int, region: str, key: str, byte_size: int) -> int:
    body = json.dumps({"key": key, "byte_size": byte_size}).encode()
    return post(port, f"/v2/systemsharedmemory/region/{region}/register", body)[0]


def _in_region(region: str, byte_size: int) -> dict:
    return {"parameters": {"shared_memory_region": region, "shared_memory_byte_size": byte_size}}


def _error(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", ""))
    except ValueError:
        return ""


def shm_truncation_verdicts(port: int, alive: Callable[[], bool]) -> list[tuple[str, bool]]:
    """A region's file truncated to 0, then named by an input and by an output."""
    key = _shm_file(np.arange(32, dtype=np.int32).tobytes())
    verdicts = []
    try:
        assert _register(port, "hostile_trunc", key, 128) == 200
        os.truncate(f"/dev/shm/{key[1:]}", 0)
        as_input = {
            "inputs": [
                {
                    "name": name,
                    "shape": [1, 16],
                    "datatype": "INT32",
                    **_in_region("hostile_trunc", 64),
                }
                for name in ("INPUT0", "INPUT1")
            ]
        }
        as_output = {
            **json.loads(SMALL),
            "outputs": [{"name": "OUTPUT0", **_in_region("hostile_trunc", 64)}],
        }
        for what, body in (("input", as_input), ("output", as_output)):
            try:
                status, reply = post(port, "/v2/models/simple/infer", json.dumps(body).encode())
            except (OSError, http.client.HTTPException):
                status, reply = 0, b""
            print(f"shm truncated under an {what}: {status} {_error(reply)!r}")
            verdicts.append(
                (
                    f"a truncated region named by an {what}: 400 naming it",
                    status == 400 and "'hostile_trunc'" in _error(reply),
                )
            )
        serving = alive() and post(port, "/v2/models/simple/infer", SMALL)[0] == 200
        verdicts.append(("the server serves after the truncated regions", serving))
        post(port, "/v2/systemsharedmemory/region/hostile_trunc/unregister", b"")
    finally:
        os.unlink(f"/dev/shm/{key[1:]}")
    return verdicts


def shm_bytes_verdicts(port: int, live: Poller, small: Poller) -> list[tuple[str, bool]]:
    """BYTES regions named by small requests: over the size limit (the issue's 64 MiB: 6.4 s of
    health held, 700 MB grown), and 5 million strings under it (parsed off the loop)."""
    verdicts = []
    cases = (
        ("64 MiB + 5 KiB of 1-byte strings", (64 * 1024 * 1024 + 5 * 1024) // 5, 1, 413),
        ("5 million 4-byte strings", 5_000_000, 4, 400),  # refused by two_strings' shape
    )
    for label, count, length, expected in cases:
        size = count * (4 + length)
        key = _shm_file((struct.pack("<I", length) + b"x" * length) * count)
        region = f"hostile_bytes_{length}"
        model = "identity_bytes" if expected == 413 else "two_strings"
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT",
                        "shape": [count],
                        "datatype": "BYTES",
                        **_in_region(region, size),
                    }
                ]
            }
        ).encode()
        reply: dict = {}

        def infer(body: bytes = body, model: str = model, reply: dict = reply) -> None:
            t0 = time.perf_counter()
            reply["status"], reply["body"] = post(port, f"/v2/models/{model}/infer", body)
            reply["secs"] = time.perf_counter() - t0

        try:
            assert _register(port, region, key, size) == 200
            waits, _ = phase(live, small, 0, infer)
            post(port, f"/v2/systemsharedmemory/region/{region}/unregister", b"")
        finally:
            os.unlink(f"/dev/shm/{key[1:]}")
        worst = max(waits, default=0.0)
        print(
            f"shm BYTES region, {label} ({len(body)}-byte request): answered {reply['status']} "
            f"in {reply['secs']:.2f} s {_error(reply['body'])[:120]!r}; live max {ms(worst)}"
        )
        verdicts.append(
            (f"BYTES region of {label}: answered {expected}", reply["status"] == expected)
        )
        verdicts.append((f"BYTES region of {label}: no live poll > 0.5 s", worst < 0.5))
    return verdicts


if __name__ == "__main__":
    sys.exit(main())
