"""The floor under the HTTP server's CPU per KB: a bare uvloop server that only receives each
request body into a buffer and sends it back, at the sizes of bench/studies/npu_copies.py.

    .venv/bin/python -m bench.studies.http_floor [--sizes 4096,153600,614400,4194304]
        [--rounds 2] [--concurrency 4]

Why: issue 26 asks for <= 0.3 µs of server CPU per KB of tensor data over HTTP binary, the
answer as large as the request. What no HTTP server on this host can avoid is the kernel's two
copies (the socket into the process's buffer, the answer back into the socket) and TCP's own
work; this measures exactly that, with nothing else: the body read by a `BufferedProtocol`
straight into an `np.empty` of its Content-Length (as server/http/receive.py does; `reuse`
reads every body into one buffer instead, to show what a fresh buffer per request costs), and
the answer (a minimal JSON header naming OUTPUT0, then the input's bytes as they are) written
with one `writelines`. The client is npu_copies's own (tritonclient, binary tensors, the same
request counts), so the server sees the same reads and writes as the real one. The server runs
pinned to CPU 0, the client to CPU 1; CPU is the server process's, per request and per KB of
request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np

from bench.cpu_time import process_cpu
from bench.studies.npu_copies import drive, requests_for

SIZES = (4096, 150 * 1024, 600 * 1024, 4 << 20)
SERVER_CPU, CLIENT_CPU = 0, 1


def serve(mode: str) -> None:
    """The bare server (run in its own process): prints its port, serves until killed."""
    import uvloop

    from server.malloc import steady_malloc

    steady_malloc()  # the server's allocator thresholds (server/malloc.py)

    class Echo(asyncio.BufferedProtocol):
        """Reads `POST .../infer` with a binary INPUT0 into one array; answers OUTPUT0 = it."""

        def __init__(self) -> None:
            self.head = bytearray(8192)
            self.filled = 0
            self.body: np.ndarray | None = None
            self.fixed: np.ndarray | None = None
            self.json_length = 0

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def get_buffer(self, sizehint: int) -> memoryview:
            if self.body is None:
                return memoryview(self.head)[self.filled :]
            return memoryview(self.body)[self.filled :]  # type: ignore[arg-type]

        def buffer_updated(self, nbytes: int) -> None:
            self.filled += nbytes
            if self.body is None:
                end = self.head.find(b"\r\n\r\n", 0, self.filled)
                if end < 0:
                    return
                fields = {}
                for line in bytes(self.head[:end]).split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    fields[name.strip().lower()] = value.strip()
                size = int(fields[b"content-length"])
                self.json_length = int(fields[b"inference-header-content-length"])
                extra = self.filled - end - 4
                if mode == "reuse":
                    if self.fixed is None or len(self.fixed) != size:
                        self.fixed = np.empty(size, np.uint8)
                    self.body = self.fixed
                else:
                    self.body = np.empty(size, np.uint8)
                self.body[:extra] = np.frombuffer(self.head, np.uint8, extra, end + 4)
                self.filled = extra
            if self.filled == len(self.body):
                data = memoryview(self.body)[self.json_length :]  # type: ignore[arg-type]
                document = {
                    "model_name": "onnx_id",
                    "model_version": "1",
                    "outputs": [
                        {
                            "name": "OUTPUT0",
                            "datatype": "UINT8",
                            "shape": [1, len(data)],
                            "parameters": {"binary_data_size": len(data)},
                        }
                    ],
                }
                header = json.dumps(document).encode()
                head = (
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                    b"inference-header-content-length: %d\r\ncontent-length: %d\r\n\r\n"
                    % (len(header), len(header) + len(data))
                )
                self.transport.writelines([head + header, data])  # type: ignore[attr-defined]
                self.body, self.filled = None, 0

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


def cpu_per_request(pid: int, target: Any, size: int, connections: int) -> tuple[int, float]:
    """Warm the server at `target`, then (requests, server CPU seconds) for one measured run of
    binary `onnx_id` requests of `size` bytes: the measure http_floor and http_body_ab share."""
    drive(target, "onnx_id", "http", size, max(connections * 2, 16), connections)
    count = requests_for(size)
    before = process_cpu(pid)
    drive(target, "onnx_id", "http", size, count, connections)
    return count, process_cpu(pid) - before


def point(mode: str, size: int, connections: int) -> dict[str, float | str]:
    """One bare server, warmed, then the request count of bench/studies/npu_copies.py."""
    command = ["taskset", "-c", str(SERVER_CPU), sys.executable, "-m", "bench.studies.http_floor"]
    process = subprocess.Popen([*command, "--serve", mode], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        target = SimpleNamespace(http_port=int(process.stdout.readline()))
        count, cpu = cpu_per_request(process.pid, target, size, connections)
    finally:
        process.kill()
        process.wait()
    us = 1e6 * cpu / count
    return {
        "mode": mode,
        "size": size,
        "requests": count,
        "us_per_request": us,
        "us_per_kb": us / (size / 1024),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    os.sched_setaffinity(0, {CLIENT_CPU})
    for size in [int(s) for s in args.sizes.split(",")]:
        for round_no in range(args.rounds):
            for mode in ("fresh", "reuse"):
                row = point(mode, size, args.concurrency)
                print(json.dumps({**row, "round": round_no}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
