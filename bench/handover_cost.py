"""The CPU one request costs each process, with and without a frontend process in between.

Why: with --frontend-processes the model owner's CPU per handed-over request (h) sets the
ceiling of the whole server, however many frontend processes decode in front of it. Here the
load goes only where it is meant to: for N = 1, to the server itself (f: the owner's CPU for a
request it decodes, runs and encodes); for N = 2, only over connections that the kernel gave
to the frontend process (the others are closed before the run), so the owner's CPU over the
requests is h with no estimate involved, and the frontend process's is g. The client is a
small closed loop (asyncio, raw HTTP/1.1 keep-alive with binary tensors, or grpc.aio on one
channel), `--connections` of them, in this process; CPU is read from /proc, so the numbers do
not depend on how fast the client is, only the throughput does. bench/FINDINGS.md 9.9 uses
them.

The server and its children run pinned to CPU 0, this client to CPU 1 (as the rest of bench/),
so that the owner, the frontend process and the client do not trade places on two cores. With
`--tree LABEL=PATH` given twice, each round starts each tree's server in turn (A B A B ...),
for an A/B of two source trees in one run; `--processes 2` measures h and g alone.

    .venv/bin/python -m bench.handover_cost [--seconds 8] [--rounds 2]
    .venv/bin/python -m bench.handover_cost --tree base=../base --tree new=. --processes 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.cpu_time import process_cpu
from examples.build_repository import (
    build_simple,
    build_simple_batching,
    make_simple_model,
    simple_config,
    write_model_dir,
)
from harness.procutil import connection_peers, frontend_children
from harness.serverproc import ServerProcess, start_server

MODEL = "simple_batching"  # add/sub of [16] INT32 with dynamic batching; or "simple"
SERVER_CPU, CLIENT_CPU = 0, 1  # as bench/cpu_side_by_side.py
ROOT = Path(__file__).resolve().parents[1]


def _all_cpus() -> set[int]:
    return set(range(os.cpu_count() or 1))


def start_pinned(repo: Path, processes: int, log_dir: Path, tree: Path = ROOT) -> ServerProcess:
    """A server from `tree` whose processes and threads all run on SERVER_CPU (they inherit
    this process's affinity at their start); this process then runs on CLIENT_CPU."""
    cpus = _all_cpus()
    pin = len(cpus) > 1
    if pin:
        os.sched_setaffinity(0, {SERVER_CPU})
    try:
        # PYTHONSAFEPATH: `-m server` does not put the working directory first on sys.path,
        # so PYTHONPATH alone says which tree runs.
        env = {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"} if tree != ROOT else None
        server = start_server(
            [repo], ["--frontend-processes", str(processes)], env=env, log_dir=log_dir
        )
    finally:
        if pin:
            os.sched_setaffinity(0, {CLIENT_CPU})
    return server


def _http_request(port: int) -> bytes:
    data = np.arange(16, dtype=np.int32).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": [1, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 64},
                }
                for name in ("INPUT0", "INPUT1")
            ],
            "outputs": [
                {"name": "OUTPUT0", "parameters": {"binary_data": True}},
                {"name": "OUTPUT1", "parameters": {"binary_data": True}},
            ],
        }
    ).encode()
    body = header + data + data
    return (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: "
        f"{len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _http_connections(
    port: int, count: int, wanted: Callable[[int], bool]
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """`count` keep-alive connections whose server side `wanted(pid)` accepts."""
    kept: list = []
    for _ in range(200):
        opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(8)]
        await asyncio.sleep(0.05)
        peers = connection_peers(port)
        for reader, writer in opened:
            local = writer.get_extra_info("sockname")[1]
            if len(kept) < count and wanted(peers.get(local, -1)):
                kept.append((reader, writer))
            else:
                writer.close()
        if len(kept) >= count:
            return kept
    raise RuntimeError("could not get the connections wanted")


def measure(
    server: ServerProcess,
    protocol: str,
    connections: int,
    seconds: float,
    wanted: Callable[[int], bool],
) -> dict[str, float]:
    """Requests per second and CPU µs per request of the owner and each frontend process."""
    pids = [server.pid, *frontend_children(server.pid)]
    result: dict[str, float] = {}

    async def run() -> int:
        deadline = time.monotonic() + 3600
        if protocol == "http":
            pairs = await _http_connections(server.http_port, connections, wanted)
            done = 0

            async def one_http(reader: Any, writer: Any) -> None:
                nonlocal done
                request = _http_request(server.http_port)
                while time.monotonic() < deadline:
                    writer.write(request)
                    head = await reader.readuntil(b"\r\n\r\n")
                    if not head.startswith(b"HTTP/1.1 200"):
                        raise RuntimeError(head.decode(errors="replace"))
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    await reader.readexactly(length)
                    done += 1

            workers = [one_http(r, w) for r, w in pairs]
        else:
            channel, stub, message = await _grpc_channel(server.grpc_port, wanted)
            done = 0

            async def one_grpc() -> None:
                nonlocal done
                while time.monotonic() < deadline:
                    await stub(message)
                    done += 1

            workers = [one_grpc() for _ in range(connections)]
        tasks = [asyncio.ensure_future(w) for w in workers]
        await asyncio.sleep(1.0)  # warm up
        start_done, start = done, time.monotonic()
        before = {pid: process_cpu(pid) for pid in pids}
        counts_before = await asyncio.to_thread(_counts, server)
        await asyncio.sleep(seconds)
        after = {pid: process_cpu(pid) for pid in pids}
        counts_after = await asyncio.to_thread(_counts, server)
        served = done - start_done
        elapsed = time.monotonic() - start
        deadline = 0.0
        await asyncio.gather(*tasks, return_exceptions=True)
        result["infer_per_sec"] = served / elapsed
        executions = counts_after[1] - counts_before[1]
        result["batch"] = (counts_after[0] - counts_before[0]) / max(executions, 1)
        result["owner_us"] = 1e6 * (after[server.pid] - before[server.pid]) / max(served, 1)
        result["frontend_us"] = 1e6 * sum(after[p] - before[p] for p in pids[1:]) / max(served, 1)
        return served

    asyncio.run(run())
    return result


def _counts(server: ServerProcess) -> tuple[int, int]:
    """The model's inference and execution counts (their ratio over a run: the mean batch)."""
    import httpx

    stats = httpx.get(f"{server.base}/v2/models/{MODEL}/stats", timeout=5.0).json()
    entry = stats["model_stats"][0]
    return int(entry["inference_count"]), int(entry["execution_count"])


async def _grpc_channel(port: int, wanted: Callable[[int], bool]) -> tuple[Any, Any, Any]:
    """One gRPC channel whose connection landed where `wanted` says."""
    import grpc

    from protocol.proto import grpc_service_pb2 as pb
    from protocol.proto import grpc_service_pb2_grpc as pb_grpc

    message = pb.ModelInferRequest(model_name=MODEL)
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    for _ in range(100):
        before = set(connection_peers(port))
        channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        stub = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        await stub(message)
        peers = connection_peers(port)
        new = [pid for peer, pid in peers.items() if peer not in before]
        if len(new) == 1 and wanted(new[0]):
            return channel, stub, message
        await channel.close()
    raise RuntimeError("could not get a gRPC connection where wanted")


@dataclass
class HandoverCosts:
    """Median CPU µs per request: f (owner alone), h (owner, handed over), g (frontend process),
    and requests/s, per protocol; `model` and `connections` say what load it was."""

    model: str
    connections: int
    rounds: int
    figures: dict[str, list[float]] = field(default_factory=dict)

    def median(self, protocol: str, processes: int, name: str) -> float:
        values = self.figures.get(f"{protocol} N={processes} {name}", [])
        return statistics.median(values) if values else float("nan")

    def costs(self, protocol: str) -> tuple[float, float, float]:
        return (
            self.median(protocol, 1, "owner_us"),
            self.median(protocol, 2, "owner_us"),
            self.median(protocol, 2, "frontend_us"),
        )


def ceiling(f: float, h: float, g: float, processes: int) -> float:
    """Requests/s that N accepting processes on N free cores can serve (bench/FINDINGS.md 9.9):
    each takes 1/N of the connections; the owner spends f on its own share and h on every
    handed-over request, each frontend process g on its own share."""
    owner = 1e6 * processes / (f + (processes - 1) * h)  # f, h, g in µs
    return owner if processes == 1 else min(owner, 1e6 * processes / g)


def run(
    rounds: int = 2,
    seconds: float = 8.0,
    model: str = "simple_batching",
    connections: int = 16,
    protocols: tuple[str, ...] = ("http", "grpc"),
    progress: Callable[[str], None] = print,
    counts: tuple[int, ...] = (1, 2),
    tree: Path = ROOT,
) -> HandoverCosts:
    return run_trees(
        rounds, seconds, model, connections, protocols, progress, counts, [("", tree)]
    )[""]


def run_trees(
    rounds: int,
    seconds: float,
    model: str,
    connections: int,
    protocols: tuple[str, ...],
    progress: Callable[[str], None],
    counts: tuple[int, ...],
    trees: list[tuple[str, Path]],
    delay_us: int | None = None,
) -> dict[str, HandoverCosts]:
    """Each round measures every tree in turn (A B A B ...); the costs per tree's label.
    `delay_us`: simple_batching's max queue delay instead of its 500 µs (a longer one forms
    the batches a busier owner would see, from a load this machine can make)."""
    global MODEL
    MODEL = model
    results = {label: HandoverCosts(model, connections, rounds) for label, _ in trees}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        build_simple(repo)
        if delay_us is None:
            build_simple_batching(repo)
        else:
            config = simple_config("simple_batching", 64, max_queue_delay_us=delay_us)
            write_model_dir(repo, "simple_batching", make_simple_model(), config)
        try:
            for round_no in range(rounds):
                for label, tree in trees:
                    for processes in counts:
                        _round(
                            results[label],
                            label,
                            tree,
                            repo,
                            Path(tmp),
                            round_no,
                            processes,
                            protocols,
                            connections,
                            seconds,
                            progress,
                        )
        finally:
            os.sched_setaffinity(0, _all_cpus())
    return results


def _round(
    result: HandoverCosts,
    label: str,
    tree: Path,
    repo: Path,
    log_dir: Path,
    round_no: int,
    processes: int,
    protocols: tuple[str, ...],
    connections: int,
    seconds: float,
    progress: Callable[[str], None],
) -> None:
    server = start_pinned(repo, processes, log_dir, tree)
    try:
        while len(frontend_children(server.pid)) < processes - 1:
            time.sleep(0.1)
        owner = server.pid
        wanted = (
            (lambda pid, owner=owner: pid == owner)
            if processes == 1
            else (lambda pid, owner=owner: pid != owner and pid > 0)
        )
        for protocol in protocols:
            r = measure(server, protocol, connections, seconds, wanted)
            key = f"{protocol} N={processes}"
            name = f"{label} {key}" if label else key
            progress(
                f"  round {round_no + 1} {name}: {r['infer_per_sec']:,.0f} req/s, owner "
                f"{r['owner_us']:.0f} µs/req, frontend process {r['frontend_us']:.0f} µs/req, "
                f"batch {r['batch']:.1f}"
            )
            for name, value in r.items():
                result.figures.setdefault(f"{key} {name}", []).append(value)
    finally:
        server.stop()


def report(costs: HandoverCosts) -> list[str]:
    """The RESULTS.md section: measured costs and the throughput they allow against cores."""
    lines = [
        "## Frontend processes: CPU per request and the ceiling it sets",
        "",
        f"`{costs.model}` (dynamic batching), {costs.connections} closed-loop connections "
        f"from bench/handover_cost.py, {costs.rounds} round(s), medians. f: the server's "
        "CPU per request with one process; with `--frontend-processes 2` and every "
        "connection on the frontend process, h: the model owner's CPU per handed-over "
        "request, g: the frontend process's.",
        "",
        "| protocol | f µs | h µs | g µs | req/s N=1 | req/s N=2 (2 cores, shared with the "
        "client) |",
        "|---|---|---|---|---|---|",
    ]
    protocols = sorted({key.split()[0] for key in costs.figures})
    for protocol in protocols:
        f, h, g = costs.costs(protocol)
        lines.append(
            f"| {protocol} | {f:.0f} | {h:.0f} | {g:.0f} | "
            f"{costs.median(protocol, 1, 'infer_per_sec'):,.0f} | "
            f"{costs.median(protocol, 2, 'infer_per_sec'):,.0f} |"
        )
    counts = (1, 2, 4, 8, 16, 32, 64)
    lines += [
        "",
        "Requests/s the server's CPU allows with N accepting processes on N free cores "
        "(a calculation from f, h and g, not a measurement; bench/FINDINGS.md 9.9):",
        "",
        "| protocol | " + " | ".join(f"N={n}" for n in counts) + " |",
        "|---|" + "---|" * len(counts),
    ]
    for protocol in protocols:
        f, h, g = costs.costs(protocol)
        lines.append(
            f"| {protocol} | " + " | ".join(f"{ceiling(f, h, g, n):,.0f}" for n in counts) + " |"
        )
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--protocol", choices=["http", "grpc"], action="append")
    parser.add_argument("--model", choices=["simple", "simple_batching"], default="simple_batching")
    parser.add_argument("--processes", type=int, choices=[1, 2], action="append")
    parser.add_argument("--delay-us", type=int, help="simple_batching's max queue delay (500)")
    parser.add_argument(
        "--tree", action="append", default=[], help="LABEL=PATH of a source tree (A/B: twice)"
    )
    args = parser.parse_args(argv)
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree]
    results = run_trees(
        args.rounds,
        args.seconds,
        args.model,
        args.connections,
        tuple(args.protocol or ["http", "grpc"]),
        print,
        tuple(args.processes or [1, 2]),
        trees or [("", ROOT)],
        args.delay_us,
    )
    for label, costs in results.items():
        if label:
            print(f"\n### {label}")
        print("\n".join(report(costs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
