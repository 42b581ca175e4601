"""The model owner's CPU per handed-over request at its wall: the owner kept saturated by a feeder.

Why: bench/handover_cost.py measures h with a real frontend process, which on this 2-core
machine shares the owner's core and feeds it far below the owner's own rate (gRPC: about 1,800
requests/s, g ~ 300 µs each). Fed that slowly, the owner sleeps between frames and wakes for
nearly every request (1.3 voluntary switches per gRPC request, 0.4 over HTTP, measured), and
that wake-up cost is part of h; at the wall of the throughput-vs-cores model (bench/FINDINGS.md
9.9), many frontend processes keep the owner busy and frames hold many requests. Here the owner
is a real server (`--frontend-processes 2`) whose one frontend process is replaced by a feeder
(this module, run the way server/multiprocess/pool.py runs its child): a RemoteCore with no
listeners, keeping `--window` requests in flight over the real link, each exactly what that
protocol's frontend hands over (a gRPC ModelInferRequest decoded by protocol/grpc/codec.py and
sent with the ModelInfer endpoint; an HTTP request with binary inputs and outputs). The owner
runs pinned to CPU 0 alone, the feeder to CPU 1; the owner's CPU per answered request is h at
saturation (its loop never waits), with the batches that load forms.

    .venv/bin/python -m bench.studies.owner_wall [--rounds 3] [--seconds 5] [--window 64]
    .venv/bin/python -m bench.studies.owner_wall --tree base=../base --tree new=.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import types
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.cpu_time import process_cpu
from examples.build_repository import make_simple_model, simple_config, write_model_dir
from harness.procutil import children_running
from harness.serverproc import free_port, loopback_listeners, wait_until_ready

ROOT = Path(__file__).resolve().parents[2]
MODULE = "bench.studies.owner_wall"
MODEL = "simple_batching"
OWNER_CPU, FEEDER_CPU = 0, 1
ENV_PROTOCOL, ENV_WINDOW = "OWNER_WALL_PROTOCOL", "OWNER_WALL_WINDOW"


# ----- the feeder (the owner's child) ------------------------------------------------------
def _template(protocol: str) -> tuple[Any, str]:
    """A function making the request that protocol's frontend hands over, and its endpoint."""
    from protocol.errors import GRPC_INFER_RPC, HTTP_ENDPOINT
    from protocol.types import InferRequest, RequestedOutput, Tensor

    data = np.arange(16, dtype=np.int32)
    if protocol == "grpc":
        from protocol.grpc.codec import decode_infer_request
        from protocol.proto import grpc_service_pb2 as pb

        message = pb.ModelInferRequest(model_name=MODEL)
        for name in ("INPUT0", "INPUT1"):
            message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            message.raw_input_contents.append(data.tobytes())
        wire = message.SerializeToString()
        return lambda: decode_infer_request(pb.ModelInferRequest.FromString(wire)), GRPC_INFER_RPC
    raw = data.tobytes()

    def http() -> InferRequest:
        view = np.frombuffer(raw, np.int32).reshape(1, 16)
        inputs = [
            Tensor(name, "INT32", (1, 16), view, {"binary_data_size": 64})
            for name in ("INPUT0", "INPUT1")
        ]
        outputs = [RequestedOutput(name, True) for name in ("OUTPUT0", "OUTPUT1")]
        return InferRequest(MODEL, "", "", inputs, outputs)

    return http, HTTP_ENDPOINT


async def _feed(fds: list[int], shm_bytes: int, quick: Any, slow: Any, settings: Any) -> None:
    from server.multiprocess.arena import Arena
    from server.multiprocess.remote_core import RemoteCore

    loop = asyncio.get_running_loop()
    infer_fd, _, _, from_owner_fd, to_owner_fd = fds
    core = RemoteCore(
        settings, quick, slow, loop, Arena(shm_bytes, to_owner_fd), Arena(shm_bytes, from_owner_fd)
    )
    await loop.connect_accepted_socket(lambda: core.link, socket.socket(fileno=infer_fd))
    core.started = True
    await asyncio.to_thread(quick.call, "listening")
    make, endpoint = _template(os.environ.get(ENV_PROTOCOL, "grpc"))

    async def one() -> None:
        while not core.link.closed:
            try:
                await core.infer(make(), None, endpoint)
            except Exception:
                await asyncio.sleep(0.01)  # the owner not ready or stopping

    workers = [asyncio.ensure_future(one()) for _ in range(int(os.environ.get(ENV_WINDOW, "64")))]
    while not core.link.closed:
        await asyncio.sleep(0.2)
    for worker in workers:
        worker.cancel()


def feeder(argv: list[str]) -> int:
    from backends.python.worker.main import die_with_parent
    from server.multiprocess.remote_core import ControlClient
    from server.net.loop import new_event_loop

    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--fds", required=True)
    parser.add_argument("--shm-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    os.sched_setaffinity(0, {FEEDER_CPU % (os.cpu_count() or 1)})  # off the owner's core
    fds = [int(fd) for fd in args.fds.split(",")]
    quick = Connection(fds[1])
    settings = quick.recv()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(
        _feed(
            fds, args.shm_bytes, ControlClient(quick), ControlClient(Connection(fds[2])), settings
        )
    )
    return 0


def owner(argv: list[str]) -> int:
    """The server (run as `python -m server` runs it), whose frontend process is this module's
    feeder."""
    import runpy

    import server.multiprocess.pool as pool

    real = subprocess.Popen

    def popen(args: list[str], *rest: Any, **kwargs: Any) -> subprocess.Popen:
        args = [MODULE if a == "server.multiprocess.child" else a for a in args]
        return real(args, *rest, **kwargs)

    # pool's own `subprocess`, holding only the Popen it calls; the rest keep the real one
    shim = types.ModuleType("subprocess")
    vars(shim)["Popen"] = popen
    pool.subprocess = shim
    sys.argv = ["server", *argv]
    try:
        runpy.run_module("server", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        return int(done.code or 0)
    return 0


# ----- the driver -------------------------------------------------------------------------
def _counts(base: str) -> tuple[int, int]:
    stats = httpx.get(f"{base}/v2/models/{MODEL}/stats", timeout=5.0).json()["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def measure(tree: Path, repo: Path, protocol: str, window: int, seconds: float, log: Path) -> dict:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    command = [
        sys.executable,
        "-m",
        MODULE,
        "owner",
        "--model-repository",
        str(repo),
        *loopback_listeners(http_port, grpc_port, metrics_port),
        "--frontend-processes",
        "2",
    ]
    env = dict(
        os.environ,
        PYTHONPATH=str(tree),
        PYTHONSAFEPATH="1",
        **{ENV_PROTOCOL: protocol, ENV_WINDOW: str(window)},
    )
    os.sched_setaffinity(0, {OWNER_CPU})
    try:
        with open(log, "wb") as out:
            process = subprocess.Popen(command, env=env, cwd=str(tree), stdout=out, stderr=out)
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    base = f"http://127.0.0.1:{http_port}"
    try:
        if not wait_until_ready(base, process, 60):
            raise RuntimeError(f"owner did not start: {log.read_text()[-2000:]}")
        if not children_running(process.pid, MODULE.encode()):
            raise RuntimeError("no feeder")
        time.sleep(1.5)  # warm up
        done0, runs0 = _counts(base)
        cpu0, t0 = process_cpu(process.pid), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = process_cpu(process.pid), time.monotonic()
        done1, runs1 = _counts(base)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    served = max(done1 - done0, 1)
    return {
        "infer_per_sec": served / (t1 - t0),
        "owner_us": 1e6 * (cpu1 - cpu0) / served,
        "batch": served / max(runs1 - runs0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "owner":
        return owner(argv[1:])
    if "--fds" in argv:
        return feeder(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--delay-us", type=int, default=500)
    parser.add_argument("--protocol", choices=["http", "grpc"], action="append")
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH (A/B: twice)")
    args = parser.parse_args(argv)
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree]
    trees = trees or [("this tree", ROOT)]
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        config = simple_config(MODEL, 64, max_queue_delay_us=args.delay_us)
        write_model_dir(repo, MODEL, make_simple_model(), config)
        for round_no in range(args.rounds):
            for label, tree in trees:
                for protocol in args.protocol or ["http", "grpc"]:
                    log = Path(tmp) / f"owner-{round_no}-{protocol}.log"
                    r = measure(tree, repo, protocol, args.window, args.seconds, log)
                    print(
                        f"  round {round_no + 1} {label} {protocol}: {r['infer_per_sec']:,.0f} "
                        f"req/s, owner {r['owner_us']:.1f} µs/req, batch {r['batch']:.1f}",
                        flush=True,
                    )
                    figures.setdefault(f"{label} {protocol}", []).append(r["owner_us"])
    for key, values in figures.items():
        print(f"{key}: median h {statistics.median(values):.1f} µs ({len(values)} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
