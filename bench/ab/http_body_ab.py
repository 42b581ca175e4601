"""The HTTP frontend alone, as an A/B of two trees: CPU per request and per KB of each tree's
real HTTP listener (protocol, body reader, decode, encode, answer write) over a core that only
echoes the inputs back as outputs, so no scheduler, backend or batch gather is counted.

    .venv/bin/python -m bench.ab.http_body_ab --a ../base-checkout [--b .] [--rounds 3]
        [--sizes 4096,153600,614400,4194304] [--concurrency 4] [--side-by-side SLICES]

Why: on this shared 2-core machine the end-to-end figures of bench/studies/npu_copies.py move
by 20-50 %, which hides a change to the frontend's copies among the model's, the batcher's
and the neighbours' CPU. Here only what the frontend does per byte is left, next to
bench/studies/http_floor.py (the same client against a bare server that does nothing but
receive and send). Each server runs from its own tree (PYTHONPATH, cwd) pinned to CPU 0, the
client (bench/studies/npu_copies.py's: tritonclient, binary tensors, the same request counts)
on CPU 1; rounds alternate A B A B, each followed by the floor's bare server ("floor"). With
`--side-by-side N` both servers run at once and N slices of requests alternate between them
(CPU from schedstat), which this machine's drifting load cannot tilt towards one tree.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SIZES = (4096, 150 * 1024, 600 * 1024, 4 << 20)
SERVER_CPU, CLIENT_CPU = 0, 1


def serve_echo(port: int) -> None:
    """One tree's HTTP listener over an echoing core (run with that tree on PYTHONPATH)."""
    import asyncio

    from protocol.types import InferResponse, Tensor
    from server.http.listener import http_frontend_listener
    from server.malloc import steady_malloc
    from server.net.loop import new_event_loop
    from server.settings import ServerSettings

    steady_malloc()
    settings = ServerSettings(http_address="127.0.0.1", http_port=port)

    class EchoCore:
        """The part of CoreAPI the HTTP infer path calls: every input comes back as OUTPUT0."""

        may_trace = False
        propagates_trace = False

        def __init__(self) -> None:
            self.settings = settings

        async def infer(self, request: Any, record: Any = None) -> Any:
            outputs = [
                Tensor("OUTPUT0", tensor.datatype, tensor.shape, tensor.data)
                for tensor in request.inputs
            ]
            return InferResponse(request.model_name, "1", outputs=outputs)

    listener, _offload = http_frontend_listener(EchoCore(), settings)  # type: ignore[arg-type]
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    print("ready", flush=True)
    loop.run_until_complete(listener.serve())


def start(tree: Path) -> tuple[subprocess.Popen[str], SimpleNamespace]:
    """One tree's echo server, listening; the process and the target `drive` takes."""
    from harness.serverproc import free_port

    port = free_port()
    command = ["taskset", "-c", str(SERVER_CPU), sys.executable, __file__, "--serve", str(port)]
    env = dict(os.environ, PYTHONPATH=str(tree))
    process = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while True:  # until uvicorn listens
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.1)
    return process, SimpleNamespace(http_port=port)


def side_by_side(a: Path, b: Path, size: int, slices: int, per: int, connections: int) -> dict:
    """Both trees' servers up at once; slices of `per` requests alternate A B B A ...; µs per
    request over all slices (and per slice), so the neighbours' load falls on both alike."""
    from bench.cpu_time import task_ns
    from bench.studies.npu_copies import drive

    servers = {"A": start(a), "B": start(b)}
    spent = {"A": 0, "B": 0}
    rounds: dict[str, list[float]] = {"A": [], "B": []}
    try:
        for _, target in servers.values():
            drive(target, "onnx_id", "http", size, max(connections * 2, 16), connections)  # type: ignore[arg-type]
        for index in range(slices):
            for label in ("A", "B") if index % 2 == 0 else ("B", "A"):
                process, target = servers[label]
                before = task_ns(process.pid)
                drive(target, "onnx_id", "http", size, per, connections)  # type: ignore[arg-type]
                used = task_ns(process.pid) - before
                spent[label] += used
                rounds[label].append(round(used / per / 1000, 1))
    finally:
        for process, _ in servers.values():
            process.kill()
            process.wait()
    us = {label: spent[label] / slices / per / 1000 for label in spent}
    return {"size": size, "A_us": us["A"], "B_us": us["B"], "ratio": us["B"] / us["A"], **rounds}


def point(tree: Path, size: int, connections: int) -> dict[str, Any]:
    from bench.studies.http_floor import cpu_per_request

    process, target = start(tree)
    try:
        count, cpu = cpu_per_request(process.pid, target, size, connections)
    finally:
        process.kill()
        process.wait()
    us = 1e6 * cpu / count
    return {"size": size, "requests": count, "us_per_request": us, "us_per_kb": us / (size / 1024)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--a", type=Path, help="the base tree")
    parser.add_argument("--b", type=Path, default=ROOT, help="the changed tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--no-floor", dest="floor", action="store_false", help="skip bench/studies/http_floor"
    )
    parser.add_argument(
        "--side-by-side",
        type=int,
        metavar="SLICES",
        help="run A and B at once, alternating this many slices of requests per size",
    )
    args = parser.parse_args(argv)
    if args.serve:
        serve_echo(args.serve)
        return 0
    if args.a is None:
        parser.error("--a is required")
    from bench.studies.http_floor import point as floor_point

    os.sched_setaffinity(0, {CLIENT_CPU})
    if args.side_by_side:
        for size in [int(s) for s in args.sizes.split(",")]:
            per = max(16, min(300, (64 << 20) // size))
            row = side_by_side(
                args.a.resolve(), args.b.resolve(), size, args.side_by_side, per, args.concurrency
            )
            print(json.dumps(row), flush=True)
        return 0
    for size in [int(s) for s in args.sizes.split(",")]:
        for round_no in range(args.rounds):
            for label, tree in (("A", args.a), ("B", args.b)):
                row = point(tree.resolve(), size, args.concurrency)
                print(json.dumps({"tree": label, "round": round_no, **row}), flush=True)
            if args.floor:
                row = floor_point("fresh", size, args.concurrency)
                print(json.dumps({"tree": "floor", "round": round_no, **row}), flush=True)
    return 0


if __name__ == "__main__":
    if "--serve" in sys.argv:  # the server's own tree first, not this script's folder
        sys.path[0] = os.environ.get("PYTHONPATH", sys.path[0])
    raise SystemExit(main())
