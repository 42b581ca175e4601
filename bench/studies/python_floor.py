"""The floor of a Python server of ascend-serve's shape, beside ascend-serve and Triton.

Why: issue 27 asks for py_add over HTTP at 1.0x Triton's throughput with the server on one
core. What is left of our cost is flat (no function over a few per cent of the loop,
bench/FINDINGS.md 35), and compiling eleven hot-path modules with mypyc changed nothing
measurable (FINDINGS 36). This asks the other way round: what does the least Python server
that does the same job cost? It is ascend-serve's data path with every feature taken out:
one uvloop process parsing HTTP with httptools, each request's JSON header read with orjson
and its two binary inputs viewed with numpy; the requests of a loop turn batched (up to 8 rows,
none waiting when the worker is idle, so no timer) and sent to one worker process, which runs
py_add's model.py work (per request `a + b`, `a - b`, as float32) and sends the outputs back;
each answer a JSON header from orjson and the two outputs, written with one call. No
validation against a config, no statistics, metrics, traces, limits, timeouts, priorities,
cancellation, error table, plans, versions, gRPC. It answers only what perf_analyzer asks
(health, metadata, config, statistics with the real count, infer).

The three servers run in interleaved rounds, each with every process it starts pinned to CPU 0
and perf_analyzer on CPU 1 (bench/cpu_side_by_side.py's measurement); CPU per inference is the
process tree's over the inferences its statistics counted.

    .venv/bin/python -m bench.studies.python_floor [--rounds 3] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MODULE = "bench.studies.python_floor"
MODEL = "py_add"
MAX_ROWS = 8
ROW = 16  # FP32 [16] per input row
_COUNT = struct.Struct("<I")

_META = {
    "name": MODEL,
    "versions": ["1"],
    "platform": "python",
    "inputs": [{"name": n, "datatype": "FP32", "shape": [-1, ROW]} for n in ("INPUT0", "INPUT1")],
    "outputs": [
        {"name": n, "datatype": "FP32", "shape": [-1, ROW]} for n in ("OUTPUT0", "OUTPUT1")
    ],
}
_CONFIG = {
    "name": MODEL,
    "max_batch_size": MAX_ROWS,
    "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [ROW]} for n in ("INPUT0", "INPUT1")],
    "output": [
        {"name": n, "data_type": "TYPE_FP32", "dims": [ROW]} for n in ("OUTPUT0", "OUTPUT1")
    ],
    "dynamic_batching": {"max_queue_delay_microseconds": 100},
    "backend": "python",
}


# ----- the worker process ---------------------------------------------------------------------
def worker(fd: int) -> int:
    """Reads batches (row count, INPUT0 rows, INPUT1 rows), answers (OUTPUT0 rows, OUTPUT1
    rows), doing py_add's model.py work request by request."""
    sock = socket.socket(fileno=fd)
    while True:
        head = sock.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return 0
        (rows,) = _COUNT.unpack(head)
        size = 2 * rows * ROW * 4
        data = sock.recv(size, socket.MSG_WAITALL)
        inputs = np.frombuffer(data, np.float32).reshape(2, rows, ROW)
        sums, differences = [], []
        for a, b in zip(inputs[0], inputs[1], strict=True):
            sums.append((a + b).astype(np.float32))
            differences.append((a - b).astype(np.float32))
        sock.sendall(np.concatenate(sums).tobytes() + np.concatenate(differences).tobytes())


# ----- the server -----------------------------------------------------------------------------
def serve(port: int) -> int:
    import httptools
    import orjson
    import uvloop

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    ours, theirs = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-m", MODULE, "worker", "--fd", str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        cwd=ROOT,
    )
    theirs.close()
    ours.setblocking(False)
    pending: list[tuple[Any, np.ndarray, np.ndarray]] = []
    running: list[list[tuple[Any, np.ndarray, np.ndarray]]] = []
    state: dict[str, Any] = {"count": 0, "runs": 0, "flush_owed": False, "received": bytearray()}

    def answer(transport: Any, status: int, body: bytes, extra: bytes = b"") -> None:
        transport.write(
            b"HTTP/1.1 %d OK\r\ncontent-length: %d\r\n%s\r\n" % (status, len(body), extra) + body
        )

    def stats() -> bytes:
        count = state["count"]
        timing = {"count": count, "ns": 0}
        return orjson.dumps(
            {
                "model_stats": [
                    {
                        "name": MODEL,
                        "version": "1",
                        "inference_count": count,
                        "execution_count": state["runs"],
                        "inference_stats": {
                            k: timing
                            for k in (
                                "success",
                                "fail",
                                "queue",
                                "compute_input",
                                "compute_infer",
                                "compute_output",
                            )
                        },
                        "batch_stats": [],
                    }
                ]
            }
        )

    def flush() -> None:
        state["flush_owed"] = False
        if running or not pending:
            return
        batch = pending[:MAX_ROWS]
        del pending[:MAX_ROWS]
        running.append(batch)
        state["runs"] += 1
        a = np.concatenate([request[1] for request in batch])
        b = np.concatenate([request[2] for request in batch])
        ours.send(_COUNT.pack(len(batch)) + a.tobytes() + b.tobytes())

    def owe_flush() -> None:
        if not state["flush_owed"] and not running:
            state["flush_owed"] = True
            loop.call_soon(flush)

    def replied() -> None:
        received = state["received"]
        received += ours.recv(1 << 16)
        batch = running[0]
        size = 2 * len(batch) * ROW * 4
        if len(received) < size:
            return
        outputs = np.frombuffer(bytes(received[:size]), np.float32).reshape(2, len(batch), ROW)
        del received[:size]
        running.clear()
        for (transport, _, _), out0, out1 in zip(batch, outputs[0], outputs[1], strict=True):
            header = orjson.dumps(
                {
                    "model_name": MODEL,
                    "model_version": "1",
                    "outputs": [
                        {
                            "name": name,
                            "datatype": "FP32",
                            "shape": [1, ROW],
                            "parameters": {"binary_data_size": out.nbytes},
                        }
                        for name, out in (("OUTPUT0", out0), ("OUTPUT1", out1))
                    ],
                }
            )
            transport.writelines(
                [
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                    b"inference-header-content-length: %d\r\ncontent-length: %d\r\n\r\n"
                    % (len(header), len(header) + out0.nbytes + out1.nbytes),
                    header,
                    out0.tobytes(),
                    out1.tobytes(),
                ]
            )
        state["count"] += len(batch)
        if pending:
            flush()

    loop.add_reader(ours.fileno(), replied)

    class Connection(asyncio.Protocol):
        def __init__(self) -> None:
            self.parser = httptools.HttpRequestParser(self)
            self.url = b""
            self.header_length = 0
            self.body: list[bytes] = []

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_message_begin(self) -> None:
            self.url, self.header_length, self.body = b"", 0, []

        def on_url(self, url: bytes) -> None:
            self.url += url

        def on_header(self, name: bytes, value: bytes) -> None:
            if name.lower() == b"inference-header-content-length":
                self.header_length = int(value)

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            path = self.url.split(b"?")[0]
            if path.endswith(b"/infer"):
                self.infer(b"".join(self.body))
            elif path.startswith(b"/v2/health"):
                answer(self.transport, 200, b"")
            elif path.endswith(b"/stats"):
                answer(self.transport, 200, stats())
            elif path.endswith(b"/config"):
                answer(self.transport, 200, orjson.dumps(_CONFIG))
            elif path.startswith(b"/v2/models/"):
                answer(self.transport, 200, orjson.dumps(_META))
            else:
                answer(self.transport, 200, orjson.dumps({"name": "floor", "extensions": []}))

        def infer(self, body: bytes) -> None:
            length = self.header_length or len(body)
            header = orjson.loads(body[:length])
            arrays = {}
            offset = length
            view = memoryview(body)
            for item in header["inputs"]:
                size = item["parameters"]["binary_data_size"]
                arrays[item["name"]] = np.frombuffer(view[offset : offset + size], np.float32)
                offset += size
            pending.append((self.transport, arrays["INPUT0"], arrays["INPUT1"]))
            owe_flush()

    async def main() -> None:
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)  # a clean exit (a profiler writes)
        server = await loop.create_server(Connection, "127.0.0.1", port)
        async with server:
            await stop.wait()

    try:
        loop.run_until_complete(main())
    finally:
        child.kill()
    return 0


# ----- the driver -----------------------------------------------------------------------------
def run(rounds: int, concurrency: int, out_dir: Path) -> dict[str, list[Any]]:
    from bench import cpu_side_by_side as side
    from bench.cpu_time import process_cpu
    from bench.served import CONVERGE_FLAGS, model_stats
    from harness.serverproc import free_port

    perf_analyzer = os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")
    if not perf_analyzer:
        raise SystemExit("perf_analyzer not found (set PERF_ANALYZER)")
    repo = out_dir / "models"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(ROOT / "bench" / "models" / MODEL, repo / MODEL)
    dist = side.find_triton()
    backends = side.triton_backends(dist, out_dir) if dist is not None else None
    samples: dict[str, list[tuple[Any, float, float]]] = {
        "python floor": [],
        "ascend-serve": [],
        "triton": [],
    }
    for round_no in range(1, rounds + 1):
        for name in samples:
            if name == "triton" and (dist is None or backends is None):
                continue
            if name == "python floor":
                port = free_port()
                server = side.PinnedServer(
                    name,
                    [sys.executable, "-m", MODULE, "serve", "--port", str(port)],
                    dict(os.environ, PYTHONPATH=str(ROOT)),
                    out_dir / f"floor-round{round_no}.log",
                    port,
                    free_port(),
                    cwd=ROOT,
                )
            elif name == "ascend-serve":
                server = side.start_ours(repo, out_dir, round_no)
            else:
                assert dist is not None and backends is not None
                server = side.start_triton(dist, backends, repo, out_dir, round_no)
            try:
                server.wait_ready()
                root0, tree0 = process_cpu(server.process.pid), server.tree_cpu()
                sample, _ = side.measure(
                    perf_analyzer,
                    server,
                    MODEL,
                    "http",
                    round_no,
                    out_dir,
                    CONVERGE_FLAGS,
                    concurrency,
                )
                root = (process_cpu(server.process.pid) - root0) / max(
                    1e-9, server.tree_cpu() - tree0
                )
                stats = model_stats(f"http://{server.http}", MODEL) or {}
            finally:
                server.stop()
            batch = int(stats.get("inference_count", 0)) / max(
                1, int(stats.get("execution_count", 0))
            )
            samples[name].append((sample, batch, root))
            print(
                f"  round {round_no} {name}: "
                + (
                    sample.error
                    or f"{sample.infer_per_sec:,.0f} inf/s, {sample.cpu_us:,.0f} µs "
                    f"({root * sample.cpu_us:,.0f} in the first process), batch {batch:.1f}"
                )
            )
    return samples


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        return worker(int(argv[argv.index("--fd") + 1]))
    if argv and argv[0] == "serve":
        return serve(int(argv[argv.index("--port") + 1]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    out_dir = Path(tempfile.mkdtemp(prefix="python-floor-"))
    samples = run(args.rounds, args.concurrency, out_dir)
    print(f"\npy_add over HTTP, c={args.concurrency}, medians of {args.rounds} rounds:")
    print(
        "| server | inf/s | server CPU µs/inf | of it, first process | mean batch | rounds (µs) |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for name, rows in samples.items():
        good = [row for row in rows if not row[0].error]
        if not good:
            continue
        print(
            f"| {name} | {statistics.median(s.infer_per_sec for s, _, _ in good):,.0f} | "
            f"{statistics.median(s.cpu_us for s, _, _ in good):,.0f} | "
            f"{statistics.median(s.cpu_us * root for s, _, root in good):,.0f} | "
            f"{statistics.median(batch for _, batch, _ in good):.1f} | "
            + ", ".join(f"{s.cpu_us:,.0f}" for s, _, _ in good)
            + " |"
        )
    shutil.rmtree(out_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
